"""Native code tried once in a child process before the server calls it: a crash there costs a child, not the server.

A native kernel (ours, built with ``-march=native``, or a private torch op) can kill the process on a CPU nobody
tested it on: a segfault or an illegal instruction is not an exception, and it would end every visitor's session.
``survives(name, target)`` runs ``target`` (``"package.module:function"``, a function that exercises the kernel on
the cases the server will call it with and checks its results) in a child Python with the parent's import path,
and reports whether it exited cleanly. The answer is kept on disk under the kernels cache, once per
(name, CPU model and flags, ``key``): the caller's key names what else decides the code that runs (torch's version,
the vector width it picked, the build's flags). A probe that runs past its time limit is not remembered (a loaded
machine can be slow) and counts as a failure for this process.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .library import cpu_identity
from .trusted import child_env, kernel_folder

logger = logging.getLogger(__name__)

TIMEOUT_S = 300  # a child imports torch and runs a few small products: seconds; minutes only on a starved machine


def survives(name: str, target: str, key: tuple[str, ...] = ()) -> bool:
    """Whether ``target`` ran to a clean exit in a child process (remembered on disk per ``name``, CPU and ``key``)."""
    record = _record_path(name, target, key)
    try:
        return bool(json.loads(record.read_text())["survives"])
    except (OSError, ValueError, KeyError):
        pass
    outcome = _run_child(target)
    if outcome is None:
        return False
    ok, detail = outcome
    if ok:
        logger.info("native probe %s: ran cleanly", name)
    else:
        logger.warning("native probe %s: the child process failed (%s); a fallback path runs instead", name, detail)
    record.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=record.parent, delete=False, suffix=".tmp") as file:
        json.dump({"name": name, "target": target, "key": list(key), "survives": ok, "detail": detail}, file)
    os.replace(file.name, record)  # atomic: a concurrent probe of the same key writes the same answer
    return ok


def _run_child(target: str) -> tuple[bool, str] | None:
    """(exited cleanly, why not), or None when the child ran past ``TIMEOUT_S``."""
    module, _, function = target.partition(":")
    code = f"import importlib; importlib.import_module({module!r}).{function}()"
    # The parent's import path, so that the child finds the same engine (and a test's own module) as the parent.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path), **child_env())
    try:
        done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        logger.warning("native probe %s: no answer in %d s; a fallback path runs in this process", target, TIMEOUT_S)
        return None
    if done.returncode == 0:
        return True, ""
    signal = f"signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
    return False, f"{signal}: {done.stderr.strip()[:300]}"  # faulthandler: the error, then the frames


def _record_path(name: str, target: str, key: tuple[str, ...]) -> Path:
    digest = hashlib.sha256("\0".join([target, cpu_identity(), sys.version, *key]).encode()).hexdigest()[:16]
    return kernel_folder() / "probes" / f"{name}-{digest}.json"
