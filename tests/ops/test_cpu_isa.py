"""The CPU kernels are compiled once per instruction set (csrc/ops/cpu/isa_*.cpp)
and picked at run time like ATen's own (ATEN_CPU_CAPABILITY overrides the
choice). A test run only exercises the host's best ISA, so the parity and
AMP-kernel tests run again here, in subprocesses, under every other ISA this
CPU can execute."""
import os
import platform
import shutil
import subprocess
import sys

import pytest
import torch

import torchext

from helpers import PKG_PARENT, SRC, needs_toolchain, subprocess_env

# What ATen itself can run here, best last.
_ORDER = ["default", "avx2", "avx512"]
_HOST = torch.backends.cpu.get_cpu_capability().lower()
_RUNNABLE = _ORDER[: _ORDER.index(_HOST) + 1] if _HOST in _ORDER else ["default"]
# The tests that run the CPU kernels' math: ASGD parity with torch, and the
# unscale / inf-check / fused-unscale kernels.
_SUITES = [os.path.join(SRC, "tests", f) for f in ("optim/test_asgd_parity.py", "ops/test_ops.py")]
_OPS_FILTER = ("unscale or check_finite or grad_scale or mixed or found_inf or matches_torch "
               "or tensor_norms")


def test_library_uses_atens_choice():
    assert torchext.cpu_isa() == ("default" if _HOST not in _ORDER else _HOST)


@pytest.mark.skipif(sys.platform != "linux", reason="per-ISA builds are x86-64 only")
@pytest.mark.parametrize("isa", [i for i in _RUNNABLE if i != _HOST])
def test_kernels_under_isa(isa):
    # In the torchext under test's directory, not the checkout (an installed
    # wheel's run must not import the checkout's torchext/).
    env = subprocess_env(ATEN_CPU_CAPABILITY=isa)
    probe = subprocess.run(
        [sys.executable, "-c", "import torchext; print(torchext.cpu_isa())"],
        env=env, cwd=PKG_PARENT, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.strip() == isa, f"asked ATen for {isa}, torchext runs {probe.stdout!r}"
    for suite, k in [(_SUITES[0], None), (_SUITES[1], _OPS_FILTER)]:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", suite]
        if k:
            cmd += ["-k", k]
        r = subprocess.run(cmd, env=env, cwd=PKG_PARENT, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, f"{suite} under ATEN_CPU_CAPABILITY={isa}:\n{r.stdout[-4000:]}"
        assert " passed" in r.stdout.splitlines()[-1], r.stdout[-500:]


def _flag_lines(name):
    with open(os.path.join(SRC, "cmake", name)) as f:
        return [ln.split() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]


# Every C++ compiler of the ones users build with that this machine has: GCC
# (any version on PATH) and clang. CI installs Debian's clang so that a
# per-ISA build one of them refuses (GCC 13's always_inline error under a
# `#pragma GCC target`) or silently builds without its ISA (clang ignored that
# pragma) fails here, without a GPU machine's toolchain.
_COMPILERS = [c for c in ("g++", "g++-12", "g++-13", "g++-14", "clang++", "clang++-14",
                          "clang++-16", "clang++-19") if shutil.which(c)]
# What a per-ISA object must contain: instructions that only that ISA has.
_ISA_REGISTERS = {"isa_avx2.cpp": "%ymm", "isa_avx512.cpp": "%zmm"}


@needs_toolchain
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 ISA builds")
@pytest.mark.skipif(not _COMPILERS, reason="no C++ compiler on PATH")
@pytest.mark.parametrize("compiler", _COMPILERS or ["none"])
def test_isa_sources_build_with_their_flags(compiler, tmp_path):
    """The per-ISA sources compile with each compiler, with the flags of
    cmake/isa_flags.txt (the list setup.py and CMake both read), and the
    objects hold that ISA's instructions, not the empty fallback."""
    if not shutil.which("objdump"):
        pytest.skip("objdump (binutils) not on PATH")
    from torch.utils import cpp_extension
    base = [f[0] for f in _flag_lines("cxx_flags.txt")]
    incs = [f"-I{p}" for p in cpp_extension.include_paths()] + [
        f"-I{os.path.join(SRC, 'csrc', 'include')}"]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    for name, *flags in _flag_lines("isa_flags.txt"):
        obj = tmp_path / (name + ".o")
        cmd = [compiler, "-c", "-fPIC", abi, *base, *flags, *incs,
               os.path.join(SRC, "csrc", "ops", "cpu", name), "-o", str(obj)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{compiler} {name}:\n{r.stderr[-4000:]}"
        dis = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True,
                             check=True).stdout
        assert _ISA_REGISTERS[name] in dis, f"{compiler} built {name} without its ISA"
