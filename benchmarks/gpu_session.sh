#!/usr/bin/env bash
# One device call: every GPU measurement in one process with a global deadline (benchmarks/gpu_all.py).
#
#   bash benchmarks/gpu_session.sh        # on the GPU machine; results in $OUT (default docs/benchmarks)
#
# Each result lands in $OUT/gpu.json as soon as it is measured, so a killed call loses nothing; copy
# $OUT/gpu.json, gpu.md and the plots into docs/benchmarks/ afterwards. At most 8 files come back from $OUT.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/benchmarks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDNN_SDPA_DEPRIORITIZED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  free -g | head -2
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} 2>&1 | tee "$OUT/session.log"
timeout -k 10 "${BENCH_DEADLINE_S:-560}" python3 -m benchmarks.gpu_all --out "$OUT" \
  --deadline-s $(( ${BENCH_DEADLINE_S:-560} - 20 )) 2>&1 | tee -a "$OUT/session.log" | grep -v " DEBUG "
