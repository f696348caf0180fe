"""What checkpointing a long read costs (issue 32): a ~30K-token read with and without checkpoints, interleaved.

    .venv/bin/python -m benchmarks.disk.checkpoint_cost            # ~10-15 minutes on a shared 2-core CPU machine

A random tiny-but-wide Llama (4 layers (``--layers``), 8 KV heads x 64, fp32: 4 KiB of K/V per token and layer) reads
the same ~30K random tokens in three modes, one after the other in each round: no checkpoints; the app's
checkpoints (every 16 chunks or 2 minutes); a checkpoint after every chunk (the worst case). Per read: the wall
seconds, the checkpoints written, and the longest time the reader's thread spent inside ``checkpoint()`` (the
part that holds the read up; the files are written on a background thread). Writes
``docs/benchmarks/checkpoint.md`` and ``data/checkpoint.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from transformers import LlamaConfig

from engine import DocumentSession, OffloadPolicy, SnapshotStore
from engine.store import checkpoint as checkpoint_module
from engine.types import CheckpointPlan

from ..harness.models import build_random
from ..harness.layout import data_file

WIDE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
            head_dim=64, vocab_size=512, max_position_embeddings=1 << 16, tie_word_embeddings=False)
MODES = {"off": None, "app default (16 chunks / 2 min)": 16, "every chunk": 1}
OUT = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def _tokens(vocab: int):
    """A word-level tokenizer: ``w<i>`` -> id i (the random model has no real vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0", eos_token="w1")


def _read(model, tokenizer, ids: list[int], folder: Path, every_chunks: int | None) -> dict:
    held = []
    original = checkpoint_module.ReadCheckpoints.checkpoint

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            held.append(time.perf_counter() - started)

    checkpoint_module.ReadCheckpoints.checkpoint = timed  # this benchmark's process only, restored below
    store = SnapshotStore(folder / "kv")
    try:
        session = DocumentSession(model, tokenizer, OffloadPolicy(), answer_budget=64)
        session.set_document(" ".join(f"w{i}" for i in ids))
        plan = CheckpointPlan(store, every_chunks=every_chunks) if every_chunks else None
        started = time.perf_counter()
        session.prefill(checkpoints=plan)
        seconds = time.perf_counter() - started
        infos = store.list()
        result = {"seconds": seconds, "tokens": session.document_tokens, "checkpoint_calls": len(held),
                  "longest_hold_seconds": max(held, default=0.0), "total_hold_seconds": sum(held),
                  "on_disk_bytes": sum(i.num_bytes for i in infos),
                  "checkpointed_tokens": max((i.num_read or 0 for i in infos), default=0)}
        session.clear()
        return result
    finally:
        checkpoint_module.ReadCheckpoints.checkpoint = original
        shutil.rmtree(store.root, ignore_errors=True)


def markdown(result: dict) -> str:
    lines = ["# Checkpointing a long read: what it costs", "",
             f"{result['tokens']:,}-token read of a random tiny-but-wide Llama ({result['layers']} layers x 8 KV heads x 64, fp32: "
             f"{result['kv_bytes_per_token'] // 1024} KiB of K/V per token) on {result['machine']['cpu']} "
             f"({result['machine']['cores']} cores, shared with other work: seconds are indicative), "
             f"{result['rounds']} interleaved rounds, `python -m benchmarks.disk.checkpoint_cost`. "
             "Hold = time the reader's thread spent inside `checkpoint()` (the rest is written on a background thread).",
             "", "| mode | read seconds (median) | vs off | checkpoint calls | longest hold | total hold | partial read on disk |",
             "|---|---|---|---|---|---|---|"]
    off = statistics.median(r["seconds"] for r in result["runs"].get("off", [{"seconds": float("nan")}]))
    for mode, runs in result["runs"].items():
        median = statistics.median(r["seconds"] for r in runs)
        each = ", ".join(f"{r['seconds']:.1f}" for r in runs)
        lines.append(f"| {mode} | {median:.1f} ({each}) | "
                     f"{'–' if off != off else f'{100 * (median - off) / off:+.1f}%'} | {max(r['checkpoint_calls'] for r in runs)} | "
                     f"{max(r['longest_hold_seconds'] for r in runs) * 1000:.0f} ms | "
                     f"{max(r['total_hold_seconds'] for r in runs):.2f} s | "
                     f"{max(r['on_disk_bytes'] for r in runs) / 1e6:.0f} MB at "
                     f"{max(r['checkpointed_tokens'] for r in runs):,} tokens |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layers", type=int, default=WIDE["num_hidden_layers"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--folder", type=Path, default=None, help="where the checkpoints go (default: a temp folder)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    WIDE["num_hidden_layers"] = args.layers
    model = build_random(LlamaConfig(**WIDE), device="cpu", dtype=torch.float32, attn_implementation="headinfer")
    tokenizer = _tokens(WIDE["vocab_size"])
    ids = torch.randint(2, WIDE["vocab_size"], (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    folder = Path(tempfile.mkdtemp(prefix="checkpoint-bench-", dir=args.folder))
    runs: dict[str, list] = {mode: [] for mode in args.modes}
    try:
        for round_ in range(args.rounds):
            for mode in args.modes:
                runs[mode].append(_read(model, tokenizer, ids, folder, MODES[mode]))
                print(f"round {round_ + 1} {mode}: {runs[mode][-1]}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    result = {"tokens": next(iter(runs.values()))[0]["tokens"], "rounds": args.rounds, "runs": runs, "layers": args.layers,
              "kv_bytes_per_token": WIDE["num_hidden_layers"] * 2 * WIDE["num_key_value_heads"] * WIDE["head_dim"] * 4,
              "machine": {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
                          "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          "load_average_at_start": os.getloadavg()}}
    args.out.mkdir(parents=True, exist_ok=True)
    data_file(args.out, "checkpoint.json").write_text(json.dumps(result, indent=1))
    (args.out / "checkpoint.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
