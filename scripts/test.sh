#!/usr/bin/env bash
# The whole test suite, Python and C++, from a fresh machine:
#   bash scripts/test.sh                       # torch 2.14.1 (CUDA build)
#   TORCH_VERSION=2.13.0 bash scripts/test.sh  # torch 2.13.0 (CPU build)
# CUDA tests skip cleanly when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
echo "== Python tests (torch $TORCH_VERSION)"
"$PY" -m pytest tests -q -ra
echo "== C++ tests (torch $TORCH_VERSION)"
# They need CMake and GoogleTest (Debian's libgtest-dev).
if ! [ -f /usr/include/gtest/gtest.h ] || ! command -v cmake >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libgtest-dev cmake >/dev/null
fi
PYTHON="$PY" bash scripts/cpp_tests.sh
