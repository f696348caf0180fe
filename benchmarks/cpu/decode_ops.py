"""``python -m benchmarks.cpu.decode_ops``: what one decode token costs the host, head-wise vs stock transformers.

Counted, not timed (issue 29, item 4): on the CPU, for a Llama-3-8B-shaped tiny model (32 layers x 8 KV heads,
32 query heads; tiny widths, since counts do not depend on them) with every slot offloaded, one decode step's
- aten operators through the dispatcher (a ``TorchDispatchMode`` counter, as ``tests/engine/helpers/opcount.py``), and
  their ratio to stock transformers' step with a ``DynamicCache``;
- copies issued through the streams seam (``copy`` calls, ``copy_many`` calls and the pieces they carry) and
  event calls (``record``, ``wait_event``, ``synchronize``): each is a CUDA call on a GPU.
A layer's adjacent streamed groups are fetched and attended as one run of up to what a ping-pong buffer holds:
the plan's ``groups_per_buffer`` groups' context (no budget here: a layer's eight), so the runs stay whole up to
the planned context (``--groups-per-buffer 1``: the paper's buffers of one group, runs shrink as the context nears
the plan). Writes ``docs/benchmarks/decode-ops.md`` and ``data/decode-ops.json``::

    python -m benchmarks.cpu.decode_ops                      # groups 1, 2, 8; context 16, 200, 900 of 1024 planned
    python -m benchmarks.cpu.decode_ops --label before --out /tmp/ops   # (the same script run on an older checkout)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

import engine
from engine.kv import streams as kv_streams

from ..harness.layout import data_file

logger = logging.getLogger(__name__)

OUT = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.num = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.num += 1
        return func(*args, **(kwargs or {}))


class CountingStreams(kv_streams.SyncStreams):
    """Synchronous streams that count the seam calls a GPU would turn into CUDA calls."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()
        counts = self.counts

        class Stream(kv_streams._SyncStream):
            def wait_event(self, event) -> None:
                counts["event calls"] += 1

            def synchronize(self) -> None:
                counts["event calls"] += 1

        class Event(kv_streams._SyncEvent):
            def record(self, stream=None) -> None:
                counts["event calls"] += 1

            def synchronize(self) -> None:
                counts["event calls"] += 1

        self._stream_class, self._event_class = Stream, Event
        self._compute = Stream("compute")

    def new_stream(self, name: str):
        return self._stream_class(name)

    def event(self, blocking: bool = False):
        return self._event_class()

    def copy(self, dst, src, what: str = "") -> None:
        self.counts["copy calls"] += 1
        self.counts["copied pieces"] += 1
        super().copy(dst, src, what)

    def copy_many(self, dsts, srcs, what: str = "") -> None:
        self.counts["copy calls"] += 1
        self.counts["copied pieces"] += len(dsts)
        torch._foreach_copy_(dsts, srcs)


def tiny_llama(attn: str, max_positions: int) -> torch.nn.Module:
    config = LlamaConfig(num_hidden_layers=32, num_key_value_heads=8, num_attention_heads=32, head_dim=8,
                         hidden_size=256, intermediate_size=64, vocab_size=97, max_position_embeddings=max_positions)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


@torch.inference_mode()
def decode_counts(model, cache, context: int) -> dict:
    """Counts of the third decode step after a ``context``-token prefill (the first ones allocate and warm)."""
    ids = torch.randint(0, 97, (1, context), generator=torch.Generator().manual_seed(3))
    model(ids, past_key_values=cache)
    model(torch.tensor([[5]]), past_key_values=cache)
    streams = getattr(getattr(cache, "transfer", None), "streams", None)
    before = collections.Counter(getattr(streams, "counts", {}))
    ops = _Ops()
    with ops:
        model(torch.tensor([[7]]), past_key_values=cache)
    counts = collections.Counter(getattr(streams, "counts", {}))
    counts.subtract(before)
    return {"aten ops": ops.num, **{k: counts[k] for k in ("copy calls", "copied pieces", "event calls")}}


@contextlib.contextmanager
def counting_streams():
    real = kv_streams.make
    kv_streams.make = lambda *args, **kwargs: CountingStreams()
    try:
        yield
    finally:
        kv_streams.make = real


def measure(groups: list[int], contexts: list[int], max_context: int, per_buffer: int | None = None) -> list[dict]:
    stock = tiny_llama("sdpa", max_context)
    headinfer = tiny_llama("headinfer", max_context)
    rows = []
    for context in contexts:
        base = decode_counts(stock, DynamicCache(config=stock.config), context)
        rows.append({"mode": "stock", "context": context, **base, "ratio": 1.0})
        for group in groups:
            with counting_streams():
                cache = engine.HeadInferCache(headinfer.config, head_group_size=group, resident_slots=0,
                                              device="cpu", max_context=max_context, groups_per_buffer=per_buffer)
                counts = decode_counts(headinfer, cache, context)
                cache.release()
            rows.append({"mode": f"headinfer-g{group}", "context": context, **counts,
                         "ratio": round(counts["aten ops"] / base["aten ops"], 3),
                         "groups per buffer": cache.plan.groups_per_buffer})
            logger.info("%s", rows[-1])
    return rows


