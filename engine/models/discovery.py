"""Models already on this machine: the Hugging Face cache, LM Studio's and Ollama's model folders, user folders.

Each becomes a catalogue ``Entry`` built from its config alone: a Hub snapshot's ``config.json``, or a GGUF
file's header (``gguf_header``: no tensor data is touched). Nothing found here is
loaded; the picker plans it like a curated entry.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

from .catalogue import Entry
from ..errors import GGUFHeaderError
from .gguf_header import read_header
from ..planning.shape import ModelShape

logger = logging.getLogger(__name__)

#: GGUF ``general.architecture`` -> transformers ``model_type``
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
                      "gemma3": "gemma3_text", "phi3": "phi3", "qwen3moe": "qwen3_moe", "glm4": "glm4"}
#: layers per global layer of the Gemma families, which GGUF headers do not state
_SLIDING_EVERY = {"gemma2": 2, "gemma3": 6}


def default_folders() -> dict[str, list[Path]]:
    """Where LM Studio and Ollama keep models, on Linux, macOS and Windows (``OLLAMA_MODELS`` wins over Ollama's
    defaults: the user's ``~/.ollama/models`` and the Linux service's ``/usr/share/ollama/.ollama/models``)."""
    home = Path.home()
    ollama = [Path(os.environ["OLLAMA_MODELS"]).expanduser()] if os.environ.get("OLLAMA_MODELS") else [
        home / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]
    return {"LM Studio": [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"], "Ollama": ollama}


def discover(user_folders: Iterable[str | Path] = (), *, hf_cache: Path | None = None,
             folders: dict[str, list[Path]] | None = None) -> list[Entry]:
    """Every model found: Hub cache snapshots, LM Studio / Ollama GGUFs, and models in ``user_folders``.
    An unreadable or missing folder or file is logged and skipped, never fatal."""
    found: list[Entry] = []
    found += _hub_cache(hf_cache)
    for app, places in (folders if folders is not None else default_folders()).items():
        for place in places:
            found += _ollama(place) if app == "Ollama" else _lm_studio(place)
    for folder in user_folders:
        found += _user_folder(Path(folder).expanduser())
    return found


def _hub_cache(cache: Path | None) -> list[Entry]:
    try:
        from huggingface_hub import scan_cache_dir  # start-up time: only the picker scans the Hub cache

        info = scan_cache_dir(cache)
    except Exception as error:  # no cache yet, or an unreadable one
        logger.debug("no Hugging Face cache: %s", error)
        return []
    entries = []
    for repo in info.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        snapshot = Path(max(repo.revisions, key=lambda r: r.last_modified).snapshot_path)
        entry = config_entry(snapshot, repo.repo_id, "Hugging Face cache")
        if entry is not None:
            entries.append(entry)
        else:  # a GGUF repository (one file per quantization), as llama.cpp and LM Studio users fetch them
            entries += [e for path, name in _gguf_files(snapshot)
                        if (e := gguf_entry(path, f"{repo.repo_id}/{name}", "Hugging Face cache"))]
    return entries


def _user_folder(folder: Path) -> list[Entry]:
    if _is_file(folder / "config.json"):
        entry = config_entry(folder, folder.name, "folder")
        return [entry] if entry else []
    if _is_file(folder) and folder.suffix == ".gguf":
        return [e for e in [gguf_entry(folder, folder.stem, "folder")] if e]
    subfolders = sorted(Path(root) for root, _, files in _walk(folder, depth=1) if "config.json" in files)
    entries = [e for sub in subfolders if sub != folder and (e := config_entry(sub, sub.name, "folder"))]
    return entries + [e for path, name in _gguf_files(folder) if (e := gguf_entry(path, name, "folder"))]


def _lm_studio(models: Path) -> list[Entry]:
    """LM Studio's ``models/<publisher>/<model>/<file>.gguf``, named ``publisher/model`` as its "My Models" lists them
    (with the file's name where one folder holds several quantizations)."""
    return [e for path, name in _gguf_files(models) if (e := gguf_entry(path, name, "LM Studio"))]


def _gguf_files(folder: Path) -> list[tuple[Path, str]]:
    """The ``.gguf`` models under ``folder`` with their names: a split model once (its first part), no vision
    projectors, nothing hidden (a download in progress keeps another suffix, or a hidden name)."""
    files: list[Path] = []
    for root, _, names in _walk(folder, depth=3):
        files += [Path(root) / n for n in names if n.lower().endswith(".gguf") and not n.startswith(".")
                  and not n.lower().startswith("mmproj") and _split_part(n) in (None, 1)]
    per_folder = Counter(p.parent for p in files)
    named = []
    for path in sorted(files):
        try:
            relative = path.parent.relative_to(folder)
        except ValueError:
            relative = Path()
        base = "/".join(relative.parts) if relative.parts else ""
        stem = _SPLIT.sub("", path.stem)
        alone = len(relative.parts) >= 2 and per_folder[path.parent] == 1  # <publisher>/<model>/ holds only it
        name = base if alone else (f"{base}/{stem}" if base else stem)
        named.append((path, name))
    return named


_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})$")


