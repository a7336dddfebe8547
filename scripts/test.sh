#!/usr/bin/env bash
# The whole test suite, Python and C++, from a fresh machine:
#   bash scripts/test.sh                       # torch 2.14.1 (CUDA build)
#   TORCH_VERSION=2.13.0 bash scripts/test.sh  # torch 2.13.0 (CPU build)
# CUDA tests skip cleanly when no GPU is present.
#
# torchext is built in place (incremental: after editing a kernel this tests
# the new code), then packed into its wheel (dist/, the same objects: a
# relink), and the Python tests run against that wheel installed, with no
# compiler reachable (scripts/test_wheel.sh: `torchext info`, `check`, pytest,
# then the C++ downstream consumer built from the wheel's CMake package).
# The C++ (ctest) suite builds the library with CMake, as a LibTorch user does.
# PYTEST_ARGS passes arguments to pytest (e.g. PYTEST_ARGS="-k asgd -x").
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
echo "== wheel (torch $TORCH_VERSION)"
bash scripts/build_wheels.sh --no-sdist "$TORCH_VERSION"
WHEEL=$(ls "dist/torchext-$(cat version.txt)+torch$TORCH_VERSION."*-cp39-abi3-*.whl)
echo "== Python tests against the installed wheel (torch $TORCH_VERSION)"
bash scripts/test_wheel.sh "$WHEEL"
echo "== C++ tests (torch $TORCH_VERSION)"
# They need CMake and GoogleTest (Debian's libgtest-dev).
if ! [ -f /usr/include/gtest/gtest.h ] || ! command -v cmake >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libgtest-dev cmake >/dev/null
fi
PYTHON="$PY" bash scripts/cpp_tests.sh
