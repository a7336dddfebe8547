#!/usr/bin/env bash
# One-shot check on a machine with an NVIDIA GPU (about 5-10 minutes on one
# GPU): builds torchext for this GPU's arch only, runs the CUDA pytest tests,
# the ctest suites (CUDA on), `python -m torchext check --device cuda` and
# `python -m torchext bench --device cuda --quick --json`, then prints one
# summary. Without a GPU it says so and exits 1.
#
#   bash scripts/gpu_check.sh            # results in gpu_check/ (log per step, bench.json)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-gpu_check}
mkdir -p "$OUT"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU found (nvidia-smi missing or sees no device)."
  echo "gpu_check: nothing was run; use scripts/test.sh on a CPU-only machine."
  exit 1
fi
# This GPU's compute capability, e.g. 9.0 (nvidia-smi; torch asks the same driver).
CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' ')
echo "gpu_check: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1), compute capability $CC"

export TORCHEXT_CUDA=1 TORCH_CUDA_ARCH_LIST=$CC
source scripts/setup_env.sh || { echo "gpu_check: environment/build failed"; exit 1; }

declare -a NAMES RESULTS
step() {  # step NAME COMMAND...: runs it, logs to $OUT/NAME.log, records PASS/FAIL and time
  local name=$1; shift
  local t0=$SECONDS
  echo "== $name: $*"
  if "$@" > "$OUT/$name.log" 2>&1; then RESULTS+=("PASS"); else RESULTS+=("FAIL (rc $?)"); fi
  NAMES+=("$name ($((SECONDS - t0)) s)")
  tail -n 15 "$OUT/$name.log"
}

step gpu_visible "$PY" -c "import torch, torchext, sys; sys.exit(not (torch.cuda.is_available() and torchext.has_cuda_kernels()))"
step info "$PY" -m torchext info
# The CUDA tests: opcheck on CUDA, sync-debug mode, CUDA graphs, reduce-overhead, apex O1.
step pytest_cuda "$PY" -m pytest tests -q -ra -k "cuda or reduce_overhead"
step ctest env PYTHON="$PY" TORCHEXT_CUDA=1 JOBS="$(nproc)" bash scripts/cpp_tests.sh
step check "$PY" -m torchext check --device cuda
step bench "$PY" -m torchext bench --device cuda --quick --json "$OUT/bench.json"

echo
echo "== gpu_check summary (GPU compute capability $CC, logs in $OUT/)"
fail=0
for i in "${!NAMES[@]}"; do
  printf '  %-28s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
  [ "${RESULTS[$i]}" = PASS ] || fail=1
done
[ $fail = 0 ] && echo "gpu_check: all passed" || echo "gpu_check: FAILED (see $OUT/*.log)"
exit $fail
