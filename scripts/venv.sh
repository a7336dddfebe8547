#!/usr/bin/env bash
# Source it: a virtual environment with torch and the build/test tools (no
# torchext), created or completed when needed. Leaves $PY and $VENV set.
# Used by scripts/setup_env.sh (which then builds torchext in place) and by
# scripts/test_wheel.sh (which installs a wheel over it instead).
#
#   TORCH_VERSION  torch to install. Default 2.15.0, the newest supported
#                  (requirements-dev.txt); any release from 2.11 to 2.15
#                  (2.11.0, 2.12.1, 2.13.0+cu130, 2.14.1, 2.15.0: docs/install.md),
#                  as pip gives it: the CUDA build (cu130; cu132 for 2.15.0), so
#                  the CUDA kernels compile too. 2.13.0 alone is the CPU build
#                  this machine keeps on disk for Python 3.11; 2.13.0+cu130 the
#                  CUDA one. A version with a +variant must be exactly that build.
#   VENV           where the environment lives (default .venv-$TORCH_VERSION)
#   PYTHON_BIN     the Python that creates it (default python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TORCH_VERSION=${TORCH_VERSION:-2.15.0}
VENV=${VENV:-.venv-$TORCH_VERSION}
PYTHON_BIN=${PYTHON_BIN:-python3}
# What the tests need besides torch (numpy: torch.distributed.checkpoint, used
# by the distributed tests); ninja builds torchext.
TORCHEXT_TEST_PACKAGES="pytest expecttest numpy"

TORCH_BASE=${TORCH_VERSION%%+*}
# What pip is asked for: always the plain version (PyPI's CUDA builds carry no
# +label in their metadata); a CUDA variant refuses the CPU file on this disk.
case "$TORCH_VERSION" in
  *+cpu) TORCH_SPEC="torch==$TORCH_VERSION" ;;
  *+*) TORCH_SPEC="torch==$TORCH_BASE,!=$TORCH_BASE+cpu" ;;
  *) TORCH_SPEC="torch==$TORCH_VERSION" ;;
esac
export TORCH_SPEC
# The check of an existing venv: the full version when a variant is named.
if [ "$TORCH_VERSION" = "$TORCH_BASE" ]; then
  TORCH_IS="torch.__version__.split('+')[0] == '$TORCH_VERSION'"
else
  TORCH_IS="torch.__version__ == '$TORCH_VERSION'"
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "$PYTHON_BIN" -m venv "$VENV"
fi
PY="$PWD/$VENV/bin/python"
if ! "$PY" -c "import torch, sys, numpy, pytest, expecttest, ninja; sys.exit(not ($TORCH_IS))" 2>/dev/null; then
  echo "== installing $TORCH_SPEC and tools into $VENV"
  "$PY" -m pip install -q --upgrade pip setuptools wheel
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-cache-dir "$TORCH_SPEC" ninja $TORCHEXT_TEST_PACKAGES
  "$PY" -c "import torch, sys; sys.exit(not ($TORCH_IS))" || {
    echo "venv.sh: $VENV has torch $("$PY" -c 'import torch; print(torch.__version__)'), not $TORCH_VERSION" >&2
    exit 1; }
fi
