#!/usr/bin/env bash
# A downstream CMake project (examples/cpp) built against torchext with
# find_package(torchext), then run. Called by ctest:
#   downstream.sh pip     SRC BUILD PYTHON   # the config in the Python package
#   downstream.sh install SRC BUILD PYTHON   # `cmake --install` of the CMake build
#   downstream.sh wheel   SRC BUILD PYTHON   # the config of the wheel installed for PYTHON
#                                            # (scripts/test_wheel.sh)
#   downstream.sh docs    SRC BUILD PYTHON   # the ```cpp fences of README.md and docs/
#                                            # (tests/docs_snippets.py), against the
#                                            # Python package's config, as `pip`
# Exit 77 = skipped (ctest SKIP_RETURN_CODE).
set -euo pipefail
mode=$1 src=$2 build=$3 python=$4
work="$build/downstream_$mode"
rm -rf "$work"
mkdir -p "$work"
torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')

case "$mode" in
  pip|docs)
    torchext_prefix=$(cd "$src" && "$python" -c 'import torchext; print(torchext.cmake_prefix_path)')
    lib=$(cd "$src" && "$python" -c 'import torchext; print(torchext.library_path)')
    symbols=$(nm -DC --defined-only "$lib")
    if ! grep -q 'torchext::optim::ASGD::step' <<< "$symbols"; then
      echo "SKIPPED: $lib was built without the C++ API (TORCHEXT_CPP_API=0)"
      exit 77
    fi
    ;;
  wheel)
    # Imported from BUILD, not the checkout: its torchext/ must not shadow the wheel.
    torchext_prefix=$(cd "$build" && PYTHONPATH= "$python" -c 'import torchext; print(torchext.cmake_prefix_path)')
    case "$torchext_prefix" in
      "$(cd "$src" && pwd)"/torchext/*) echo "downstream.sh wheel: torchext comes from the checkout ($torchext_prefix)"; exit 1 ;;
    esac
    echo "torchext's CMake package: $torchext_prefix"
    ;;
  install)
    cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
    torchext_prefix="$work/prefix"
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac

if [ "$mode" = docs ]; then
  # One executable per fence; each starts with `#line N "page"`, so a compile
  # error names the page and line. run.txt lists the ones to run (not no-run).
  "$python" "$src/tests/docs_snippets.py" cpp-project "$work/src"
  cmake -S "$work/src" -B "$work/build" \
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed" \
    "-DCMAKE_PREFIX_PATH=$torchext_prefix;$torch_prefix" > "$work/configure.log" 2>&1 ||
    { cat "$work/configure.log"; exit 1; }
  cmake --build "$work/build" -j "${JOBS:-2}"
  mkdir -p "$work/run"
  while read -r name; do
    echo "== running $name"
    (cd "$work/run" && "$work/build/$name") || { echo "FAILED: $name"; exit 1; }
  done < "$work/src/run.txt"
  exit 0
fi

# A plain configure: the package config finds torch's CUDA hints itself.
# --as-needed as on Ubuntu-like toolchains: the ops library must stay linked.
cmake -S "$src/examples/cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed" \
  "-DCMAKE_PREFIX_PATH=$torchext_prefix;$torch_prefix" > "$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
grep -E "torchext|Torch" "$work/configure.log" | head -5 || true
cmake --build "$work/build" -j2
# Linked with -Wl,--as-needed in effect? The library must stay NEEDED.
readelf -d "$work/build/train_example" | grep NEEDED | grep -E "torchext|_C" 
cd "$work" && ./build/train_example 100
