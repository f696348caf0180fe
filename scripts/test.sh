#!/usr/bin/env bash
# Sets up a virtual environment and runs the whole test suite (CPU; GPU tests skip without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# The tests need no GPU: take the CPU build of torch first (much smaller) unless one is installed already, from
# PyTorch's CPU index or a local wheel (find-links); PyPI's own torch (a CUDA build on Linux) only where it is not found.
.venv/bin/python -c "import torch" 2>/dev/null \
  || .venv/bin/pip install -q "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu \
  || .venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -r requirements-dev.txt
# The browser test drives the system Chromium (no browser download).
if [ ! -x /usr/bin/chromium ]; then
  (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)) \
    || sudo apt-get install -y -q chromium
fi
# Two workers or more (pytest-xdist, one torch thread each: tests/conftest.py): most tests wait on one core, a browser
# or a server; at most four, since each worker loads its own models. HEADINFER_TEST_WORKERS=0 runs in one process.
workers="${HEADINFER_TEST_WORKERS:-$(( $(nproc) < 2 ? 2 : ($(nproc) > 4 ? 4 : $(nproc)) ))}"
if [ "$workers" = "0" ]; then
  .venv/bin/python -m pytest -q "$@"
else
  .venv/bin/python -m pytest -q -n "$workers" --dist worksteal "$@"
fi
# Then, for the whole suite, the Windows-shaped run (issue 50, docs/windows.md): spawn, no compiler, no hard links, a
# pin limit and NTFS names over the end-to-end tests, a few minutes.
[ "$#" -gt 0 ] || ./scripts/test_windows_shaped.sh
