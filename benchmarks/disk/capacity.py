"""Capacity on an ordinary PC: window rings, 8-bit KV and the disk tier (issue 11's measurements).

    python -m benchmarks.disk.capacity [--context 16K] [--steps 3] [--host-gib 32]

1. Host KV bytes per token at 128K per architecture (real model shapes, no weights): every token kept vs rings.
2. Largest context of Llama-3-8B on a 24 GiB GPU with ``--host-gib`` of RAM for KV: RAM alone, RAM + 8-bit,
   RAM + disk (the free space of ``--disk-dir``), with the predicted decode s/token of each (25 GB/s PCIe 4.0
   for RAM, the disk's sequential read measured here for the disk tier).
3. Disk tier vs RAM, measured on this machine: a Llama-3-8B-shaped KV (32 layers x 8 KV heads x 128, fp32: CPU bf16 kernels are slow) at
   ``--context`` tokens, decode steps with every home in RAM vs every home on disk (pages dropped from the page
   cache before each step, so the disk really is read); s/token ratio, and the tier's read GB/s against the
   disk's cold sequential read measured in the same run.
Writes docs/benchmarks/capacity.md and data/capacity.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import torch
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config

import engine
from engine.kv.disk import DiskMemory
from engine.planning.capacity import capacity_options
from engine.planning.host_split import DEFAULT_H2D_GBPS
from engine.planning.planner import stored_tokens
from engine.planning.shape import ModelShape
from engine.planning.policy import OffloadPolicy
from engine.store.fingerprint import model_fingerprint, token_ids_digest
from engine.store.format import SnapshotIdentity

from .disk_io import cached_fraction, read_gbps, write_probe
from ..harness.fill import fill_random
from ..harness.models import llama3_8b_config
from ..records import run_stamp
from ..harness.layout import data_file
from ..harness.run import parse_tokens

logger = logging.getLogger(__name__)
_GIB = 1 << 30


def architectures() -> dict:
    return {
        "Llama-3-8B": LlamaConfig(num_hidden_layers=32, num_key_value_heads=8, head_dim=128, num_attention_heads=32,
                                  hidden_size=4096),
        "Mistral-7B-v0.1 (window 4096)": MistralConfig(num_hidden_layers=32, num_key_value_heads=8, head_dim=128,
                                                       sliding_window=4096),
        "Qwen2.5-7B": Qwen2Config(num_hidden_layers=28, num_key_value_heads=4, hidden_size=3584,
                                  num_attention_heads=28, use_sliding_window=False),
        "Gemma-2-9B (1:1 window 4096)": Gemma2Config(num_hidden_layers=42, num_key_value_heads=8, head_dim=256,
                                                     sliding_window=4096),
        "Gemma-3-12B (5:1 window 1024)": Gemma3TextConfig(num_hidden_layers=48, num_key_value_heads=8, head_dim=256,
                                                          sliding_window=1024),
    }


def bytes_per_token(context: int = 131072, chunk: int = 4096) -> list[dict]:
    rows = []
    for name, config in architectures().items():
        shape = ModelShape.from_config(config, dtype_bytes=2, num_params=1)
        every = shape.kv_bytes_per_token
        rings = stored_tokens(shape, context, chunk) * shape.num_kv_heads * shape.head_dim * 2 * 2 / context
        rows.append({"model": name, "every_token": every, "rings": rings, "ratio": every / rings})
    return rows


def largest_contexts(host_gib: float, disk_dir: Path, disk_gbps: float) -> list[dict]:
    shape = ModelShape.from_config(llama3_8b_config(), dtype_bytes=2)
    options = capacity_options(shape, OffloadPolicy(), device_is_cuda=True, gpu_budget=24 * _GIB,
                               host_budget=int(host_gib * _GIB), disk_dir=str(disk_dir), link_gbps=DEFAULT_H2D_GBPS,
                               disk_gbps=disk_gbps)
    return [{"option": o.name, "max_context": o.max_context, "host_gib": o.host_bytes / _GIB,
             "disk_gib": o.disk_bytes / _GIB, "predicted_decode_s": o.decode_seconds} for o in options]


@torch.inference_mode()
def disk_vs_ram(context: int, steps: int, folder: Path) -> dict:
    config = LlamaConfig(hidden_size=256, intermediate_size=256, num_hidden_layers=32, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, vocab_size=256, max_position_embeddings=context + 64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="headinfer", dtype=torch.float32).eval()
    probe = folder / "probe.bin"
    write_probe(probe, min(2 * _GIB, context * 256 * 1024))
    disk_gbps = statistics.median(read_gbps([probe], cold=True)[0] for _ in range(2))
    probe.unlink()
    times = {}
    ram_plan = engine.HeadInferCache(model.config, device="cpu", max_context=context + 16, head_group_size=8,
                                     dtype=torch.float32).plan
    kv_bytes = (context + 16) * 32 * 8 * 128 * 2 * 4
    for mode in ("ram", "disk"):
        # The disk run's RAM budget holds the weights and activations only: every home goes to disk.
        extra = {"disk_dir": str(folder), "host_memory": ram_plan.host_bytes - kv_bytes + 1} if mode == "disk" else {}
        cache = engine.HeadInferCache(model.config, device="cpu", max_context=context + 16, head_group_size=8,
                                      dtype=torch.float32, **extra)

        fill_random(cache, context, head_dim=128, num_kv_heads=8, device=torch.device("cpu"), dtype=torch.float32)
        tier = next(folder.glob("kv-*"), None)
        runs, cached = [], []
        for step in range(steps + 1):
            if tier is not None:
                cache.synchronize()  # the next step's first slot, prefetched across the forwards, has landed
                cache.disk_tier.drop_cache()  # written back and evicted: the step reads the disk
                cached.append(max(cached_fraction(path) for path in tier.iterdir()))
            started = time.perf_counter()
            model(torch.tensor([[step % 256]]), past_key_values=cache)
            if step:  # the first step warms kernels and buffers
                runs.append(time.perf_counter() - started)
        kv = cache.kv_bytes()
        times[mode] = {"s_per_token": statistics.median(runs), "kv": kv, "cached": max(cached, default=0.0)}
        cache.release()
    disk_bytes = times["disk"]["kv"]["disk"]
    tier_gbps = disk_bytes / times["disk"]["s_per_token"] / 1e9
    return {"context": context, "kv_gib": disk_bytes / _GIB, "ram_s_per_token": times["ram"]["s_per_token"],
            "disk_s_per_token": times["disk"]["s_per_token"],
            "ratio": times["disk"]["s_per_token"] / times["ram"]["s_per_token"],
            "tier_read_gbps": tier_gbps, "disk_cold_read_gbps": disk_gbps, "of_disk_read": tier_gbps / disk_gbps,
            "cached_before_steps": times["disk"]["cached"]}


def save_linked_vs_copied(context: int, folder: Path) -> dict:
    """Saving a document read through the disk tier: its homes linked into the snapshot vs copied.

    Every home is on disk, its running checksum built chunk by chunk as a prefill builds it, and the page cache
    is dropped before each save (a book that needed the disk tier is not in RAM). Disk usage is measured with
    ``statvfs`` around each save; each snapshot is then restored into a RAM-only cache."""

    config = LlamaConfig(hidden_size=256, intermediate_size=256, num_hidden_layers=32, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, vocab_size=256, max_position_embeddings=context + 64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="headinfer", dtype=torch.float32).eval()
    common = dict(device="cpu", max_context=context, head_group_size=8, dtype=torch.float32)
    ram_plan = engine.HeadInferCache(model.config, **common).plan
    kv_bytes = context * 32 * 8 * 128 * 2 * 4
    cache = engine.HeadInferCache(model.config, **common, disk_dir=str(folder / "tier"),
                                  host_memory=ram_plan.host_bytes - kv_bytes + 1)
    fill_random(cache, context, head_dim=128, num_kv_heads=8, device=torch.device("cpu"), dtype=torch.float32)
    for layer in cache.layers:  # the running checksums, chunk by chunk, as a prefill's appends extend them
        for home in layer.homes:
            for plane in home.planes if home.disk is not None else ():
                for start in range(0, context, 4096):
                    home.disk.note_written(plane[start : min(start + 4096, context)])
    ids = [i % 256 for i in range(context)]
    identity = SnapshotIdentity(model_fingerprint(model), "float32", "benchmark", token_ids_digest(ids), context)
    result = {"context": context, "kv_gib": cache.kv_bytes()["disk"] / _GIB}
    for mode in ("linked", "copied"):
        store = engine.SnapshotStore(folder / f"saved-{mode}")
        cache.disk_tier.drop_cache()
        used = shutil.disk_usage(folder).used
        started = time.perf_counter()
        with mock.patch.object(DiskMemory, "link", return_value=False) if mode == "copied" else nullcontext():
            info = store.save(cache, ids, identity)
        seconds = time.perf_counter() - started
        grown = shutil.disk_usage(folder).used - used
        ram = engine.HeadInferCache(model.config, **common)
        stats = store.restore(ram, identity)
        ram.release()
        result[mode] = {"save_s": seconds, "disk_grew_gib": grown / _GIB, "snapshot_gib": info.num_bytes / _GIB,
                        "restore_s": stats.seconds, "restore_gbps": stats.gb_per_second}
        store.delete(info.key)
    cache.release()
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.disk.capacity")
    p.add_argument("--context", default="16K")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--host-gib", type=float, default=32.0)
    p.add_argument("--disk-dir", default=None, help="folder for the disk tier (default: a temp folder on /work)")
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--parts", default="disk,save", help="what to measure: disk (tier vs RAM), save (linked vs "
                   "copied); the others are computed; parts left out keep their last recorded result")
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    folder = Path(args.disk_dir or tempfile.mkdtemp(prefix="kv-bench-", dir="/work" if Path("/work").exists() else None))
    folder.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = data_file(out, "capacity.json")
    previous = json.loads(records.read_text()) if records.exists() else {}
    context = parse_tokens(args.context)[0]
    try:
        measured = disk_vs_ram(context, args.steps, folder) if "disk" in parts else previous["disk_vs_ram"]
        saving = save_linked_vs_copied(context, folder) if "save" in parts else previous.get("save")
        rows = bytes_per_token()
        capacity = largest_contexts(args.host_gib, folder, measured["disk_cold_read_gbps"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result = {"run": run_stamp("cpu"), "bytes_per_token": rows, "largest": capacity, "disk_vs_ram": measured,
              "save": saving}
    records.write_text(json.dumps(result, indent=1, default=str))
    text = report(result, args.host_gib)
    (out / "capacity.md").write_text(text)
    print(text)
    return 0


def report(result: dict, host_gib: float) -> str:
    run = result["run"]
    lines = ["# Capacity: window rings, 8-bit KV, disk tier", "",
             f"{run.get('cpu', '')} · {run.get('date', '')} · torch {run.get('torch', '')}", "",
             "## Host KV per token at 128K (bf16), every token kept vs window rings", "",
             "| model | every token (KiB) | rings (KiB) | less |", "|---|---:|---:|---:|"]
    for r in result["bytes_per_token"]:
        lines.append(f"| {r['model']} | {r['every_token'] / 1024:.0f} | {r['rings'] / 1024:.1f} | {r['ratio']:.1f}x |")
    lines += ["", f"## Largest context, Llama-3-8B, 24 GiB GPU, {host_gib:.0f} GiB RAM for KV", "",
              "| option | max context | RAM GiB | disk GiB | predicted decode s/token |", "|---|---:|---:|---:|---:|"]
    for r in result["largest"]:
        lines.append(f"| {r['option']} | {r['max_context']:,} | {r['host_gib']:.1f} | {r['disk_gib']:.1f} | "
                     f"{r['predicted_decode_s']:.2f} |")
    m = result["disk_vs_ram"]
    lines += ["", "## Disk tier vs RAM on this machine (CPU decode, Llama-3-8B-shaped KV in fp32)", "",
              f"{m['context']:,} tokens ({m['kv_gib']:.2f} GiB of KV), page cache dropped before every step "
              f"(at most {m['cached_before_steps']:.0%} of a file still cached, by mincore):", "",
              f"- decode: RAM {m['ram_s_per_token']:.3f} s/token, disk tier {m['disk_s_per_token']:.3f} s/token "
              f"({m['ratio']:.1f}x)",
              f"- the tier reads {m['tier_read_gbps']:.2f} GB/s = {m['of_disk_read']:.0%} of the disk's cold "
              f"sequential read ({m['disk_cold_read_gbps']:.2f} GB/s, same run)", ""]
    saving = result.get("save")
    if saving:
        lines += ["## Saving a document read through the disk tier (snapshot format v3)", "",
                  f"{saving['context']:,} tokens, {saving['kv_gib']:.2f} GiB of KV, every home on disk, page cache "
                  "dropped before each save; disk usage measured around the save:", "",
                  "| homes | save s | disk grew GiB | snapshot GiB | restore into RAM s | restore GB/s |",
                  "|---|---:|---:|---:|---:|---:|"]
        for mode in ("linked", "copied"):
            r = saving[mode]
            lines.append(f"| {mode} | {r['save_s']:.2f} | {r['disk_grew_gib']:.2f} | {r['snapshot_gib']:.2f} | "
                         f"{r['restore_s']:.2f} | {r['restore_gbps']:.2f} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
