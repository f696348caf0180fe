import os
import sys
import tempfile
from pathlib import Path

import pytest

from process_env import prepare_process, shaped

# The tests' helpers (tiny model builders, fake servers, file makers) live in helpers/ folders beside the tests and
# are imported by bare name (``from archs import build_pair``) from any test folder.
_TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(_TESTS / folder / "helpers") for folder in (".", "engine", "app", "e2e", "benchmarks")]

# Tests and the apps they launch run the small embedded SmolLM2, not the CPU default (engine.models.pypi).
os.environ.setdefault("HEADINFER_CPU_MODEL", "embedded")
# ... and keep their files (converted models, read timings, retrieval heads, saved KV) in a folder of the run's, never
# the user's ~/.cache/headinfer-studio: what a test sees does not depend on what this machine ran before.
_CACHE = tempfile.TemporaryDirectory(prefix="headinfer-test-cache-")
# A child pytest that a test starts on purpose with a cache of its own (HEADINFER_TEST_CACHE) keeps it.
os.environ["HEADINFER_CACHE"] = os.environ.get("HEADINFER_TEST_CACHE") or _CACHE.name
# The tests run with the app's process settings (allocator, OpenMP, malloc: before torch loads). With
# HEADINFER_WINDOWS_SHAPED=1 (scripts/test_windows_shaped.sh) the tests and the apps they launch make a Windows PC's
# choices (process_env, engine.paths_windows), and a fork in this process fails the test that made it: Windows has none.
prepare_process()
if shaped():

    def _no_fork():
        raise AssertionError("os.fork in the Windows-shaped run: Windows has no fork (use spawn)")

    os.fork = _no_fork


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    # Parallel workers (pytest-xdist) on a small machine: one torch thread each, so two workers don't oversubscribe
    # the cores (OpenMP threads spinning against each other make every forward several times slower).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


#: Where each failure's report is appended the moment it happens (``gpu_steps.gpu_tests`` sets it): a GPU run cut at
#: its time cap never reaches pytest's summary, and the H200 run of 2026-11-27 lost five failures' reasons so.
FAILURE_LOG = "HEADINFER_FAILURE_LOG"


def pytest_runtest_logreport(report):
    path = os.environ.get(FAILURE_LOG)
    # Under xdist the controller sees every worker's report too: only the process that is no worker writes.
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with open(path, "a") as log:
        log.write(f"\n=== {report.nodeid} ({report.when})\n{report.longreprtext}\n")
