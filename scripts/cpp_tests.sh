#!/usr/bin/env bash
# Builds torchext's C++ library, example and GoogleTest tests with CMake, writes
# the Python reference data, and runs ctest. Run from anywhere, after the
# Python extension is built in place (pip install --no-build-isolation -e .).
#
#   PYTHON=.venv/bin/python scripts/cpp_tests.sh
#
# Env: PYTHON (default python3: must import torch and, from the repo root,
# torchext), BUILD_DIR (default cpp_build), JOBS (default 2),
# TORCHEXT_CUDA (default 0: CUDA kernels take minutes to compile; 1 builds them),
# CTEST_ARGS (extra ctest arguments, e.g. "-R asgd"), CMAKE_EXTRA (extra configure
# arguments, e.g. -DGTest_DIR=... for an unpacked GoogleTest).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
PYTHON=$(command -v "$PYTHON") || { echo "cpp_tests.sh: no Python at '$PYTHON'"; exit 1; }
# Absolute, but not through symlinks (a venv's python is a symlink to the base one).
case "$PYTHON" in /*) ;; *) PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" ;; esac
BUILD_DIR=${BUILD_DIR:-$ROOT/cpp_build}
JOBS=${JOBS:-2}
case "${TORCHEXT_CUDA:-0}" in 1|on|ON|true|yes) CUDA_FLAG=ON ;; *) CUDA_FLAG=OFF ;; esac
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

start=$(date +%s)
stamp() { echo "[cpp_tests] $(( $(date +%s) - start ))s: $*"; }

TORCH_PREFIX=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')
TORCH_VERSION=$("$PYTHON" -c 'import torch; print(torch.__version__)')
stamp "torch $TORCH_VERSION ($PYTHON), CUDA kernels $CUDA_FLAG, build dir $BUILD_DIR"

GEN=()
command -v ninja > /dev/null && GEN=(-G Ninja)
if [ -f "$BUILD_DIR/CMakeCache.txt" ] &&
   ! grep -qx "TORCHEXT_PYTHON:[A-Z]*=$PYTHON" "$BUILD_DIR/CMakeCache.txt"; then
  # Configured for another Python (another torch): configure and build afresh.
  rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles"
fi
mkdir -p "$BUILD_DIR"
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then GEN_ARGS=("${GEN[@]}"); else GEN_ARGS=(); fi
cmake -S "$ROOT" -B "$BUILD_DIR" "${GEN_ARGS[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DTORCHEXT_CUDA=$CUDA_FLAG \
  -DTORCHEXT_BUILD_TESTS=ON -DTORCHEXT_BUILD_EXAMPLES=ON \
  -DTORCHEXT_PYTHON="$PYTHON" -DTORCHEXT_REF_DIR="$BUILD_DIR/cpp_ref" ${CMAKE_EXTRA:-} > "$BUILD_DIR/configure.log" 2>&1 ||
  { cat "$BUILD_DIR/configure.log"; exit 1; }
stamp "configured"
cmake --build "$BUILD_DIR" -j "$JOBS"
stamp "built"

# Reference data from PyTorch itself (TorchScript module, AOTI package, ...).
(cd "$ROOT" && "$PYTHON" -W ignore cpp_tests/make_reference.py "$BUILD_DIR/cpp_ref")
stamp "reference data written"

cd "$BUILD_DIR"
# shellcheck disable=SC2086
ctest --output-on-failure ${CTEST_ARGS:-}
stamp "done"
