"""KV-cache snapshots (issue 4): save and restore GB/s next to this disk's own bandwidth, and restore vs prefill.

    .venv/bin/python -m benchmarks.snapshot_bench            # ~4 minutes on a 2-core CPU machine

Measured in one run, on the folder the snapshots go to (``engine.loader.cache_dir()`` unless ``--folder``):

1. the disk: a 2 GiB file written with fsync, dropped from the page cache (``posix_fadvise DONTNEED``,
   checked with ``mincore``) and read back cold; then read again warm;
2. a Llama-3-8B-shaped cache (32 layers x 8 KV heads x 128, bf16) of 16K tokens = 2 GiB of random K/V
   allocated directly on the CPU (no model): save, cold restore, warm restore, byte-for-byte check;
3. the embedded SmolLM2-135M at ~8K tokens: prefill seconds vs cold restore seconds, same greedy answer.

Targets (issue 4): cold restore >= 70% of the disk's cold read bandwidth; restore >= 10x faster than prefill.
Writes ``docs/benchmarks/snapshot-cpu.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import mmap
import os
import platform
import random
import shutil
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from engine import DocumentSession, HeadInferCache, OffloadPolicy, SnapshotStore
from engine.fingerprint import ModelFingerprint, token_ids_digest
from engine import snapshot_io
from engine.loader import cache_dir, load_model
from engine.snapshot_files import read_snapshot, write_snapshot
from engine.snapshot_format import SnapshotIdentity, read_header

_GIB = 1 << 30
_PIECE = 64 << 20
logger = logging.getLogger("snapshot_bench")


# -- page cache --------------------------------------------------------------------------------
def drop_from_page_cache(path: Path) -> float:
    """Asks the kernel to drop ``path``'s clean pages; returns the fraction still cached (mincore)."""
    with open(path, "rb") as file:
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return cached_fraction(path)


def cached_fraction(path: Path) -> float:
    """Fraction of ``path``'s pages in the page cache, from mincore(2) on a read-only mapping."""
    size = path.stat().st_size
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as file:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, file.fileno(), 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return float("nan")
        try:
            if libc.mincore(ctypes.c_void_p(address), size, vector) != 0:
                return float("nan")
        finally:
            libc.munmap(ctypes.c_void_p(address), size)
    return sum(b & 1 for b in bytes(vector)) / pages  # the low bit: resident; the others are reserved


def drop_folder(folder: Path) -> float:
    """Drops every file of ``folder`` from the page cache; returns the largest fraction still cached."""
    return max(drop_from_page_cache(path) for path in folder.iterdir() if path.is_file())


# -- 1. the disk -------------------------------------------------------------------------------
def write_probe(path: Path, num_bytes: int) -> dict:
    """Writes ``num_bytes`` of random data with fsync; returns the write bandwidth."""
    view = memoryview(torch.randint(0, 256, (_PIECE,), dtype=torch.uint8).numpy())
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as file:
        for _ in range(num_bytes // _PIECE):
            file.write(view)
        os.fsync(file.fileno())
    return {"bytes": num_bytes, "write_gbps": num_bytes / (time.perf_counter() - started) / 1e9}


def read_gbps(paths: list[Path], *, cold: bool) -> tuple[float, float]:
    """Sequential read bandwidth of ``paths`` (16 MiB reads into one buffer) and the fraction that was cached."""
    cached = max(drop_from_page_cache(p) for p in paths) if cold else 1.0
    buffer = memoryview(bytearray(16 << 20))
    started, total = time.perf_counter(), 0
    for path in paths:
        with open(path, "rb", buffering=0) as file:
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while read := file.readinto(buffer):
                total += read
    return total / (time.perf_counter() - started) / 1e9, cached


def checksum_gbps(num_bytes: int = 256 << 20) -> tuple[str, float]:
    """The CRC-32 the snapshots use (ISA-L's when installed, else zlib's) and its single-core rate."""
    data = memoryview(torch.randint(0, 256, (num_bytes,), dtype=torch.uint8).numpy())
    started = time.perf_counter()
    snapshot_io._crc32(data)
    return snapshot_io._crc32.__module__, num_bytes / (time.perf_counter() - started) / 1e9


# -- 2. a Llama-3-8B-shaped cache --------------------------------------------------------------
def llama3_8b_cache(num_tokens: int, fill: bool) -> HeadInferCache:
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072)
    policy = OffloadPolicy(max_context=num_tokens, host_memory=1 << 40, gpu_memory=1 << 40)
    cache = HeadInferCache(config, policy, device="cpu", dtype=torch.bfloat16)
    cache.allocate(1, 128, torch.bfloat16, torch.device("cpu"))
    if fill:
        generator = torch.Generator().manual_seed(0)
        for layer in cache.layers:
            for home in layer.store.homes:
                home.keys.normal_(generator=generator)
                home.values.normal_(generator=generator)
            layer.length = num_tokens
    return cache


