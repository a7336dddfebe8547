#!/usr/bin/env bash
# The one abi3 wheel on every Python that torch supports and this machine has
# (pyenv's 3.10+), each in its own fresh venv with the torch the wheel
# requires from the package index and no compiler reachable: `torchext
# info`, `python -m torchext check`, and a short training run bit for bit
# against torch's classes (scripts/wheel_smoke.py).
#
#   bash scripts/test_pythons.sh WHEEL            # every pyenv Python 3.10+
#   bash scripts/test_pythons.sh WHEEL 3.10 3.13  # these
#   REMOVE_VENVS=1 bash scripts/test_pythons.sh ... # CI: each venv deleted after its test
#
# The venvs stay in build/pythons/<version> (torch installed once; the wheel
# reinstalled each run), unless REMOVE_VENVS=1: each holds a CUDA torch of
# about 5.6 GB, and CI's disk ran out at the second one, so CI keeps at most
# one at a time. pip never caches (--no-cache-dir): the cache would be
# another 3 GB of the same wheels. scripts/test_wheel.sh runs the whole suite on the
# machine's own Python; this is the other Pythons' check.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: scripts/test_pythons.sh WHEEL [3.10 ...]" >&2; exit 2; }
WHEEL=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
shift
PYENV_VERSIONS=${PYENV_ROOT:-$HOME/.pyenv}/versions
if [ $# -eq 0 ]; then
  set -- $(ls "$PYENV_VERSIONS" 2>/dev/null | sed -nE 's/^3\.(1[0-9])\..*/3.\1/p' | sort -uV)
fi
[ $# -gt 0 ] || { echo "test_pythons.sh: no Python 3.10+ found under $PYENV_VERSIONS" >&2; exit 1; }
TORCH_REQ=$(unzip -p "$WHEEL" '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: \(torch==[^ ;]*\).*/\1/p')
[ -n "$TORCH_REQ" ] || { echo "test_pythons.sh: $WHEEL requires no torch==" >&2; exit 1; }

# No compiler reachable: stubs that fail loudly shadow every compiler.
NOCC=$SRC/build/pythons/nocc
mkdir -p "$NOCC"
for tool in cc c++ gcc g++ clang clang++ nvcc ninja cmake ld; do
  printf '#!/bin/sh\necho "test_pythons.sh: %s called, but no compiler may be used" >&2\nexit 1\n' \
    "$tool" > "$NOCC/$tool"
  chmod +x "$NOCC/$tool"
done

declare -a RESULTS
status=0
for v in "$@"; do
  t0=$SECONDS
  base=$(ls -d "$PYENV_VERSIONS/$v".* 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$base" ]; then
    echo "test_pythons.sh: Python $v not found under $PYENV_VERSIONS" >&2; exit 1
  fi
  venv=$SRC/build/pythons/$v
  py=$venv/bin/python
  echo "== Python $v ($base): $(basename "$WHEEL")"
  [ -x "$py" ] || "$base/bin/python3" -m venv "$venv"
  if ! "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '${TORCH_REQ#torch==}')" 2>/dev/null; then
    "$py" -m pip install -q --no-cache-dir --upgrade pip
    "$py" -m pip install -q --no-cache-dir "$TORCH_REQ" numpy
  fi
  "$py" -m pip install -q --no-cache-dir --no-deps --force-reinstall "$WHEEL"
  run=$(mktemp -d)
  if (cd "$run" && PATH="$NOCC:$PATH" CC=false CXX=false CUDA_HOME=/nonexistent \
        "$py" -m torchext info && \
      cd "$run" && PATH="$NOCC:$PATH" CC=false CXX=false CUDA_HOME=/nonexistent \
        "$py" -m torchext check --device cpu && \
      cd "$run" && PATH="$NOCC:$PATH" CC=false CXX=false CUDA_HOME=/nonexistent \
        "$py" "$SRC/scripts/wheel_smoke.py"); then
    RESULTS+=("Python $v: passed ($((SECONDS - t0)) s)")
  else
    RESULTS+=("Python $v: FAILED ($((SECONDS - t0)) s)")
    status=1
  fi
  rm -rf "$run"
  if [ "${REMOVE_VENVS:-0}" = 1 ]; then rm -rf "$venv"; fi
  echo "   disk free after Python $v: $(df -h --output=avail "$SRC" | tail -n 1 | tr -d ' ')"
done
echo "== the wheel on each Python:"
printf '   %s\n' "${RESULTS[@]}"
exit $status
