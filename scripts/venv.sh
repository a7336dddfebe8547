#!/usr/bin/env bash
# Source it: a virtual environment with torch and the build/test tools (no
# torchext), created or completed when needed. Leaves $PY and $VENV set.
# Used by scripts/setup_env.sh (which then builds torchext in place) and by
# scripts/test_wheel.sh (which installs a wheel over it instead).
#
#   TORCH_VERSION  torch to install (default 2.14.1: the CUDA 13.0 build,
#                  so the CUDA kernels compile too; 2.13.0 is the CPU build)
#   VENV           where the environment lives (default .venv-$TORCH_VERSION)
#   PYTHON_BIN     the Python that creates it (default python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TORCH_VERSION=${TORCH_VERSION:-2.14.1}
VENV=${VENV:-.venv-$TORCH_VERSION}
PYTHON_BIN=${PYTHON_BIN:-python3}
# What the tests need besides torch (numpy: torch.distributed.checkpoint, used
# by the distributed tests); ninja builds torchext.
TORCHEXT_TEST_PACKAGES="pytest expecttest numpy"

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "$PYTHON_BIN" -m venv "$VENV"
fi
PY="$PWD/$VENV/bin/python"
if ! "$PY" -c "import torch, sys, numpy, pytest, expecttest, ninja; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  echo "== installing torch==$TORCH_VERSION and tools into $VENV"
  "$PY" -m pip install -q --upgrade pip setuptools wheel
  # shellcheck disable=SC2086
  "$PY" -m pip install -q "torch==$TORCH_VERSION" ninja $TORCHEXT_TEST_PACKAGES
fi
