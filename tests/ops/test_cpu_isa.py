"""The CPU kernels are compiled once per instruction set (csrc/ops/cpu/isa_*.cpp)
and picked at run time like ATen's own (ATEN_CPU_CAPABILITY overrides the
choice). A test run only exercises the host's best ISA, so the parity and
AMP-kernel tests run again here, in subprocesses, under every other ISA this
CPU can execute."""
import os
import subprocess
import sys

import pytest
import torch

import torchext

from helpers import PKG_PARENT, SRC, subprocess_env

# What ATen itself can run here, best last.
_ORDER = ["default", "avx2", "avx512"]
_HOST = torch.backends.cpu.get_cpu_capability().lower()
_RUNNABLE = _ORDER[: _ORDER.index(_HOST) + 1] if _HOST in _ORDER else ["default"]
# The tests that run the CPU kernels' math: ASGD parity with torch, and the
# unscale / inf-check / fused-unscale kernels.
_SUITES = [os.path.join(SRC, "tests", f) for f in ("optim/test_asgd_parity.py", "ops/test_ops.py")]
_OPS_FILTER = "unscale or check_finite or grad_scale or mixed or found_inf or matches_torch"


def test_library_uses_atens_choice():
    assert torchext.cpu_isa() == ("default" if _HOST not in _ORDER else _HOST)


@pytest.mark.skipif(sys.platform != "linux", reason="per-ISA builds are x86-64 GCC only")
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
