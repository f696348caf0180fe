"""``python -m benchmarks.gpu.pin_budget``: pinned memory as a budget, measured (issue 50).

Two measurements, each printed as a table and written to ``<out>/pin-budget.json`` and ``.md``:

- **a failed pin, then a forward**: every way the engine may meet a refused page-lock, each followed by a CUDA
  forward of a small model through the head-wise cache (exact vs stock): the runtime's ``cudaHostRegister`` with
  its last error cleared (``pinned.HostMemory``'s path), the driver's ``cuMemHostRegister`` (the probe's, no error
  kept), torch's ``pin_memory`` of more than the RAM (its caching host allocator), and for contrast the runtime's
  without the clearing (the error a later call reports). On a CPU: the emulated backend's refusal past
  ``HEADINFER_PIN_LIMIT`` (sticky, as WDDM), then a read under that limit through the staging ring.
- **decode, fully pinned vs through the staging ring** (on a CPU with the emulated streams' injected delays off:
  worker threads that copy at once, the checker still on): a model with Llama-3-8B's KV shape (8 KV heads of 128; the
  layers given, 16 by default: 8 GiB of bf16 KV at 128K) whose cache is filled with random K/V, decode steps timed
  with every home pinned and again under a pin limit (default 2 GiB: the store 4x the limit, as Llama-3-8B's 16 GiB
  at a 4 GiB limit), each in a child process of its own (pins are counted per process). ``--layers 32 --limit
  4GiB`` is the issue's exact case where the device call has the time.

``--device cpu`` runs both on emulated streams at a small context (the plumbing, and the ring's cost on a CPU:
docs/benchmarks/pin-budget.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

import engine
from engine.errors import PinningError
from engine.kv.pin_budget import ENV_LIMIT, driver_registration, parse_limit

from ..harness.fill import fill_random
from ..harness.layout import data_file

logger = logging.getLogger(__name__)

_TOKENS = {"k": 1 << 10, "m": 1 << 20}


def _tokens(text: str) -> int:
    text = text.strip().lower()
    return int(float(text[:-1]) * _TOKENS[text[-1]]) if text[-1] in _TOKENS else int(text)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--context", default=None, help="decode context (default 128K on CUDA, 4K on a CPU)")
    p.add_argument("--layers", type=int, default=None, help="layers of the KV (default 16)")
    p.add_argument("--limit", default=None, help="the staged run's pin limit (default 2GiB on CUDA; a CPU: 1/4 "
                                                 "of the KV)")
    p.add_argument("--steps", type=int, default=4, help="timed decode steps")
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--child", choices=("pinned", "staged"), default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _config(args) -> LlamaConfig:
    cuda = torch.device(args.device).type == "cuda"
    layers = args.layers or 16
    if cuda:  # Llama-3-8B's KV per layer (8 heads of 128), small weights: the KV is what moves
        return LlamaConfig(hidden_size=512, intermediate_size=1024, num_attention_heads=32, num_key_value_heads=8,
                           head_dim=128, num_hidden_layers=layers, vocab_size=1024, max_position_embeddings=1 << 20)
    # A CPU: 8 KV heads of 32, so a head group's fetch (1 MiB at 4K) is as small next to the slots as on the GPU
    # (one piece a fetch), the store 4x the limit.
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=8,
                       head_dim=32, num_hidden_layers=layers, vocab_size=256, max_position_embeddings=1 << 20)


def _model(args, dtype: torch.dtype):
    torch.manual_seed(0)
    config = _config(args)
    return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="headinfer").to(args.device).eval()


def _policy(device: torch.device, context: int) -> dict:
    # Every group offloaded and streamed (no host attention): each decode step fetches the whole store.
    return dict(head_group_size=1, resident_slots=0, host_attention="off", chunk_size=512, max_context=context + 64,
                streams="auto" if device.type == "cuda" else "emulated", device=str(device))


def kv_bytes(config, context: int, dtype: torch.dtype) -> int:
    return config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2 * context * dtype.itemsize


# -- a failed pin, then a forward ---------------------------------------------------------------------------
@torch.inference_mode()
def exact_forward(model, device: torch.device, tokens: int = 96) -> tuple[bool, str]:
    """A chunked read and three greedy steps through a HeadInferCache vs stock: (exact, what failed)."""
    try:
        ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(3))
        ids = ids.to(device)
        cache = engine.HeadInferCache(model.config, **_policy(device, tokens + 8), dtype=model.dtype)
        out = model(ids, past_key_values=cache).logits[:, -1]
        engine_attention = model.config._attn_implementation
        model.set_attn_implementation("sdpa")
        stock_cache = DynamicCache(config=model.config)
        expected = model(ids, past_key_values=stock_cache).logits[:, -1]
        model.set_attn_implementation(engine_attention)
        same = torch.equal(out.argmax(-1), expected.argmax(-1))
        for _ in range(3):
            token = expected.argmax(-1, keepdim=True)
            out = model(token, past_key_values=cache).logits[:, -1]
            model.set_attn_implementation("sdpa")
            expected = model(token, past_key_values=stock_cache).logits[:, -1]
            model.set_attn_implementation(engine_attention)
            same &= torch.equal(out.argmax(-1), expected.argmax(-1))
        staged = cache.transfer.ring.num_fetches if cache.transfer.ring is not None else 0
        cache.release()
        return bool(same), f"greedy tokens {'identical' if same else 'differ'}, {staged} staged fetches"
    except Exception as error:  # noqa: BLE001 - what the forward met is the measurement
        return False, f"{type(error).__name__}: {str(error)[:200]}"


def failed_pins(device: torch.device) -> list[dict]:
    """Each refused page-lock, then an exact forward; one row each."""
    model = _model(argparse.Namespace(device=str(device), layers=2), torch.float32)
    rows = []
    if device.type != "cuda":
        from engine.kv.emulated import EmulatedStreams

        streams = EmulatedStreams(pin_limit=1 << 16)
        refused = []
        for size in (1 << 17, 1 << 10):  # past the limit; then within it, after the refusal
            try:
                streams.pinned((size,), torch.uint8)
                refused.append(False)
            except PinningError:
                refused.append(True)
        streams.close()
        os.environ[ENV_LIMIT] = str(64 << 10)  # a read whose KV (416 KiB) is far past it: through the ring
        try:
            ok, words = exact_forward(model, device)
        finally:
            os.environ.pop(ENV_LIMIT, None)
        return [{"path": "emulated pin past HEADINFER_PIN_LIMIT (then one within it)",
                 "refused": refused, "forward_ok": ok, "forward": words}]
    from engine.kv.pinned import cuda_runtime

    runtime, driver = cuda_runtime(), driver_registration()
    too_big = (psutil.virtual_memory().total * 4) // 4096 * 4096
    block = torch.empty(1 << 20, dtype=torch.uint8)

    def runtime_cleared():
        code = runtime.host_register(block.data_ptr(), 0)  # size 0: invalid value, refused at once
        runtime.clear_last_error()
        return code

    def driver_refused():
        return driver.host_register(block.data_ptr(), 0) if driver is not None else "no driver library"

    def torch_too_big():
        try:
            torch.empty(too_big, dtype=torch.uint8, pin_memory=True)
            return 0
        except RuntimeError as error:
            return f"RuntimeError: {str(error)[:80]}"

    def runtime_not_cleared():
        return runtime.host_register(block.data_ptr(), 0)

    for name, attempt in (("cudaHostRegister, last error cleared (HostMemory)", runtime_cleared),
                          ("cuMemHostRegister (driver API, the probe)", driver_refused),
                          ("torch pin_memory of 4x the RAM", torch_too_big),
                          ("cudaHostRegister, error NOT cleared (contrast)", runtime_not_cleared)):
        code = attempt()
        ok, words = exact_forward(model, device)
        rows.append({"path": name, "refused": code, "forward_ok": ok, "forward": words})
        runtime.clear_last_error()  # whatever the contrast left, the next row starts clean
    return rows


# -- decode, fully pinned vs through the staging ring ---------------------------------------------------------
@torch.inference_mode()
def decode_one(args) -> dict:
    """(child) Decode steps over a cache filled with random K/V, under whatever ``HEADINFER_PIN_LIMIT`` says."""
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    context = _tokens(args.context or ("128K" if cuda else "4K"))
    if not cuda:  # timed, not hunting races: the emulated streams' injected delays off (the checker still runs)
        from engine.kv import emulated

        emulated.STALL_PROBABILITY, emulated.DELAY_SECONDS = 0.0, 0.0
    model = _model(args, dtype)
    config = model.config
    cache = engine.HeadInferCache(config, **_policy(device, context), dtype=dtype)
    started = time.perf_counter()
    fill_random(cache, context, head_dim=config.head_dim, num_kv_heads=config.num_key_value_heads, device=device,
                dtype=dtype)
    filled = time.perf_counter() - started
    token = torch.zeros(1, 1, dtype=torch.long, device=device)
    model(token, past_key_values=cache)  # a warm-up step
    _sync(device)
    ring = cache.transfer.ring
    staged_before = (ring.bytes_staged, ring.copy_seconds) if ring is not None else (0, 0.0)
    seconds = []
    for _ in range(args.steps):
        begin = time.perf_counter()
        model(token, past_key_values=cache)
        _sync(device)
        seconds.append(time.perf_counter() - begin)
    budget = cache.transfer.streams.pin_budget
    result = {"context": context, "layers": config.num_hidden_layers, "kv_bytes": kv_bytes(config, context, dtype),
              "pin_limit": budget.limit if budget is not None else None,
              "pinned_peak": budget.peak if budget is not None else 0, "fill_s": filled,
              "s_per_token": sorted(seconds)[len(seconds) // 2], "steps": seconds,
              "staged_fetches": ring.num_fetches if ring is not None else 0,
              "staged_bytes_per_token": (ring.bytes_staged - staged_before[0]) / args.steps if ring else 0,
              "memcpy_s_per_token": (ring.copy_seconds - staged_before[1]) / args.steps if ring else 0.0,
              "ring_bytes": ring.pinned_bytes if ring is not None else 0, "plan": cache.plan.pinning_line()}
    cache.release()
    return result


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _child(args, label: str, limit: int | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != ENV_LIMIT}
    if limit is not None:
        env[ENV_LIMIT] = str(limit)
    command = [sys.executable, "-m", "benchmarks.gpu.pin_budget", "--child", label, "--device", args.device,
               "--steps", str(args.steps)]
    for flag, value in (("--context", args.context), ("--layers", args.layers)):
        if value is not None:
            command += [flag, str(value)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr or done.stdout)[-600:]}
    return json.loads(lines[-1].removeprefix("RESULT "))


def table(results: dict) -> str:
    lines = ["| a refused pin through | refused with | the next forward |", "|---|---|---|"]
    for row in results["failed_pin"]:
        lines.append(f"| {row['path']} | {row['refused']} | {'exact' if row['forward_ok'] else 'FAILED'}: "
                     f"{row['forward']} |")
    lines += ["", "| decode | context | KV | pin limit | pinned (peak) | s/token | staged MB/token | memcpy s/token |",
              "|---|---|---|---|---|---|---|---|"]
    for label in ("pinned", "staged"):
        r = results[label]
        if "error" in r:
            lines.append(f"| {label} | error: {r['error'][-200:]!r} | | | | | | |")
            continue
        limit = "none" if r["pin_limit"] is None else f"{r['pin_limit'] / 2**20:,.1f} MiB"
        peak = f"{r['pinned_peak'] / 2**20:,.1f} MiB" if r["pin_limit"] is not None or r["pinned_peak"] else "all homes"
        lines.append(f"| {label} | {r['context']:,} | {r['kv_bytes'] / 2**20:,.1f} MiB | {limit} | "
                     f"{peak} | {r['s_per_token']:.4f} | "
                     f"{r['staged_bytes_per_token'] / 1e6:.1f} | {r['memcpy_s_per_token']:.4f} |")
    pinned, staged = results["pinned"], results["staged"]
    if "s_per_token" in pinned and "s_per_token" in staged:
        ratio = staged["s_per_token"] / pinned["s_per_token"]
        results["ratio"] = ratio
        lines += ["", f"staging ring / fully pinned: **{ratio:.2f}x** per decode token (target on a GPU: <= 1.3x)"]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.child is not None:
        print("RESULT " + json.dumps(decode_one(args)), flush=True)
        return 0
    device = torch.device(args.device)
    results = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (emulated streams)",
               "failed_pin": failed_pins(device)}
    if args.limit is not None:
        limit = parse_limit(args.limit)
    elif device.type == "cuda":
        limit = 2 << 30
    else:
        config = _config(args)  # the store 4x the limit, as on the GPU
        limit = kv_bytes(config, _tokens(args.context or "4K"), torch.float32) // 4
    results["pinned"] = _child(args, "pinned", None)
    results["staged"] = _child(args, "staged", limit)
    text = table(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_file(out, "pin-budget.json").write_text(json.dumps(results, indent=1))
    intro = ("Written by `python -m benchmarks.gpu.pin_budget --device "
             f"{args.device}` ({time.strftime('%Y-%m-%d')}); what each row measures: that module's docstring.")
    (out / "pin-budget.md").write_text(f"# Pinned memory as a budget ({results['device']})\n\n{intro}\n\n{text}\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
