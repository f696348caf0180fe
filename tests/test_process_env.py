"""``process_env.prepare_process()``: the settings that must be in place before torch loads, in a child process that
never imports torch (what a library caller runs before ``import torch``)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "OMP_WAIT_POLICY", "MALLOC_MMAP_THRESHOLD_",
         "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "HEADINFER_WINDOWS_SHAPED",
         "HEADINFER_PIN_LIMIT")
_CHILD = """
import json, multiprocessing, os, sys
from process_env import prepare_process
seen = []
for _ in range(2):  # the second call must change nothing
    returned = prepare_process()
    seen.append({"returned": returned, "start": multiprocessing.get_start_method(allow_none=True),
                 "environ": {name: os.environ.get(name) for name in json.loads(sys.argv[1])}})
print(json.dumps({"calls": seen, "torch": "torch" in sys.modules}))
"""


def _prepared(user: dict[str, str]) -> dict:
    """What ``prepare_process`` left, twice, in a child whose environment holds none of ``NAMES`` but ``user``'s."""
    env = {k: v for k, v in os.environ.items() if k not in NAMES} | user
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(NAMES)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_prepare_process_sets_each_setting_before_torch_and_a_second_call_changes_nothing():
    seen = _prepared({})
    first, second = seen["calls"]
    assert seen["torch"] is False and first["returned"] is None
    assert first == second
    environ = first["environ"]
    linux, glibc = sys.platform.startswith("linux"), platform.libc_ver()[0] == "glibc"
    assert environ["PYTORCH_CUDA_ALLOC_CONF"] == ("expandable_segments:True" if linux else None)
    assert environ["OMP_WAIT_POLICY"] == "PASSIVE"
    heap = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20), "MALLOC_ARENA_MAX": "1"}
    assert {name: environ[name] for name in heap} == (heap if glibc else dict.fromkeys(heap))
    assert environ["HEADINFER_PIN_LIMIT"] is None  # not Windows-shaped: no pin limit, the start method untouched
    assert first["start"] is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="expandable segments are set on Linux only")
def test_prepare_process_keeps_the_users_choices_and_appends_once():
    user = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512", "OMP_WAIT_POLICY": "ACTIVE", "MALLOC_ARENA_MAX": "4"}
    first, second = _prepared(user)["calls"]
    assert first == second
    assert first["environ"]["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512,expandable_segments:True"
    assert first["environ"]["OMP_WAIT_POLICY"] == "ACTIVE"
    assert first["environ"]["MALLOC_ARENA_MAX"] == "4" and first["environ"]["MALLOC_TRIM_THRESHOLD_"] is None


def test_prepare_process_makes_the_windows_shape_when_asked():
    first, second = _prepared({"HEADINFER_WINDOWS_SHAPED": "1"})["calls"]
    assert first == second
    assert first["start"] == "spawn" and first["environ"]["HEADINFER_PIN_LIMIT"] == "64MiB"
    first, _ = _prepared({"HEADINFER_WINDOWS_SHAPED": "1", "HEADINFER_PIN_LIMIT": "1GiB"})["calls"]
    assert first["environ"]["HEADINFER_PIN_LIMIT"] == "1GiB"
