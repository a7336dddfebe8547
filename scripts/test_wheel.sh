#!/usr/bin/env bash
# Tests an installed torchext wheel, not the source tree:
#
#   bash scripts/test_wheel.sh dist/torchext-0.1.0+torch2.13.0.cpu-cp310-abi3-manylinux_2_28_x86_64.whl
#   FRESH=1 bash scripts/test_wheel.sh WHEEL   # a brand-new venv: pip installs the wheel and the torch it requires
#
# 1. An environment with the wheel installed and nothing of the checkout:
#    by default a new venv (build/wheel_test/<label>/venv) whose own
#    site-packages holds only the wheel, over the torch environment of
#    scripts/venv.sh (.venv-<torch>: torch and the test tools, found through a
#    .pth line; that environment's own .pth files, such as an editable
#    torchext's finder, are not run). FRESH=1: a new venv with the wheel, the
#    torch it requires and the test tools, all installed by pip.
# 2. No compiler reachable: CC=CXX=false, CUDA_HOME pointing nowhere, and every
#    compiler, nvcc, ninja and cmake on PATH shadowed by a stub that fails
#    loudly. torch.compile's inductor alone is handed g++ by absolute path
#    (TORCHEXT_TEST_INDUCTOR_CXX, set in tests/conftest.py).
# 3. From a directory outside the checkout (so its torchext/ cannot shadow the
#    installed one; tests/conftest.py also asserts it): `torchext info`,
#    `python -m torchext check`, and the pytest suite.
# 4. With the compilers back: the tests that build C++ themselves, and the C++
#    downstream consumer (examples/cpp) built with find_package(torchext) from
#    the wheel's cmake_prefix_path, then run.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: scripts/test_wheel.sh WHEEL" >&2; exit 2; }
WHEEL=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
name=$(basename "$WHEEL")
# torchext-0.1.0+torch2.13.0.cpu-cp310-abi3-manylinux_2_28_x86_64.whl -> torch2.13.0.cpu, 2.13.0
label=$(sed -E 's/^torchext-[^+]+\+([^-]+)-.*/\1/' <<< "$name")
# The torch environment to test in (scripts/venv.sh): the caller's
# TORCH_VERSION (scripts/test.sh passes it: 2.13.0+cu130), else the wheel's
# base version (2.13.0: this machine's default build of it).
base=$(sed -E 's/^torch([0-9]+\.[0-9]+\.[0-9]+).*/\1/' <<< "$label")
TORCH_VERSION=${TORCH_VERSION:-$base}
[ "${TORCH_VERSION%%+*}" = "$base" ] ||
  { echo "test_wheel.sh: TORCH_VERSION=$TORCH_VERSION, but $name is for torch $base" >&2; exit 2; }
[ "$label" != "$name" ] && [ "$base" != "$label" ] ||
  { echo "test_wheel.sh: $name has no torch label (torchext-X+torchA.B.C.variant-...)" >&2; exit 2; }
export TORCH_VERSION
WORK=$SRC/build/wheel_test/$label
rm -rf "$WORK" && mkdir -p "$WORK/run" "$WORK/nocc"
start=$SECONDS
declare -a STEPS
stamp() { STEPS+=("$(printf '%-44s %4d s' "$1" $((SECONDS - t0)))"); t0=$SECONDS; }
t0=$SECONDS

# ---- 1. the environment
echo "== test_wheel: $name (torch $TORCH_VERSION)"
if [ "${FRESH:-0}" = 1 ]; then
  # The test tools that scripts/venv.sh installs (one list, kept there).
  tools=$(sed -n 's/^TORCHEXT_TEST_PACKAGES="\(.*\)"$/\1/p' scripts/venv.sh)
  "${PYTHON_BIN:-python3}" -m venv "$WORK/venv"
  PY=$WORK/venv/bin/python
  "$PY" -m pip install -q --upgrade pip
  # shellcheck disable=SC2086
  "$PY" -m pip install -q "$WHEEL" $tools
