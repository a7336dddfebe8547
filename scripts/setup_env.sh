#!/usr/bin/env bash
# Shared setup for scripts/demo.sh and scripts/test.sh, from a fresh machine:
# a virtual environment with torch and the build/test tools, then torchext
# built in place against that torch. Source it; it leaves $PY set.
#
#   TORCH_VERSION  torch to install (default 2.15.0, the newest supported, as
#                  pip gives it; the older ones: see scripts/venv.sh)
#   VENV           where the environment lives (default .venv-$TORCH_VERSION)
#   TORCHEXT_CUDA  0/1 to force the CUDA kernels off/on (default: auto)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh

# nvcc lives here on these machines; torch's own guess (/usr/local) has no headers.
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
fi
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

# Rebuild when the library does not import (missing, or built against another
# torch), or when any source (csrc/, setup.py, CMakeLists.txt) or build switch
# changed since the last build here: the stamp below is written only after a
# build succeeded. Ninja recompiles only what changed (objects stay in
# build/temp.torchext); another torch than the last build's starts from a
# clean build/.
STAMP=build/setup_env.stamp
want="torch=$TORCH_VERSION sources=$("$PY" torchext/_sources.py digest . CMakeLists.txt) \
TORCHEXT_CUDA=${TORCHEXT_CUDA:-} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-} \
TORCHEXT_CPP_API=${TORCHEXT_CPP_API:-}"
have=$(cat "$STAMP" 2>/dev/null || true)
SHOW="import torchext; print('torchext', torchext.__version__, torchext.build_info)"
if [ "$want" = "$have" ] && "$PY" -c "$SHOW" 2>/dev/null; then
  :  # up to date
else
  if [ -n "$have" ] && [ "${have%% *}" != "${want%% *}" ]; then
    echo "== building torchext against torch $TORCH_VERSION (new torch: clean build)"
    rm -rf build torchext/_C*.so torchext/_build_info.py torchext/_build_stamp
  else
    echo "== building torchext against torch $TORCH_VERSION (incremental)"
  fi
  rm -f "$STAMP"
  "$PY" -m pip install -q --no-build-isolation --no-deps -e .
  mkdir -p build && echo "$want" > "$STAMP"
  "$PY" -c "$SHOW"
fi
