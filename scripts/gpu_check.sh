#!/usr/bin/env bash
# One-shot check on a machine with an NVIDIA GPU, as such a machine is: no
# package index needed. It uses the Python that already has a CUDA torch
# ($PYTHON, default python3), builds torchext in place for this GPU's arch
# only (no venv, nothing downloaded), then runs, each step logged to $OUT:
#   - the CUDA pytest tests (opcheck on CUDA, sync-debug mode, bit-for-bit
#     equality with torch.optim.ASGD on the GPU, CUDA graphs, reduce-overhead;
#     tests/ops/test_cuda_launch_layouts.py: a step and a tensor_norms call
#     captured in a CUDA graph in the classic 4 KB and the large 32 KB
#     kernel-parameter layout, replayed and compared bit for bit with eager,
#     and each layout's launch count; tensor_norms' CUDA kernel against the
#     CPU kernel, every order); tests that need expecttest skip, saying so,
#     where it is missing;
#   - `python -m torchext check --device cuda` (every op against torch, and
#     the bad-input table: clear errors, nothing written). A crash (a signal,
#     not an exception) is caught: the same command runs again under
#     `cuda-gdb -batch -ex run -ex bt` and its backtrace is kept in
#     $OUT/check_crash_backtrace.log;
#   - `python -m torchext bench --device cuda --only asgd,amp,gpu_targets`
#     (% of the bandwidth bound per case; JSON in $OUT/bench.json), then
#     `--only gpu_targets` again with TORCHEXT_CUDA_GRAPH_LARGE_PARAMS=1 (the
#     captured step in the large layout; $OUT/bench_graph_large.json);
#   - `bench --device cuda --only clip` on its own, its report printed whole
#     ($OUT/bench_clip.json): the fused clip phase against the phase without
#     clipping and against torch's recipe at 200 x 50k and 10000 x 100, and
#     the tensor_norms kernel's bytes/s against a copy's (and against the
#     composite kernel's two reads);
#   - compute-sanitizer memcheck over every op on CUDA (`torchext check`),
#     where the tool exists;
#   - the ctest suites with the CUDA kernels (cuda_on_host; cuda_on_device,
#     cpp_tests/test_cuda_on_device.cpp: the real kernels bit for bit against
#     the CPU kernels; tensor_norms within its stated tolerance of them and
#     bit for bit against the host runner), where CMake and GoogleTest exist (GTEST_ROOT may point
#     at an unpacked libgtest-dev);
#     built in the background while the Python steps run;
#   - with GPU_CHECK_COMPILE=1, also the compiled-training matrix (minutes).
# It ends with one summary line. Without a GPU it says so and exits 1.
# About 5-6 minutes on one H200 with 16 cores.
#
#   bash scripts/gpu_check.sh                  # logs in gpu_check/ (or $OUT)
# Env: PYTHON, OUT, STEP_TIMEOUT (seconds per step, default 600), GTEST_ROOT,
#      GPU_CHECK_COMPILE, GPU_CHECK_BENCH=0 (no benchmark).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-gpu_check}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=$(command -v "${PYTHON:-python3}") || { echo "gpu_check: no ${PYTHON:-python3}"; exit 1; }
start=$SECONDS

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU found (nvidia-smi missing or sees no device)."
  echo "gpu_check: nothing was run; use scripts/test.sh on a CPU-only machine."
  exit 1
fi
if ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  echo "gpu_check: $PY has no CUDA torch (set PYTHON to one that has)."
  exit 1
fi
# This GPU's compute capability, e.g. 9.0 (nvidia-smi; torch asks the same driver).
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' ')
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
TORCH=$("$PY" -c 'import torch; print(torch.__version__)')
echo "gpu_check: $GPU (compute capability $CAP), torch $TORCH, $($PY --version), $(nproc) cores"
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda; fi
export TORCHEXT_CUDA=1 TORCH_CUDA_ARCH_LIST=$CAP MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1

declare -a NAMES RESULTS
record() {  # record NAME T0 RC
  local rc=$3
  if [ "$rc" = 0 ]; then RESULTS+=("PASS")
  elif [ "$rc" = 124 ]; then RESULTS+=("FAIL (timed out after $STEP_TIMEOUT s)")
  elif [ "$rc" -gt 128 ]; then RESULTS+=("FAIL (killed by signal $((rc - 128)))")
  else RESULTS+=("FAIL (rc $rc)"); fi
  NAMES+=("$1 ($((SECONDS - $2)) s)")
}
step() {  # step NAME COMMAND...: runs it with a timeout, logs to $OUT/NAME.log
  local name=$1; shift
  local t0=$SECONDS rc
  echo "== $name: $*"
  timeout -k 10 "$STEP_TIMEOUT" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  record "$name" "$t0" "$rc"
  tail -n 12 "$OUT/$name.log"
  return $rc
}
skip() {  # skip NAME WHY
  NAMES+=("$1"); RESULTS+=("SKIP ($2)")
  echo "== $1: skipped ($2)"
}

# --- Build in place, with this machine's compilers and torch (no index) ---
if ! step build bash -c "'$PY' -m pip install --no-build-isolation --no-deps --no-index -e . ||
    { echo 'pip install -e failed; building with setup.py build_ext --inplace';
      '$PY' setup.py build_ext --inplace; }"; then
  echo "gpu_check: FAILED (the build failed; see $OUT/build.log)"
  exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
step info "$PY" -m torchext info