def _split_part(name: str) -> int | None:
    match = _SPLIT.search(name[: -len(".gguf")])
    return int(match.group(1)) if match else None


def _ollama(models: Path) -> list[Entry]:
    """Ollama's content-addressed store: ``manifests/<host>/<namespace>/<model>/<tag>`` JSON manifests whose
    ``application/vnd.ollama.image.model`` layer names a GGUF blob ``blobs/sha256-<digest>``. Named as ``ollama list``
    shows them (``llama3.1:8b``; ``user/model:tag`` outside the library; the host too outside Ollama's registry). Its
    other layers (license, template, params, system, projector) are not models; a blob still downloading is
    ``sha256-<digest>-partial`` and has no manifest yet; a blob whose size is not the manifest's, and a model with a
    LoRA adapter layer (served without it, it would not be the model the user made), are skipped."""
    manifests = models / "manifests"
    entries = []
    for root, _, names in _walk(manifests, depth=4):
        for tag in sorted(names):
            manifest = Path(root) / tag
            parts = manifest.relative_to(manifests).parts
            if len(parts) != 4:  # <host>/<namespace>/<model>/<tag>
                continue
            host, namespace, model = parts[:3]
            prefix = "" if host == OLLAMA_REGISTRY else f"{host}/"
            prefix += "" if namespace == "library" and not prefix else f"{namespace}/"
            if (entry := _ollama_model(models, manifest, f"{prefix}{model}:{tag}")) is not None:
                entries.append(entry)
    return entries


OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_ADAPTER_LAYER = "application/vnd.ollama.image.adapter"


def _ollama_model(models: Path, manifest: Path, name: str) -> Entry | None:
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        layer = next(x for x in layers if x.get("mediaType") == OLLAMA_MODEL_LAYER)
        blob = models / "blobs" / str(layer["digest"]).replace(":", "-")
        size = blob.stat().st_size
    except StopIteration:  # e.g. a model imported from safetensors, stored as tensor layers
        logger.info("skipping Ollama's %s: its manifest names no GGUF model layer", name)
        return None
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as error:
        logger.info("skipping Ollama's %s (%s): %s", name, manifest, error)
        return None
    if any(x.get("mediaType") == OLLAMA_ADAPTER_LAYER for x in layers):
        logger.info("skipping Ollama's %s: it applies a LoRA adapter, which the engine would leave out", name)
        return None
    if layer.get("size") not in (None, size):
        logger.info("skipping Ollama's %s: its blob has %d bytes, its manifest says %s", name, size, layer["size"])
        return None
    return gguf_entry(blob, name, "Ollama")


def _walk(folder: Path, depth: int):
    """``os.walk`` to ``depth`` levels below ``folder``, following links; unreadable folders are logged, not raised."""
    base = len(folder.parts)
    for root, dirs, files in os.walk(folder, followlinks=True, onerror=_unreadable):
        if len(Path(root).parts) - base >= depth:
            dirs.clear()
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        yield root, dirs, files


def _unreadable(error: OSError) -> None:
    if not isinstance(error, FileNotFoundError):
        logger.info("cannot read %s: %s", error.filename, error.strerror or error)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a folder that cannot be entered
        return False


