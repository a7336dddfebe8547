"""The CUDA kernels' FMA policy, checked on the PTX nvcc makes (no GPU needed).

nvcc contracts ``a * b + c`` into one FMA by default (``-fmad=true``), which
rounds once instead of twice. torchext's kernels must fuse exactly where
torch's CUDA kernels fuse for the same operations (the ``add`` with alpha:
``grad.add(param, alpha=wd)`` and ``param.add_(grad, alpha=-eta)``, one FMA
each) and nowhere else, so their arithmetic is written with explicitly
rounded operations (``math::mul/add/sub``: ``__fmul_rn`` & co. on the device,
``math::fma_rn``: ``__fmaf_rn``/``__fma_rn``), which nvcc never contracts.

Check: the PTX of the elementwise kernels is the same with ``-fmad=true``
(the build's default) and ``-fmad=false``, i.e. nvcc contracted nothing on
its own; and the fp32 ASGD kernel has its explicit FMAs. A small kernel
written with plain ``a * b + c`` shows that the comparison does see a
contraction. The schedule kernels are left out: their ``pow`` is CUDA's own
(libdevice), compiled as CUDA ships it; so are tensor_norms' kernels that
call it or ``hypot`` (other orders p, complex pairs, the combine's root).
"""
import glob
import os
import re
import shutil
import subprocess

import pytest
import torch

from helpers import SRC, needs_toolchain

ROOT = SRC


def _nvcc():
    if torch.version.cuda is None:
        return None
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    path = os.path.join(home, "bin", "nvcc")
    return path if os.path.exists(path) else shutil.which("nvcc")


NVCC = _nvcc()
pytestmark = pytest.mark.skipif(NVCC is None, reason="needs nvcc and a CUDA build of torch")


def _ptx(source, out, fmad, torch_headers=True):
    from torch.utils import cpp_extension
    cmd = [NVCC, "-ptx", source, "-o", out, "-std=c++20", "-O3", "--gpu-architecture=compute_90",
           f"-fmad={'true' if fmad else 'false'}"]
    if torch_headers:
        site = os.path.dirname(os.path.dirname(torch.__file__))
        # The CUDA wheel's cuSPARSE & co. headers (ATen/cuda includes them).
        # nvcc's own toolkit headers before the wheel's: a wheel built with a
        # newer CUDA (torch 2.15's cu132) carries a cuda_runtime.h that nvcc
        # 13.0 refuses ("CUDA compiler and CUDA toolkit headers are
        # incompatible"); the library's build orders them so too.
        toolkit = os.path.join(os.path.dirname(os.path.dirname(NVCC)), "include")
        includes = (cpp_extension.include_paths(device_type="cuda")
                    + [os.path.join(ROOT, "csrc", "include"), toolkit]
                    + sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "include"))))
        cmd += [f"-I{d}" for d in includes] + cpp_extension.COMMON_NVCC_FLAGS
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    with open(out) as f:
        text = f.read()
    # Names of file-internal symbols carry a per-compile hash.
    return re.sub(r"\d*_INTERNAL_[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+_\d+", "INTERNAL", text)


def _entries(ptx):
    """{mangled kernel name: its PTX body}."""
    out = {}
    for m in re.finditer(r"\.entry (\S+)\((.*?)\n}\n", ptx, re.S):
        out[m.group(1)] = m.group(2)
    return out


def _compare(source, tmp_path, wanted):
    fused = _entries(_ptx(source, str(tmp_path / "fmad.ptx"), True))
    separate = _entries(_ptx(source, str(tmp_path / "nofmad.ptx"), False))
    names = [n for n in fused if any(w in n for w in wanted)]
    assert names, f"no kernels matching {wanted} in {source}"
    return names, fused, separate


@needs_toolchain
def test_cuda_kernels_contract_nothing_on_their_own(tmp_path):
    # One translation unit for both files: nvcc's time goes to torch's headers.
    source = tmp_path / "kernels.cu"
    source.write_text("".join(f'#include "{os.path.join(ROOT, "csrc", "ops", "cuda", f)}"\n'
                              for f in ("asgd_cuda.cu", "amp_cuda.cu")))
    kernels = ["ASGDElementwise", "ScanBody", "UpdateScaleBody"]
    names, fused, separate = _compare(str(source), tmp_path, kernels)
    # asgd_ per (dtype, average dtype) (6: the 4 dtypes with an average of
    # their own, fp16 and bf16 with a float32 one), and fp16/bf16's 4 again
    # with stochastic rounding, with list and packed metadata, scan per dtype
    # (4), each in both kernel-parameter layouts; and update_scale.
    assert len(names) == (6 + 4) * 2 * 2 + 4 * 2 + 1, names
    for name in names:
        assert fused[name] == separate[name], f"nvcc contracted a multiply-add in {name}"
        body = fused[name]
        # Every floating-point add/sub/mul is explicitly rounded (.rn), so
        # ptxas cannot contract it either.
        loose = re.findall(r"\b(?:add|sub|mul)\.f(?:32|64)\b", body)
        assert not loose, f"{name}: {loose[:3]}"
    fp32 = [n for n in names if "ASGDElementwiseIff" in n]  # <float, float, metadata>
    assert len(fp32) == 4 and all("fma.rn.f32" in fused[n] for n in fp32), fp32


@needs_toolchain
def test_norms_kernels_contract_nothing(tmp_path):
    source = os.path.join(ROOT, "csrc", "ops", "cuda", "norms_cuda.cu")
    names, fused, separate = _compare(source, tmp_path, ["NormChunkBody"])
    # Orders 0, 1, 2, inf, -inf (p is NormKind 5) of the real dtypes (4), in
    # both kernel-parameter layouts: no libdevice call.
    plain = [n for n in names if "RealPair" not in n and "NormKindE5E" not in n]
    assert len(plain) == 5 * 4 * 2, plain
    for name in plain:
        assert fused[name] == separate[name], f"nvcc contracted a multiply-add in {name}"
        loose = re.findall(r"\b(?:add|sub|mul)\.f(?:32|64)\b", fused[name])
        assert not loose, f"{name}: {loose[:3]}"


@needs_toolchain
def test_the_comparison_sees_a_contraction(tmp_path):
    src = tmp_path / "contract.cu"
    src.write_text("__global__ void muladd(float* o, const float* a, const float* b,"
                   " const float* c) { int i = threadIdx.x; o[i] = a[i] * b[i] + c[i]; }\n")
    names, fused, separate = _compare(str(src), tmp_path, ["muladd"])
    assert "fma.rn.f32" in fused[names[0]] and fused[names[0]] != separate[names[0]]