# --- ctest, built in the background while the Python steps run ---
GTEST_OK=0 CMAKE_EXTRA=""
if [ -n "${GTEST_ROOT:-}" ] && [ -f "$GTEST_ROOT/include/gtest/gtest.h" ]; then
  GTEST_OK=1 CMAKE_EXTRA="-DGTEST_ROOT=$GTEST_ROOT"
  for d in "$GTEST_ROOT"/lib/*/cmake/GTest "$GTEST_ROOT"/lib/cmake/GTest; do
    [ -f "$d/GTestConfig.cmake" ] && CMAKE_EXTRA="-DGTest_DIR=$d"
  done
elif [ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ]; then GTEST_OK=1; fi
CTEST_WHY=""
command -v cmake >/dev/null || CTEST_WHY="cmake not installed"
[ $GTEST_OK = 1 ] || CTEST_WHY="${CTEST_WHY:+$CTEST_WHY, }GoogleTest not installed (set GTEST_ROOT)"
BUILD_DIR=${BUILD_DIR:-$PWD/cpp_build}
if [ -z "$CTEST_WHY" ]; then
  ctest_t0=$SECONDS
  # Configures and builds only; the run waits for the Python steps.
  (CTEST_ARGS="-N" PYTHON="$PY" BUILD_DIR="$BUILD_DIR" TORCHEXT_CUDA=1 JOBS=$(( $(nproc) / 2 )) \
     CMAKE_EXTRA="$CMAKE_EXTRA" \
     timeout -k 10 "$STEP_TIMEOUT" bash scripts/cpp_tests.sh > "$OUT/ctest_build.log" 2>&1
   echo $? > "$OUT/.ctest_build_rc") &
  CTEST_PID=$!
fi

# --- The CUDA tests ---
XDIST=()
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n 4)
step pytest_cuda "$PY" -m pytest tests -q -ra -p no:cacheprovider "${XDIST[@]}" \
  -k "cuda or reduce_overhead or graph or capturable"

# --- Every op against torch, and bad input, on CUDA; a crash gets a backtrace ---
step check "$PY" -m torchext check --device cuda
crc=$?
if [ $crc -gt 128 ] && [ $crc != 137 ]; then  # a signal (SIGSEGV: 139), not a failed check
  if command -v cuda-gdb >/dev/null; then
    step check_crash_backtrace cuda-gdb -batch -ex run -ex bt -ex "info sharedlibrary" \
      --args "$PY" -m torchext check --device cuda
  else
    skip check_crash_backtrace "cuda-gdb not installed"
  fi
fi

if [ "${GPU_CHECK_BENCH:-1}" = 1 ]; then
  step bench "$PY" -m torchext bench --device cuda --only asgd,amp,gpu_targets --json "$OUT/bench.json"
  step bench_clip "$PY" -m torchext bench --device cuda --only clip --json "$OUT/bench_clip.json" &&
    grep -v '^|--' "$OUT/bench_clip.log" | sed -n '/^clip_grad_norm_ alone/,$p'
  # Captured launches fall back to the 4 KB layout unless told (csrc/ops/cuda/launch.cuh).
  step bench_graph_large env TORCHEXT_CUDA_GRAPH_LARGE_PARAMS=1 \
    "$PY" -m torchext bench --device cuda --only gpu_targets --json "$OUT/bench_graph_large.json"
else
  skip bench "GPU_CHECK_BENCH=0"
fi

SANITIZER=$(command -v compute-sanitizer || true)
for c in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
         "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer"; do
  [ -z "$SANITIZER" ] && [ -x "$c" ] && SANITIZER=$c
done
if [ -n "$SANITIZER" ]; then
  # Every op on CUDA (unaligned slices, empty tensors, lists spanning
  # launches, packed state, bad input) under memcheck.
  step memcheck "$SANITIZER" --tool memcheck --error-exitcode 1 --leak-check no \
    "$PY" -m torchext check --device cuda
else
  skip memcheck "compute-sanitizer not installed"
fi

if [ "${GPU_CHECK_COMPILE:-0}" = 1 ]; then
  step bench_compile "$PY" -m torchext.bench.compile --device cuda \
    --models mlp-64,mlp-256 --recipes torchext,torch-split,torchext-cudagraphs,torchext-fullgraph \
    --timeout 300 --ab-with torch-split,torchext-cudagraphs --json "$OUT/bench_compile.json"
fi

if [ -n "$CTEST_WHY" ]; then
  skip ctest "$CTEST_WHY"
else
  wait "$CTEST_PID"
  brc=$(cat "$OUT/.ctest_build_rc" 2>/dev/null || echo 1)
  record ctest_build "$ctest_t0" "$brc"
  tail -n 5 "$OUT/ctest_build.log"
  if [ "$brc" = 0 ]; then
    step ctest ctest --test-dir "$BUILD_DIR" --output-on-failure -j 4
  fi
fi

echo
echo "== gpu_check summary ($GPU, compute capability $CAP, torch $TORCH, logs in $OUT/)"
fail=0; skipped=0
for i in "${!NAMES[@]}"; do
  printf '  %-32s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
  case "${RESULTS[$i]}" in PASS) ;; SKIP*) skipped=$((skipped + 1)) ;; *) fail=$((fail + 1)) ;; esac
done
if [ $fail = 0 ]; then
  echo "gpu_check: PASSED (${#NAMES[@]} steps, $skipped skipped, $((SECONDS - start)) s)"
else
  echo "gpu_check: FAILED ($fail of ${#NAMES[@]} steps failed, $skipped skipped, $((SECONDS - start)) s; see $OUT/*.log)"
fi
[ $fail = 0 ]
