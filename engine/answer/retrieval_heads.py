"""Finding a model's retrieval-like heads once, by a needle calibration, for attention-grounded sources.

A few heads in every long-context model copy from the context: when the model writes a fact, they attend to
where the fact stands. Calibration hides a needle ("The secret passphrase is …") at several depths of a
haystack, teacher-forces the answer that repeats it, records every full-attention head's queries on the
answer's copy of the needle and measures the share of each head's attention that lands on the needle in the
haystack. The heads with the largest mean share are kept (and cached on disk per model fingerprint).

Once per model, and never in a read's way: on the CPU the calibration (three prefills of ~1,000 tokens: two minutes
for a 1.5B model on two cores) runs in a child process at the lowest CPU priority (nice 19) that loads the same
model (``loader.loaded_as``: mapped weights, shared pages), so a plan, a read or an answer started meanwhile gets
the cores; the calling thread (the start's warm-up, or a first answer) waits for the child and reads its result
from the disk cache. A GPU calibrates in-process in seconds, as does a model ``load_model`` did not return.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import torch

from ..cache import HeadInferCache, cache_argument
from ..kv.probe import QueryProbe
from ..prompt import PromptBuilder
from ..models.weights_mode import loaded_as
from ..store.fingerprint import model_fingerprint
from .sources import attention_mass

logger = logging.getLogger(__name__)

_FILLER = [
    "The harbour town woke slowly, and the fishing boats came back with the tide.",
    "Bread prices rose twice that winter, which the council discussed at length.",
    "A narrow road climbs from the valley to the old observatory on the ridge.",
    "Most of the letters in the archive were written in pencil and are hard to read.",
    "The committee postponed its decision about the bridge until the spring.",
    "Children in the village learned to swim in the cold lake behind the mill.",
    "The library kept its maps in long drawers that smelled of cedar and dust.",
    "Every autumn the orchard workers sorted apples by size and by colour.",
    "The railway reached the plateau late, long after the mines had closed.",
    "Her notebook listed birds seen on the marsh, with the weather for each day.",
    "The bakery on the corner opened before dawn and closed at noon.",
    "Storms in March washed away part of the coastal path near the lighthouse.",
    "The museum's small collection of clocks was wound by hand every Sunday.",
    "Farmers traded seeds at the market, arguing about which beans grew best.",
    "A translation of the old charter was finally printed by the university press.",
]
_WORDS = ["amber", "cobalt", "falcon", "juniper", "marble", "nectar", "orchid", "quartz", "saffron", "tundra"]


def haystack(num_sentences: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(_FILLER) for _ in range(num_sentences)]


_LOCK = threading.Lock()  # one calibration at a time (a background warm-up and a first question may race)
_FOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {num_heads: heads}


def find_retrieval_heads(model, tokenizer, *, num_heads: int = 8, num_sentences: int = 60,
                         depths: tuple[float, ...] = (0.2, 0.5, 0.8), cache_dir: Path | None = None) -> dict:
    """{layer index: [query head, ...]} of the ``num_heads`` best copying heads; cached per model on disk."""
    with _LOCK:
        found = _FOUND.setdefault(model, {})
        if num_heads not in found:
            found[num_heads] = _find(model, tokenizer, num_heads, num_sentences, depths, cache_dir)
        return found[num_heads]


def _find(model, tokenizer, num_heads: int, num_sentences: int, depths: tuple[float, ...],
          cache_dir: Path | None) -> dict:
    path = None
    if cache_dir is not None:
        path = cached_heads_path(model, num_heads, cache_dir)
        if (heads := _read_cached(path)) is not None:
            return heads
        arguments = loaded_as(model)
        if next(model.parameters()).device.type == "cpu" and arguments is not None:
            if _calibrate_in_child(arguments, num_heads, num_sentences, depths, cache_dir, path) and \
                    (heads := _read_cached(path)) is not None:
                return heads
            logger.warning("the background calibration gave no retrieval heads; calibrating in this process")
    started = time.perf_counter()
    scores = None
    for i, depth in enumerate(depths):
        placement = _needle_scores(model, tokenizer, num_sentences, depth, seed=i)
        scores = placement if scores is None else scores + placement
    shape = HeadInferCache(model.config, device=next(model.parameters()).device).shape
    ranked = sorted(((float(scores[layer, head]), layer, head) for layer in range(shape.num_layers)
                     for head in range(shape.num_heads) if shape.sliding_windows[layer] is None), reverse=True)
    heads: dict[int, list[int]] = {}
    for _, layer, head in ranked[:num_heads]:
        heads.setdefault(layer, []).append(head)
    logger.info("retrieval heads found in %.1f s: %s (mean needle share %.2f)", time.perf_counter() - started,
                heads, sum(s for s, _, _ in ranked[:num_heads]) / max(1, num_heads) / len(depths))
    if path is not None:
        _write_cached(path, heads, num_sentences, depths)
    return heads


def cached_heads_path(model, num_heads: int, cache_dir: Path) -> Path:
    """Where ``model``'s heads are kept: by its weights' fingerprint, which a load of the same files gives again."""
    return Path(cache_dir) / f"retrieval-heads-{model_fingerprint(model).weights[:16]}-{num_heads}.json"


def _read_cached(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return {int(k): v for k, v in json.loads(path.read_text())["heads"].items()}
    except (ValueError, KeyError, OSError):
        logger.warning("ignoring an unreadable retrieval-head cache %s", path)
        return None


def _calibrate_in_child(arguments: dict, num_heads: int, num_sentences: int, depths: tuple[float, ...],
                        cache_dir: Path, path: Path) -> bool:
    """Runs the calibration of the model ``load_model(**arguments)`` gives in a child process at nice 19, which
    writes ``path``; True when it exited cleanly. The child stops when this process ends."""
    name = arguments.get("source") or "the embedded model"
    logger.info("Finding the retrieval heads of %s for attention-grounded sources: a one-time calibration (three "
                "needle prefills) in a background process at the lowest CPU priority, so reads and plans go first; "
                "kept in %s", name, path)
    arguments = {**arguments, "attn_implementation": "headinfer"}  # the probe records queries through it
    request = {"arguments": arguments, "num_heads": num_heads, "num_sentences": num_sentences,
               "depths": list(depths), "cache_dir": str(cache_dir), "parent": os.getpid()}
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "engine.answer.calibration_process", json.dumps(request)],
                             preexec_fn=_in_background if hasattr(os, "nice") else None,
                             creationflags=getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0))  # (Windows: no Ctrl+C)
    status = child.wait()
    logger.info("retrieval heads of %s: background calibration %s after %.0f s", name,
                "done" if status == 0 else f"failed (exit status {status})", time.perf_counter() - started)
    return status == 0


def _in_background() -> None:
    os.nice(19)  # in the child, before it runs: its torch threads inherit it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a console's Ctrl+C reaches us too: we end with the parent


def _write_cached(path: Path, heads: dict, num_sentences: int, depths: tuple[float, ...]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")  # a reader never sees half a file
    partial.write_text(json.dumps({"heads": heads, "depths": depths, "num_sentences": num_sentences}))
    os.replace(partial, path)


@torch.inference_mode()
def _needle_scores(model, tokenizer, num_sentences: int, depth: float, seed: int) -> torch.Tensor:
    """[layers, heads] share of each head's attention on the needle while the answer repeats it."""
    rng = random.Random(1000 + seed)
    value = f"{rng.choice(_WORDS)}-{rng.choice(_WORDS)}-{rng.randrange(100, 999)}"
    needle = f"The secret passphrase is {value}."
    sentences = haystack(num_sentences, seed)
    sentences.insert(int(depth * len(sentences)), needle)
    document = " ".join(sentences)
    prompts = PromptBuilder(tokenizer)
    prefix_text = prompts.document_text(document)
    doc_ids = prompts.document_ids(document)
    question_ids = prompts.conversation_ids(document, [], "What is the secret passphrase?")
    lead_ids = tokenizer("The secret passphrase is", add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(f"The secret passphrase is {value}.", add_special_tokens=False)["input_ids"]
    ids = doc_ids + question_ids + answer_ids
    # The needle's tokens in the document: from the character span of its value.
    encoded = tokenizer(prefix_text, add_special_tokens=False, return_offsets_mapping=True)
    char_start = prefix_text.index(needle) + len("The secret passphrase is ")
    char_stop = char_start + len(value)
    span = [i for i, (a, b) in enumerate(encoded["offset_mapping"]) if a < char_stop and b > char_start]
    device = next(model.parameters()).device
    cache = HeadInferCache(model.config, device=device)
    shape = cache.shape
    # Keyed by KV-layer index, as the probe records: KV-sharing consumers keep no K/V and record nothing.
    all_heads = {k: list(range(shape.num_heads)) for k, layer in enumerate(cache.kv_layers) if layer.window is None}
    # Queries of the answer's copy of the value (after "The secret passphrase is"), one step before each token.
    first = len(doc_ids) + len(question_ids) + len(lead_ids) - 1
    probe = QueryProbe(all_heads, min_position=first)
    cache.record_queries(probe)  # it keeps positions >= first only
    chunk = cache.policy.chunk_size
    try:
        for start in range(0, len(ids) - 1, chunk):
            model(torch.tensor([ids[start : min(start + chunk, len(ids) - 1)]], device=device),
                  **{cache_argument(model): cache}, use_cache=True, logits_to_keep=1)
        per_head = attention_mass(cache, probe, per_head=True)  # [recorded heads, L]
    finally:
        cache.release()
    scores = torch.zeros(shape.num_layers, shape.num_heads, dtype=torch.float64)
    row = 0
    for layer in sorted(all_heads):
        for head in all_heads[layer]:
            scores[layer, head] = per_head[row, span].sum() / max(1, probe.num_positions)
            row += 1
    return scores