else
  ( source scripts/venv.sh > /dev/null )  # creates .venv-$TORCH_VERSION when missing
  BASE_PY=$SRC/.venv-$TORCH_VERSION/bin/python
  base_site=$("$BASE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$BASE_PY" -m venv "$WORK/venv"
  PY=$WORK/venv/bin/python
  "$PY" -m pip install -q --no-deps --no-index "$WHEEL"
  # After the install, so pip never saw the base environment's torchext.
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base_site" > "$site/_torchext_test_base_env.pth"
  # torch (and the CUDA wheel's nvidia/ libraries) next to torchext, as pip
  # installs them: the library finds them through its $ORIGIN/../ rpaths, also
  # when a C++ program (not Python) loads it.
  for d in torch nvidia; do
    if [ -e "$base_site/$d" ]; then ln -s "$base_site/$d" "$site/$d"; fi
  done
fi
stamp "install ($([ "${FRESH:-0}" = 1 ] && echo "fresh venv" || echo "venv over .venv-$TORCH_VERSION"))"

# ---- 2. no compiler
INDUCTOR_CXX=$(readlink -f "$(command -v g++ || command -v c++)")
IFS=: read -ra dirs <<< "$PATH"
for d in "${dirs[@]}"; do
  [ -d "$d" ] || continue
  for f in "$d"/*; do
    n=$(basename "$f")
    if [[ "$n" =~ ^(cc|c\+\+|cpp|c89-gcc|c99-gcc|gcc|g\+\+|clang|clang\+\+|icx|icpx|nvcc|ninja|cmake)(-[0-9.]+)?$ ||
          "$n" =~ ^[a-z0-9_]+-linux-gnu-(gcc|g\+\+|cpp)(-[0-9.]+)?$ ]] && [ ! -e "$WORK/nocc/$n" ]; then
      printf '#!/bin/sh\necho "test_wheel.sh: %s called, but there is no compiler here: the installed wheel must not build anything" >&2\nexit 1\n' "$n" > "$WORK/nocc/$n"
      chmod +x "$WORK/nocc/$n"
    fi
  done
done
NOCC_ENV=(env PATH="$WORK/nocc:$WORK/venv/bin:$PATH" CC=false CXX=false CUDAHOSTCXX=false
          CUDA_HOME="$WORK/no-cuda" CUDA_PATH="$WORK/no-cuda" TORCHEXT_TEST_NO_COMPILER=1
          TORCHEXT_TEST_INDUCTOR_CXX="$INDUCTOR_CXX" TORCHEXT_TEST_INSTALLED=1 PYTHONPATH=)
echo "== compilers shadowed: $(ls "$WORK/nocc" | tr '\n' ' ')"
( cd "$WORK/run" && "${NOCC_ENV[@]}" sh -c 'for c in cc c++ gcc g++ nvcc; do if $c --version >/dev/null 2>&1; then echo "$c works"; exit 1; fi; done' ) ||
  { echo "test_wheel.sh: a compiler is still reachable" >&2; exit 1; }

# ---- 3. info, check, pytest against the installed wheel
cd "$WORK/run"
"${NOCC_ENV[@]}" torchext info
stamp "torchext info"
"${NOCC_ENV[@]}" "$PY" -m torchext check
stamp "torchext check"
"${NOCC_ENV[@]}" "$PY" -m pytest "$SRC/tests" -p no:cacheprovider -q -ra ${PYTEST_ARGS:-}
stamp "pytest (installed wheel, no compiler)"

# ---- 4. C++ against the installed wheel, compilers back
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
TORCHEXT_TEST_INSTALLED=1 PYTHONPATH= "$PY" -m pytest "$SRC/tests" -p no:cacheprovider -q -ra \
  -m toolchain
bash "$SRC/cpp_tests/downstream.sh" wheel "$SRC" "$WORK" "$PY"
stamp "C++: toolchain tests, downstream consumer"
echo "== test_wheel: $name passed in $((SECONDS - start)) s"
printf '   %s\n' "${STEPS[@]}"