def synthetic(folder: Path, num_tokens: int, probe: Path, rounds: int) -> dict:
    """Saves a random Llama-3-8B-shaped cache, then per round: the disk's cold read of the probe file and
    of the snapshot's own files, and a cold restore into freshly allocated homes (as after set_document)."""
    cache = llama3_8b_cache(num_tokens, fill=True)
    ids = [random.Random(0).randrange(128256) for _ in range(num_tokens)]
    model = ModelFingerprint("llama", "synthetic Llama-3-8B shape", "0" * 32, "0" * 32)
    identity = SnapshotIdentity(model, "bfloat16", "0" * 32, token_ids_digest(ids), num_tokens)
    target = folder / identity.key
    shutil.rmtree(target, ignore_errors=True)
    disk, files, restore, cached = [], [], [], []
    try:
        started = time.perf_counter()
        header = write_snapshot(target, cache, identity, ids, label="synthetic")
        save_seconds = time.perf_counter() - started
        snapshot_files = sorted(target.iterdir())
        for round_ in range(rounds):
            disk.append(read_gbps([probe], cold=True)[0])
            files.append(read_gbps(snapshot_files, cold=True)[0])
            cached.append(drop_folder(target))
            restored = llama3_8b_cache(num_tokens, fill=False)
            started = time.perf_counter()
            num_bytes = read_snapshot(target, read_header(target), restored)
            restore.append(num_bytes / (time.perf_counter() - started) / 1e9)
            logger.info("round %d: disk cold read %.2f GB/s, snapshot files %.2f GB/s, restore %.2f GB/s",
                        round_, disk[-1], files[-1], restore[-1])
            if round_ == 0:
                identical = all(torch.equal(_bytes(a, i, kind), _bytes(b, i, kind)) for a, b in zip(cache.layers, restored.layers)
                                for i in range(len(a.store.homes)) for kind in ("keys", "values"))
            del restored
        restored = llama3_8b_cache(num_tokens, fill=True)  # touched homes + a warm page cache: the CPU-side ceiling
        read_snapshot(target, read_header(target), restored)
        started = time.perf_counter()
        read_snapshot(target, read_header(target), restored)
        warm = num_bytes / (time.perf_counter() - started) / 1e9
    finally:
        shutil.rmtree(target, ignore_errors=True)
    return {"tokens": num_tokens, "bytes": header.num_bytes, "save_seconds": save_seconds,
            "save_gbps": header.num_bytes / save_seconds / 1e9, "rounds": rounds,
            "disk_read_cold_gbps": disk, "snapshot_files_read_cold_gbps": files, "restore_cold_gbps": restore,
            "cached_fraction_before_cold_restore": max(cached), "restore_warm_gbps": warm,
            "median_disk_read_cold_gbps": statistics.median(disk), "median_restore_cold_gbps": statistics.median(restore),
            "median_snapshot_files_read_cold_gbps": statistics.median(files), "identical": identical}


def _bytes(layer, index: int, kind: str) -> torch.Tensor:
    return getattr(layer.store.homes[index], kind).view(torch.uint8)


