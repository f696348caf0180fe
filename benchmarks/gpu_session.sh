#!/usr/bin/env bash
# One device call, every GPU step (benchmarks/gpu/gpu_all.py), on a bare machine that has only torch and transformers.
#
#   bash benchmarks/fetch_gpu_wheels.sh                    # here, once: fills wheels/ (git-ignored)
#   on the GPU machine, from a copy of this checkout with wheels/ (one command of at most 10 minutes):
#     bash benchmarks/gpu_session.sh                       # results in $OUT (else docs/benchmarks/runs/<today>/):
#                                                          # gpu.json, gpu.md, summary.md, logs (docs/benchmarks/method.md)
#   bash benchmarks/gpu_session.sh --device cpu --model tiny --out /tmp/smoke   # the plumbing on a CPU, minutes
#
# Installs from wheels/ only what fails to import there, then runs the steps in order of value, each with its
# own cap, all within BENCH_DEADLINE_S (540 s on a GPU: 9 minutes, from this script's start). Each result lands
# in gpu.json as it is measured, so a call cut short keeps every step that finished, and the summary table is
# printed from gpu.json even then. At most 8 files come back from $OUT: this writes 6 (plots are made here
# afterwards: python -m benchmarks.harness.run --report-only --out DIR).
set -u -o pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
device=cuda model=llama3-8b out=${OUT:-} extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
if [ "$device" = cpu ]; then  # the smoke run: tiny sizes, a slow shared CPU, no pytest workers
  out=${out:-/tmp/headinfer-gpu-smoke}; deadline=${BENCH_DEADLINE_S:-1800}
  extra=(--scale 0.002 --test-workers 0 --cap-scale 3 "${extra[@]}")
else
  out=${out:-docs/benchmarks/runs/$(date -u +%F)}; deadline=${BENCH_DEADLINE_S:-540}  # a run's files stay together
fi
mkdir -p "$out"
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
export PYTHONUNBUFFERED=1 TORCH_CUDNN_SDPA_DEPRIORITIZED=1 HEADINFER_BENCH_DISK_DIR=${HEADINFER_BENCH_DISK_DIR:-/tmp}

# The wheels a bare machine may lack: "module wheel-name" pairs, each installed only where its import fails.
missing=()
while read -r module wheel; do
  "$python" -c "import $module" </dev/null 2>/dev/null && continue
  found=(wheels/"$wheel"-*.whl)
  if [ -e "${found[0]}" ]; then missing+=("${found[@]}"); else echo "missing: $module (no wheels/$wheel-*.whl)"; fi
done <<'EOF'
gguf gguf
yaml pyyaml
tqdm tqdm
isal isal
psutil psutil
pynvml nvidia_ml_py
safetensors safetensors
pytest pytest
pluggy pluggy
iniconfig iniconfig
packaging packaging
xdist pytest_xdist
execnet execnet
pytest_timeout pytest_timeout
bitsandbytes bitsandbytes
EOF
if [ ${#missing[@]} -gt 0 ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/headinfer-site \
    "${missing[@]}" && export PYTHONPATH=/tmp/headinfer-site${PYTHONPATH:+:$PYTHONPATH}
  echo "installed: ${missing[*]##*/}"
fi

{
  echo "[+$((SECONDS - started))s] env"
  nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  free -g | head -2
  echo "$(nproc) cores, git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  "$python" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} 2>&1 | tee "$out/session.log"

left=$(( deadline - (SECONDS - started) - 10 ))  # 10 s kept for the summary after a kill
timeout -k 5 "$left" "$python" -m benchmarks.gpu.gpu_all --out "$out" --device "$device" --model "$model" \
  --deadline-s $(( left - 5 )) "${extra[@]}" 2>&1 | grep --line-buffered -v " DEBUG " | tee -a "$out/session.log"
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then  # killed or crashed before its own summary: the table from what gpu.json holds
  echo "[+$((SECONDS - started))s] gpu_all ended with status $status; the summary from $out/gpu.json:" | tee -a "$out/session.log"
  "$python" -m benchmarks.gpu.gpu_summary --out "$out" 2>&1 | tee -a "$out/session.log"
fi
echo "[+$((SECONDS - started))s] done" | tee -a "$out/session.log"
