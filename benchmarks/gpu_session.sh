#!/usr/bin/env bash
# One GPU session of the benchmarks: every piece in priority order, each resumable, within a time budget.
#
#   bash benchmarks/gpu_session.sh            # on the GPU machine; results in $OUT (default docs/benchmarks)
#
# The device tool runs a command for at most 10 minutes, so one call does what fits in BENCH_BUDGET_S
# (default 560 s) and later calls resume: copy $OUT/gpu.json (and the other files) back into docs/benchmarks/
# between calls; this script seeds $OUT from docs/benchmarks/gpu.json, and every piece skips what is recorded.
# Order: GPU parity tests (pytest -m gpu, recorded once), ceilings, short prefill, decode, max context,
# GPU peak vs context, profiler overlap, long prefill. At most 8 files come back from $OUT: gpu.json, gpu.md,
# gpu-{prefill,decode,peak}.png, profile.txt, session.log.
set -u -o pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-docs/benchmarks}
export OUT
BUDGET_S=${BENCH_BUDGET_S:-560}
PY=${PYTHON:-python3}
BENCH_GIB=${BENCH_BUDGET_GIB:-24}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG="$OUT/session.log"
START=$(date +%s)

left() { echo $((BUDGET_S - ($(date +%s) - START))); }

if [ ! -f "$OUT/gpu.json" ] && [ -f docs/benchmarks/gpu.json ] && [ "$OUT" != docs/benchmarks ]; then
  cp docs/benchmarks/gpu.json "$OUT/gpu.json"  # resume from what earlier sessions recorded
fi

{
  echo "== $(date -u +%FT%TZ) gpu_session: budget ${BUDGET_S}s, GPU budget ${BENCH_GIB} GiB, out $OUT"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  free -g | head -2
  $PY -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} 2>&1 | tee -a "$LOG"

# piece NAME CAP_SECONDS ARGS... : one resumable python process, given min(CAP, what is left) seconds.
piece() {
  local name=$1 cap=$2
  shift 2
  local remaining
  remaining=$(left)
  local t=$((remaining < cap ? remaining : cap))
  if [ "$t" -lt 60 ]; then
    echo "== skip $name: ${remaining}s left" | tee -a "$LOG"
    return 0
  fi
  echo "== $(date -u +%T) piece $name (${t}s)" | tee -a "$LOG"
  # The process stops starting work 20 s before its budget; timeout is the backstop (records so far are kept).
  timeout -k 10 "$t" $PY -m benchmarks.run --out "$OUT" --resume --budget-gib "$BENCH_GIB" \
    --budget-s $((t - 20)) --time-limit $((t - 40)) "$@" 2>&1 | tee -a "$LOG"
  echo "== piece $name exit ${PIPESTATUS[0]}" | tee -a "$LOG"
}

# 1. GPU parity (tiny configs of every family, fp32 and bf16; Llama-3-8B-shaped peak test), recorded once.
if ! $PY -m benchmarks.run --out "$OUT" --is-done parity >/dev/null 2>&1; then
  t=$(left); t=$((t < 300 ? t : 300))
  echo "== $(date -u +%T) parity tests (${t}s)" | tee -a "$LOG"
  timeout -k 10 "$t" $PY -m pytest -m gpu tests/engine/test_gpu_parity.py -q -p no:cacheprovider \
    --junitxml=/tmp/gpu-parity.xml 2>&1 | tail -40 | tee -a "$LOG"
  if [ -f /tmp/gpu-parity.xml ]; then
    $PY -m benchmarks.run --out "$OUT" --record-junit /tmp/gpu-parity.xml 2>&1 | tail -3 | tee -a "$LOG"
  fi
fi

# 2. Ceilings: link each way and both, matmul and attention rates, pinned host memory.
piece ceilings 180 --phases ceilings
# 3. Short prefill, every mode (ratios to standard where it fits).
piece prefill-short 420 --phases prefill --lengths 1K,10K,20K,40K
# 4. Decode on random-filled caches up to 512K (chunked decodes exactly like standard: not repeated).
piece decode-baselines 420 --phases decode --modes standard,layerwise,headinfer-adaptive
piece decode-headwise 540 --phases decode --modes headinfer-g8,headinfer-g4,headinfer-g2,headinfer-g1
# 5. Largest context per mode under the budget.
piece max-context-baselines 420 --phases max-context --modes standard,chunked,layerwise
piece max-context-headwise 540 --phases max-context --modes headinfer
# 6. GPU peak vs context for head-wise, next to the planner; 7. copy/compute overlap.
piece peak 540 --phases peak
piece profile 180 --phases profile
# 8. Long prefill, as far as time allows (each piece resumes where the last stopped).
piece prefill-long-adaptive 540 --phases prefill --lengths 100K,200K,400K --modes headinfer-adaptive
piece prefill-long-g1 540 --phases prefill --lengths 100K,200K,400K --modes headinfer-g1
piece prefill-long-others 540 --phases prefill --lengths 100K,200K \
  --modes layerwise,headinfer-g8,headinfer-g4,headinfer-g2

$PY -m benchmarks.run --out "$OUT" --report-only 2>&1 | tail -3 | tee -a "$LOG"
echo "== $(date -u +%T) done, $(left)s of ${BUDGET_S}s left" | tee -a "$LOG"