# -- 3. SmolLM2 --------------------------------------------------------------------------------
def document(tokenizer, num_tokens: int) -> str:
    """Seeded paragraphs of varied sentences with facts, about ``num_tokens`` tokens."""
    rng = random.Random(7)
    places = ["Port Alder", "Wrenfield", "Castlemoor", "Eastbrook", "Lowmarsh", "Hollins Bay"]
    people = ["Miriam Okafor", "Tomas Lindqvist", "Aiko Tanaka", "Rafael Duarte", "Ingrid Holm", "Lucia Ferri"]
    things = ["a stone bridge", "a clock tower", "a public library", "a lighthouse", "a grain mill", "a music hall"]
    templates = ["In {y}, {p} paid for {t} in {c}.", "{p} lived in {c} from {y} and kept {n} notebooks about {t}.",
                 "A storm in {y} damaged {t} in {c}; repairs took {n} months.", "{c} counted {n} thousand people in {y}."]
    paragraphs, total = [], 0
    while total < num_tokens:
        paragraph = " ".join(rng.choice(templates).format(y=rng.randrange(1700, 1950), p=rng.choice(people),
                                                          t=rng.choice(things), c=rng.choice(places), n=rng.randrange(2, 90))
                             for _ in range(rng.randrange(3, 7)))
        total += len(tokenizer("\n\n" + paragraph)["input_ids"])
        paragraphs.append(paragraph)
    return "\n\n".join(paragraphs)


def smollm2(folder: Path, num_tokens: int, rounds: int) -> dict:
    """Prefill once; then cold restores (whole ``restore_snapshot`` call) into new sessions."""
    model, tokenizer = load_model(None, device="cpu")
    text = document(tokenizer, num_tokens - 150)  # the chat template adds the rest
    question = "Who paid for the lighthouse, and when?"
    session = DocumentSession(model, tokenizer, answer_budget=64)
    session.set_document(text)
    started = time.perf_counter()
    session.prefill()
    prefill = time.perf_counter() - started
    *_, expected = session.ask(question, max_new_tokens=16)
    store = SnapshotStore(folder / "smollm2-kv")
    info = session.save_snapshot(store)
    seconds, cached = [], []
    try:
        for _ in range(rounds):
            cached.append(drop_folder(info.path))
            fresh = DocumentSession(model, tokenizer, answer_budget=64)
            fresh.set_document(text)
            started = time.perf_counter()
            stats = fresh.restore_snapshot(store)
            seconds.append(time.perf_counter() - started)
        *_, answer = fresh.ask(question, max_new_tokens=16)
    finally:
        shutil.rmtree(store.root, ignore_errors=True)
    restore = statistics.median(seconds)
    return {"tokens": session.document_tokens, "bytes": stats.num_bytes, "prefill_seconds": prefill,
            "restore_seconds": seconds, "median_restore_seconds": restore,
            "median_restore_gbps": stats.num_bytes / restore / 1e9, "restore_vs_prefill_speedup": prefill / restore,
            "cached_fraction_before_cold_restore": max(cached), "same_answer": answer.text == expected.text,
            "answer": answer.text}


# -- report ------------------------------------------------------------------------------------
def machine(folder: Path) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mount = max((line.split() for line in Path("/proc/mounts").read_text().splitlines()
                 if str(folder.resolve()).startswith(line.split()[1])), key=lambda f: len(f[1]), default=["?", "?", "?"])
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
            "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / _GIB, 1),
            "disk": f"{mount[0]} ({mount[2]}) at {mount[1]}", "python": platform.python_version(), "torch": torch.__version__,
            "load_average_at_start": os.getloadavg()}