def config_entry(folder: Path, name: str, source: str) -> Entry | None:
    """An entry from a folder's ``config.json`` (the text model's part for multimodal ones)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config") or config
    if "num_hidden_layers" not in text:
        return None
    text = {"model_type": text.get("model_type", config.get("model_type")), **text}
    try:
        weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    except OSError:  # a broken link to a weights file
        weights = 0
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    params = weights // (4 if "32" in dtype else 2) if weights else _estimated_params(text)
    return Entry(name, text["model_type"] or "?", text, int(params), round(weights / 1e9, 2) if weights else None,
                 "see the model card", source=source, location=str(folder))


def gguf_entry(path: Path, name: str, source: str) -> Entry | None:
    """An entry from a GGUF header (``gguf_header``: no tensor data is read): the architecture's keys as config
    fields, parameters from the tensor table. A file missing bytes its table names (a download cut short), a split
    model missing a part, and a vision projector are skipped. Each file is read once per process, while its size and
    modification time stay the same."""
    parts = _split_parts(path)
    try:
        stats = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in parts)
    except OSError as error:
        logger.info("skipping %s: %s", path, error)
        return None
    return _gguf_entry(stats, name, source)


def _split_parts(path: Path) -> list[Path]:
    """``model-00001-of-00003.gguf`` and its sibling parts; any other file alone."""
    match = _SPLIT.search(path.stem)
    if match is None:
        return [path]
    count = int(match.group(2))
    return [path.with_name(_SPLIT.sub(f"-{i:05d}-of-{count:05d}", path.stem) + path.suffix) for i in range(1, count + 1)]


@lru_cache(maxsize=256)
def _gguf_entry(parts: tuple[tuple[str, int, int], ...], name: str, source: str) -> Entry | None:
    path = parts[0][0]
    try:
        headers = [read_header(part) for part, _, _ in parts]
    except (OSError, GGUFHeaderError) as error:  # unreadable, not a GGUF, a header cut short
        logger.info("skipping %s: %s", path, error)
        return None
    if not all(h.is_complete for h in headers):
        logger.info("skipping %s: the file is shorter than its tensor table says (a download in progress?)", path)
        return None
    fields = headers[0].fields
    arch = str(fields.get("general.architecture", ""))
    if arch == "clip":  # a vision projector (LM Studio keeps it beside the model)
        return None
    key = lambda k: fields.get(f"{arch}.{k}")  # noqa: E731
    try:
        heads = _first(key("attention.head_count"))
        hidden = int(key("embedding_length"))
        kv_heads = _first(key("attention.head_count_kv")) or heads
        config = {"model_type": GGUF_ARCHITECTURES.get(arch, arch), "num_hidden_layers": int(key("block_count")),
                  "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                  "head_dim": int(key("attention.key_length") or hidden // heads), "hidden_size": hidden,
                  "intermediate_size": _first(key("feed_forward_length")),
                  "max_position_embeddings": int(key("context_length")),
                  "vocab_size": int(fields.get("tokenizer.ggml.tokens") or key("vocab_size"))}
    except (TypeError, ValueError, ZeroDivisionError) as error:  # an architecture without these keys
        logger.info("skipping %s (%s): its header lacks the attention keys (%s)", path, arch or "no architecture",
                    error)
        return None
    window = key("attention.sliding_window")
    if window and arch in _SLIDING_EVERY:
        config.update(sliding_window=int(window), sliding_every=_SLIDING_EVERY[arch])
    size = sum(bytes_ for _, bytes_, _ in parts)
    return Entry(name, arch, config, sum(h.num_params for h in headers), round(size / 1e9, 2),
                 str(fields.get("general.license") or "see the model card"), source=source, location=path)


def _first(value) -> int:
    """A per-layer list's largest value (some GGUFs list head counts per layer), or the number itself."""
    return int(max(value)) if isinstance(value, list) else int(value)


def _estimated_params(config: dict) -> int:
    try:
        return ModelShape.from_config(SimpleNamespace(**config)).num_params
    except (AttributeError, TypeError, ValueError):
        return 0
