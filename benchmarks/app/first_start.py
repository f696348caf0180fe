"""A first start on a clean cache, then a second start on the same cache: time to ready, time from ready to the
first upload's plan, and whether the start measured this machine's reading cost.

    python -m benchmarks.app.first_start [--document PDF]

Each start is ``launch.py`` in a new process (the embedded SmolLM2-135M on the CPU, ``HEADINFER_CPU_MODEL=embedded``,
a fresh ``HEADINFER_CACHE`` shared by the two starts), under ``nice -n 5``. *Ready*: the app's page answers (HTTP
200). *Plan*: from ready to the answer of the app's own upload endpoint (``/upload``, through ``gradio_client`` as
the API tests drive it) for a real PDF: the plan panel with its reading-time estimate. The start's log says whether
the reading-cost measurement ran (``read rate:``) and when it landed. Writes docs/benchmarks/first-start.md and data/first-start.json.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ..corpus import fetch_corpus
from ..records import run_stamp
from ..harness.layout import data_file

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_start(cache: Path, document: Path, log: Path) -> dict:
    from gradio_client import Client, handle_file

    port = free_port()
    env = {**os.environ, "HEADINFER_CACHE": str(cache), "HEADINFER_CPU_MODEL": "embedded"}
    started = time.perf_counter()
    with log.open("w") as sink:
        process = subprocess.Popen(["nice", "-n", "5", sys.executable, "launch.py", "--port", str(port)], cwd=ROOT,
                                   env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(log.read_text()[-3000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.25)
        ready = time.perf_counter() - started
        load_at_ready = os.getloadavg()[0]
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        asked = time.perf_counter()
        _, plan, _, _ = client.predict([handle_file(str(document))], api_name="/upload")
        plan_s = time.perf_counter() - asked
        estimate = re.search(r"<span>Reading time</span><b>(.*?)</b>", plan, re.S)
        measured = None
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:  # a measurement under way (a first start): until it lands or stops
            text = log.read_text()
            if "measuring this machine's reading cost" not in text or "read rate:" in text or \
                    "measurement stopped" in text:
                break
            time.sleep(1)
        text = log.read_text()
        if "read rate:" in text:
            measured = time.perf_counter() - started
        return {"ready_s": ready, "plan_after_ready_s": plan_s, "plan_estimate": html.unescape(estimate.group(1)) if estimate
                else None, "measured": "measuring this machine's reading cost" in text, "measurement_landed_s": measured,
                "load_at_ready": load_at_ready, "load_avg": os.getloadavg()[0]}
    finally:
        process.terminate()
        process.wait(timeout=60)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.app.first_start")
    p.add_argument("--corpus", default=".pytest_cache/d/debian-documents")
    p.add_argument("--document", default="faq-pdf", help="the corpus document uploaded (a real PDF)")
    p.add_argument("--out", default="docs/benchmarks")
    args = p.parse_args(argv)
    document = fetch_corpus(Path(args.corpus))[args.document]
    rows = []
    with tempfile.TemporaryDirectory(prefix="headinfer-first-start-") as folder:
        cache = Path(folder) / "cache"
        for start in (1, 2):
            row = {"start": start, **one_start(cache, document, Path(folder) / f"launch-{start}.log")}
            row["log_tail"] = [line for line in (Path(folder) / f"launch-{start}.log").read_text().splitlines()
                               if "read rate" in line or "model ready" in line or "reading cost" in line]
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    data_file(out, "first-start.json").write_text(json.dumps({"run": run_stamp("cpu"), "document": args.document,
                                                      "rows": rows}, indent=1))
    lines = ["# First and second start (SmolLM2-135M, CPU, clean cache)", "",
             "`python -m benchmarks.app.first_start`: `launch.py` twice on one fresh `HEADINFER_CACHE` (embedded "
             f"SmolLM2-135M, `nice -n 5`), then the app's own `/upload` endpoint with a real PDF ({args.document}). "
             "*Ready*: the page answers. *Plan*: ready to the upload's plan panel. *Measured*: whether the start "
             "measured this machine's reading cost (in the background, after ready), and when it landed. *Load*: "
             "the 1-minute load average (2 cores, shared with other jobs).", "",
             "| start | ready (s) | plan after ready (s) | estimate in the plan | measured | landed (s after launch) | "
             "load |", "|---:|---:|---:|---|---|---:|---:|"]
    for r in rows:
        landed = f"{r['measurement_landed_s']:.0f}" if r["measurement_landed_s"] else "–"
        lines.append(f"| {r['start']} | {r['ready_s']:.1f} | {r['plan_after_ready_s']:.1f} | {r['plan_estimate']} | "
                     f"{'yes' if r['measured'] else 'no'} | {landed} | {r['load_at_ready']:.1f}–{r['load_avg']:.1f} |")
    (out / "first-start.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
