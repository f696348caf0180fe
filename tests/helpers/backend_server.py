"""A real OpenAI-compatible server on this machine for the ``--backend`` tests: ``transformers serve`` (transformers'
own CLI, FastAPI + uvicorn) on the embedded SmolLM2 folder, offline (``HF_HUB_OFFLINE=1``), on a free port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
from ports import free_port

START_SECONDS = 240  # loading torch and the model on a shared 2-core CPU


@contextmanager
def transformers_serve(model_dir: Path):
    """Yields ``(url, model id)`` of ``transformers serve MODEL_DIR`` once its ``/health`` answers; stops it after."""
    port = free_port()
    cli = Path(sys.executable).with_name("transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"transformers-serve-{port}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen([str(cli), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
                                "--device", "cpu", "--dtype", "float32"], env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"transformers serve exited ({process.returncode}); see {log.name}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve did not answer in {START_SECONDS} s; see {log.name}")
            time.sleep(1)
        yield url, str(model_dir)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