def table(runs: dict[str, list[dict]]) -> str:
    """One markdown table: a row per (mode, context), a column group per run label."""
    labels = list(runs)
    keys = [(r["mode"], r["context"]) for r in runs[labels[-1]]]
    head = "| mode | context |" + "".join(f" {label}: aten ops (x stock) | {label}: copies (pieces) | "
                                         f"{label}: event calls |" for label in labels)
    lines = [head, "|---|---:|" + "---:|---:|---:|" * len(labels)]
    for mode, context in keys:
        cells = []
        for label in labels:
            row = next((r for r in runs[label] if (r["mode"], r["context"]) == (mode, context)), None)
            if row is None:
                cells.append(" | | ")
                continue
            cells.append(f"{row['aten ops']} ({row['ratio']:.2f}x) | {row['copy calls']} ({row['copied pieces']}) | "
                         f"{row['event calls']}")
        lines.append(f"| {mode} | {context} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="1,2,8", help="head group sizes (KV heads per group)")
    parser.add_argument("--contexts", default="16,200,900", help="prefill tokens before the counted decode step")
    parser.add_argument("--max-context", type=int, default=1024, help="the planned context (buffers are sized by it)")
    parser.add_argument("--groups-per-buffer", type=int, default=None,
                        help="fix the plan's groups per ping-pong buffer (default: the planner's choice)")
    parser.add_argument("--label", default="after", help="the column this run fills in the JSON")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rows = measure([int(g) for g in args.groups.split(",")], [int(c) for c in args.contexts.split(",")],
                   args.max_context, args.groups_per_buffer)
    args.out.mkdir(parents=True, exist_ok=True)
    path = data_file(args.out, "decode-ops.json")
    runs = json.loads(path.read_text()) if path.exists() else {}
    runs[args.label] = rows
    path.write_text(json.dumps(runs, indent=1) + "\n")
    (args.out / "decode-ops.md").write_text(HEADER + table(runs) + "\n" + FOOTER)
    print(table(runs))


HEADER = """# Host work per decode token: head-wise vs stock (counted on the CPU)

`python -m benchmarks.cpu.decode_ops` (issue 29, item 4). One decode step of a Llama-3-8B-shaped tiny model (32 layers
x 8 KV heads, 32 query heads, tiny widths), every slot offloaded, planned for 1,024 tokens, after a prefill of
*context* tokens (900 is the near-plan row): aten operators through the dispatcher (and the ratio to stock
transformers with a `DynamicCache`), copies issued through the streams seam (calls, and in brackets the pieces
they carry: a batched `copy_many` is one call), and event calls (`record`, `wait_event`). On a GPU each copy call
and event call is a CUDA call. Counts, not times: they do not depend on the machine or its load.

Columns: *before*: the same script on commit 0d62197 (`PYTHONPATH=<that checkout> python
benchmarks/cpu/decode_ops.py --label before`), a fetch, a device copy and an attention call per group; *runs*: commit
a5f1abf (stacked homes, runs of adjacent groups, batched appends), whose ping-pong buffers held one group's
context at the plan; *after*: buffers of the plan's `groups_per_buffer` (here, with no budget, a layer's eight:
`python -m benchmarks.cpu.decode_ops`).

"""

FOOTER = """
What changed in *runs*: a layer's offloaded homes in RAM are one tensor per plane (`LayerHomes.stack`,
`[groups, capacity, B, 2, g, D]`); the layer's append is one batched copy (one `copy_many`: on CUDA one call whose
pieces are asynchronous copies); adjacent streamed groups that fit one ping-pong buffer at the current length are
one *run*: fetched with one batched copy, the new token put after their past with one device copy, attended in
one call (groups of one head as the heads of one sequence, larger groups as a batch), with one set of events; the
staged chunk's views are made once per length. But a buffer held one group at the planned context, so the runs
shrank as the context grew: a layer's eight groups at 16 of 1,024 tokens, runs of five and three at 200, one
group per run near the plan (900), where only the batched append and the staging views remained of the saving.

What changed in *after*: the plan decides how many groups' visible context each ping-pong buffer holds
(`Plan.groups_per_buffer`, `engine/planning/planner.py`): as many as the budget that holds the buffers allows, at
most a layer's longest run of streamed groups (where resident slots are adaptive too, the size whose predicted
decode step is shortest). The cache allocates the buffers at that size, the ledger counts them so, and the
schedule's runs stay whole up to the planned context: one fetch, one device copy of the new token and one
attention call per layer at every context here. Group 1 is at 1.29x stock at 16, 200 and 900 tokens (the issue's
target: at most 1.3x); group 2 stays at 1.32x (its groups are attended as a batch, a few more views per layer),
as it was at a short context before.
"""


if __name__ == "__main__":
    main()
