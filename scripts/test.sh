#!/usr/bin/env bash
# The whole test suite, Python and C++, from a fresh machine:
#   bash scripts/test.sh                       # torch 2.15.0, the newest (CUDA build)
#   TORCH_VERSION=2.11.0 bash scripts/test.sh        # any other from 2.11 to 2.15 (CUDA builds)
#   TORCH_VERSION=2.13.0+cu130 bash scripts/test.sh  # torch 2.13.0 (CUDA 13.0 build)
#   TORCH_VERSION=2.13.0 bash scripts/test.sh        # torch 2.13.0 (CPU build)
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

# --- The training frameworks of tests/integrations (torchext[integrations]) ---
# From PyPI, next to the pinned torch (so nothing changes torch); skipped when
# already installed. TORCHEXT_INTEGRATIONS=0 leaves them out (those tests then
# skip, saying why). With a CPU-only torch (2.13.0 here) timm and torchvision
# are left out: the torchvision wheels in reach are CUDA builds that do not
# load there, and timm imports torchvision (its tests skip, saying so).
if [ "${TORCHEXT_INTEGRATIONS:-1}" = 1 ]; then
  reqs=requirements-integrations.txt
  if "$PY" -c "import sys, torch; sys.exit(torch.version.cuda is not None)"; then
    reqs=$(mktemp) && grep -vE '^(timm|torchvision)\b' requirements-integrations.txt > "$reqs"
  fi
  if ! "$PY" - "$reqs" 2>/dev/null <<'EOF'
import importlib.metadata as md, re, sys
for line in open(sys.argv[1]):
    name = re.split(r"[<>=!~ ;\[]", line.strip(), maxsplit=1)[0]
    if name and not name.startswith("#"):
        md.version(name)  # raises when not installed
EOF
  then
    echo "== installing the integration frameworks ($reqs) into $VENV"
    "$PY" -m pip install -q --no-cache-dir "$TORCH_SPEC" -r "$reqs"
  fi
fi

# The C++ tests need CMake and GoogleTest (Debian's libgtest-dev); installed
# first, as the wheel's toolchain tests use the compilers too.
# Debian's clang (with libomp-dev: torch's headers include omp.h) is the
# second compiler the toolchain tests build the per-ISA sources with.
if ! [ -f /usr/include/gtest/gtest.h ] || ! command -v cmake >/dev/null ||
   ! command -v clang++ >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq &&
    $SUDO apt-get install -y -qq libgtest-dev cmake clang libomp-dev >/dev/null
fi
echo "== wheel (torch $TORCH_VERSION)"
bash scripts/build_wheels.sh --no-sdist "$TORCH_VERSION"
# The wheel of this build (0.1.0+torch2.13.0.cu130, not the .cpu one beside it).
WHEEL=$(ls "dist/torchext-$("$PY" -c 'import torchext; print(torchext.__version__)')-cp310-abi3-"*.whl)
echo "== Python tests against the installed wheel (torch $TORCH_VERSION)"
TORCH_VERSION=$TORCH_VERSION bash scripts/test_wheel.sh "$WHEEL"
echo "== C++ tests (torch $TORCH_VERSION)"
PYTHON="$PY" bash scripts/cpp_tests.sh
