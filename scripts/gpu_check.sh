#!/usr/bin/env bash
# One-shot check on a machine with an NVIDIA GPU (about 10-15 minutes on one
# GPU): builds torchext for this GPU's arch only, then runs
#   - the CUDA pytest tests (opcheck on CUDA, sync-debug mode, bit-for-bit
#     equality with torch.optim.ASGD(foreach=False) on the GPU, FMA policy);
#   - the ctest suites with the CUDA kernels built, among them cuda_on_host
#     (the kernels' plans and bodies on the CPU) and cuda_on_device (the same
#     cases through the real CUDA kernels, bit for bit against the CPU kernels);
#   - the CUDA-graph capture/replay and reduce-overhead tests;
#   - `python -m torchext check --device cuda`;
#   - `python -m torchext bench --device cuda --only asgd,amp` (GB/s and % of
#     the bandwidth bound per case, JSON in $OUT/bench.json), and the compiled
#     training matrix (torchext.bench.train_step, $OUT/bench_compile.json);
#   - a compute-sanitizer memcheck pass over the op tests, where the tool is
#     installed (skipped, not failed, where it is not);
# and ends with one pass/fail line. Without a GPU it says so and exits 1.
#
#   bash scripts/gpu_check.sh            # results in gpu_check/ (log per step, bench.json)
#   timeout 3600 bash scripts/gpu_check.sh
# Env: OUT (default gpu_check), STEP_TIMEOUT (seconds per step, default 1500).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-gpu_check}
STEP_TIMEOUT=${STEP_TIMEOUT:-1500}
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
BUILD_DIR=${BUILD_DIR:-$PWD/cpp_build}

declare -a NAMES RESULTS
step() {  # step NAME COMMAND...: runs it (with a timeout), logs to $OUT/NAME.log, records the result
  local name=$1; shift
  local t0=$SECONDS rc
  echo "== $name: $*"
  timeout "$STEP_TIMEOUT" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then RESULTS+=("PASS")
  elif [ $rc = 124 ]; then RESULTS+=("FAIL (timed out after $STEP_TIMEOUT s)")
  else RESULTS+=("FAIL (rc $rc)"); fi
  NAMES+=("$name ($((SECONDS - t0)) s)")
  tail -n 15 "$OUT/$name.log"
}
skip() {  # skip NAME WHY
  NAMES+=("$1"); RESULTS+=("SKIP ($2)")
  echo "== $1: skipped ($2)"
}

step gpu_visible "$PY" -c "import torch, torchext, sys; sys.exit(not (torch.cuda.is_available() and torchext.has_cuda_kernels()))"
step info "$PY" -m torchext info
# The CUDA tests: opcheck on CUDA, sync-debug mode, bit-for-bit against torch
# on the GPU, CUDA graphs, reduce-overhead, apex O1.
step pytest_cuda "$PY" -m pytest tests -q -ra -k "cuda or reduce_overhead or graph"
# All ctest suites with the CUDA kernels built (cuda_on_host and cuda_on_device among them).
step ctest env PYTHON="$PY" BUILD_DIR="$BUILD_DIR" TORCHEXT_CUDA=1 JOBS="$(nproc)" bash scripts/cpp_tests.sh
# The comparisons once more, on their own: the host runner's plans on the CPU
# and the real CUDA kernels, against the CPU kernels, bit for bit.
RUNNER="$BUILD_DIR/cpp_tests/torchext_cuda_on_host"
step cuda_vs_cpu "$RUNNER" --gtest_filter='CudaOnHost*:CudaDevice.*' --gtest_fail_if_no_test_ran
step graphs "$PY" -m pytest tests -q -ra -k "graph or reduce_overhead or capturable"
step check "$PY" -m torchext check --device cuda
step bench "$PY" -m torchext bench --device cuda --only asgd,amp --json "$OUT/bench.json"
# Compiled training (torchext/bench/train_step.py): each recipe in its own
# process, the model with mode="reduce-overhead" among them; timm and
# transformers models skip, saying so, where they are not installed.
step bench_compile "$PY" -m torchext.bench.compile --device cuda \
  --models mlp-64,mlp-256,timm --recipes torchext,torch-split,torchext-cudagraphs,torchext-fullgraph \
  --timeout 400 --ab-with torch-split,torchext-cudagraphs --json "$OUT/bench_compile.json"

SANITIZER=$(command -v compute-sanitizer || true)
for c in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
         "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer"; do
  [ -z "$SANITIZER" ] && [ -x "$c" ] && SANITIZER=$c
done
if [ -n "$SANITIZER" ]; then
  # Every op on CUDA over lists with unaligned slices, empty tensors and
  # tensors spanning launches; then the Python op tests on CUDA.
  step memcheck_ops "$SANITIZER" --tool memcheck --error-exitcode 1 --leak-check no \
    "$RUNNER" --gtest_filter='CudaDevice.*'
  step memcheck_pytest "$SANITIZER" --tool memcheck --error-exitcode 1 --leak-check no \
    --target-processes all "$PY" -m pytest tests/ops/test_ops.py tests/ops/test_asgd_packed.py -q -x -k cuda
else
  skip memcheck "compute-sanitizer not installed"
fi

echo
echo "== gpu_check summary (GPU compute capability $CC, logs in $OUT/)"
fail=0; skipped=0
for i in "${!NAMES[@]}"; do
  printf '  %-28s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
  case "${RESULTS[$i]}" in PASS) ;; SKIP*) skipped=$((skipped + 1)) ;; *) fail=1 ;; esac
done
grep -h "^cuda_on_host summary" "$OUT/cuda_vs_cpu.log" 2>/dev/null | sed 's/^/  /'
if [ $fail = 0 ]; then
  echo "gpu_check: PASSED (${#NAMES[@]} steps, $skipped skipped)"
else
  echo "gpu_check: FAILED (see $OUT/*.log)"
fi
exit $fail