def markdown(result: dict) -> str:
    m, d, s, q, t = result["machine"], result["disk"], result["synthetic"], result.get("smollm2"), result["targets"]
    runs = lambda values: ", ".join(f"{v:.2f}" for v in values)  # noqa: E731
    lines = [
        "# KV-cache snapshots on the CPU machine (issue 4)", "",
        f"Measured {m['date']} on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB), disk {m['disk']}, "
        f"torch {m['torch']}. Load average {m['load_average_at_start'][0]:.1f} at start, "
        f"{m['load_average_at_end'][0]:.1f} at end: a shared VM where other jobs ran meanwhile, so every cold "
        f"read was repeated {s['rounds']} times, interleaved, and the medians compared. "
        "Produced by `python -m benchmarks.snapshot_bench`.", "",
        "| what | GB/s (median) | runs | note |", "| --- | ---: | --- | --- |",
        f"| disk sequential write, {d['bytes'] / _GIB:.0f} GiB + fsync | {d['write_gbps']:.2f} | | |",
        f"| disk sequential read, cold, {d['bytes'] / _GIB:.0f} GiB file | {s['median_disk_read_cold_gbps']:.2f} | "
        f"{runs(s['disk_read_cold_gbps'])} | page cache bypassed: {d['page_cache_bypassed']} "
        f"(mincore: {d['cached_fraction_before_cold_read']:.0%} cached after fadvise DONTNEED) |",
        f"| disk sequential read, cold, the snapshot's own files | {s['median_snapshot_files_read_cold_gbps']:.2f} | "
        f"{runs(s['snapshot_files_read_cold_gbps'])} | |",
        f"| disk sequential read, warm (page cache) | {d['read_warm_gbps']:.2f} | | |",
        f"| CRC-32 ({result['crc32_impl']}, one core) | {result['crc32_gbps']:.2f} | | on a worker thread during I/O |",
        f"| snapshot save, Llama-3-8B shape, {s['tokens']:,} tokens ({s['bytes'] / _GIB:.2f} GiB) | {s['save_gbps']:.2f} | | "
        f"{s['save_gbps'] / d['write_gbps']:.0%} of disk write |",
        f"| snapshot restore, cold, into fresh homes | {s['median_restore_cold_gbps']:.2f} | {runs(s['restore_cold_gbps'])} | "
        f"**{t['restore_fraction_of_disk_read']:.0%} of disk cold read** (target >= 70%); "
        f"{s['median_restore_cold_gbps'] / s['median_snapshot_files_read_cold_gbps']:.0%} of reading the same files |",
        f"| snapshot restore, warm page cache, touched homes | {s['restore_warm_gbps']:.2f} | | the CPU-side ceiling |",
        f"| restored bytes identical | {s['identical']} | | |",
    ]
    if q:
        lines += ["", "| SmolLM2-135M-Instruct, CPU, fp32 | value |", "| --- | ---: |",
                  f"| document tokens | {q['tokens']:,} |", f"| snapshot size | {q['bytes'] / 1e6:.0f} MB |",
                  f"| prefill | {q['prefill_seconds']:.1f} s |",
                  f"| restore, cold, whole `restore_snapshot` call (median) | {q['median_restore_seconds']:.2f} s "
                  f"({q['median_restore_gbps']:.2f} GB/s; runs {runs(q['restore_seconds'])} s) |",
                  f"| **restore vs prefill** | **{q['restore_vs_prefill_speedup']:.0f}x faster** (target >= 10x) |",
                  f"| same greedy answer after restore | {q['same_answer']} |"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=None, help="where to write (default: the studio cache dir)")
    parser.add_argument("--disk-gib", type=float, default=2.0)
    parser.add_argument("--tokens", type=int, default=16384, help="tokens of the Llama-3-8B-shaped cache")
    parser.add_argument("--rounds", type=int, default=5, help="cold reads of each kind, interleaved")
    parser.add_argument("--smollm2-tokens", type=int, default=8192, help="0 skips SmolLM2")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    folder = (args.folder or cache_dir()) / "snapshot-bench"
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / "disk-probe.bin"
    try:
        result = {"machine": machine(folder)}
        disk = write_probe(probe, int(args.disk_gib * _GIB) // _PIECE * _PIECE)
        disk["read_cold_gbps"], disk["cached_fraction_before_cold_read"] = read_gbps([probe], cold=True)
        disk["page_cache_bypassed"] = disk["cached_fraction_before_cold_read"] < 0.01
        disk["read_warm_gbps"] = read_gbps([probe], cold=False)[0]
        result["disk"] = disk
        logger.info("disk: %s", disk)
        result["crc32_impl"], result["crc32_gbps"] = checksum_gbps()
        result["synthetic"] = synthetic(folder, args.tokens, probe, args.rounds)
        logger.info("synthetic: %s", result["synthetic"])
        if args.smollm2_tokens:
            result["smollm2"] = smollm2(folder, args.smollm2_tokens, max(args.rounds // 2, 1))
            logger.info("smollm2: %s", result["smollm2"])
        result["machine"]["load_average_at_end"] = os.getloadavg()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    s = result["synthetic"]
    result["targets"] = {"restore_fraction_of_disk_read": s["median_restore_cold_gbps"] / s["median_disk_read_cold_gbps"],
                         "restore_vs_prefill_speedup": result.get("smollm2", {}).get("restore_vs_prefill_speedup")}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "snapshot-cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    report = markdown(result)
    (args.out / "snapshot-cpu.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
