#!/usr/bin/env bash
# Builds the prototype against one torch's stable-ABI headers (target 2.13):
#   PY=.venv-2.13.0/bin/python bash prototypes/stable_abi/build.sh  -> prototypes/stable_abi/build/torchext_stable.so
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python3}
TORCH=$("$PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))')
OUT=$HERE/build
mkdir -p "$OUT"
# 2.13 as the target: only stable APIs of 2.13 and earlier compile.
FLAGS=(-O3 -std=c++20 -fPIC -fvisibility=hidden -ffp-contract=off -DTORCH_TARGET_VERSION=0x020d000000000000
       -I"$TORCH/include")
CXX=${CXX:-g++}
$CXX "${FLAGS[@]}" -c "$HERE/isa_default.cpp" -o "$OUT/isa_default.o"
$CXX "${FLAGS[@]}" -mavx2 -mfma -c "$HERE/isa_avx2.cpp" -o "$OUT/isa_avx2.o"
$CXX "${FLAGS[@]}" -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -c "$HERE/isa_avx512.cpp" -o "$OUT/isa_avx512.o"
$CXX "${FLAGS[@]}" -c "$HERE/stable_ops.cpp" -o "$OUT/stable_ops.o"
# Only torch's C shim is linked (libtorch_cpu exports it); no C++ symbol of torch.
$CXX -shared -o "$OUT/torchext_stable.so" "$OUT"/*.o -L"$TORCH/lib" -ltorch_cpu -lc10 \
  -Wl,--as-needed -Wl,-rpath,'$ORIGIN/../torch/lib'
echo "built $OUT/torchext_stable.so against torch $("$PY" -c 'import torch; print(torch.__version__)')"
