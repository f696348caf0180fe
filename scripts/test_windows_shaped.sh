#!/usr/bin/env bash
# The Windows-shaped run (issue 50): this Linux machine makes a Windows PC's choices together (HEADINFER_WINDOWS_SHAPED=1:
# spawn for every child process and no fork, no C compiler, no hard links, a 64 MiB pin limit, NTFS names; see
# docs/windows.md) over the app's end-to-end tests, the shaped mode's own tests (MSVC's cl, long paths, Ctrl+C among
# them) and a slice of the emulated-streams grid (the disk tier, the pin limit). CI runs it after scripts/test.sh (.ci/run); arguments replace the default
# selection. Needs the environment scripts/test.sh sets up.
set -euo pipefail
cd "$(dirname "$0")/.."
export HEADINFER_WINDOWS_SHAPED=1 HEADINFER_CPU_MODEL=embedded
# One cache for the run, warmed as launch.py's start warms it: the model converted and its retrieval heads found
# (on the torch paths that calibration takes minutes on a busy 2-core machine, past a first answer's wait).
cache="$(mktemp -d -t headinfer-windows-shaped-XXXXXX)"
trap 'rm -rf "$cache"' EXIT
export HEADINFER_CACHE="$cache" HEADINFER_TEST_CACHE="$cache"
.venv/bin/python -c "from engine import load_model, warm_up; warm_up(*load_model(None)).join()" 2>/dev/null
if [ "$#" -gt 0 ]; then
  .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
  exit
fi
grid="llama-gqa-disk-split-1 or llama-gqa-pin-limit-1"
.venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist worksteal \
  tests/engine/test_windows_shaped.py tests/app/test_ntfs_names.py tests/e2e/test_browser.py tests/e2e/test_shelf.py \
  tests/engine/test_msvc_build.py tests/engine/test_long_paths.py tests/engine/test_ctrl_c.py \
  tests/engine/kv/test_streams_grid.py -k "not test_emulated_streams_match_stock_with_no_race or $grid"
