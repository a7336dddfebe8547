"""The stable-ABI prototype: built once against torch 2.13.0's headers
(build.sh), it must load and pass under every torch it is run with (2.13.0
and 2.14.1 here). Not part of CI: run with
  PY=.venv-2.13.0/bin/python bash prototypes/stable_abi/build.sh
  .venv-2.14.1/bin/python -m pytest prototypes/stable_abi -q"""
import os
import subprocess
import sys

import pytest
import torch

import bench

pytestmark = pytest.mark.skipif(not os.path.exists(bench.LIB), reason="run build.sh first")


@pytest.fixture(scope="module")
def ops():
    return bench.load()


def test_loads_and_passes_opcheck(ops):
    p, g, ax = ([torch.randn(5) for _ in range(3)] for _ in range(3))
    for op, args in ((ops.asgd_fp32_, (p, g, ax, 0.01, 0.5, 1e-4, 0.0)),
                     (ops.check_finite_, ([torch.randn(4), torch.randn(3)], torch.zeros(1)))):
        result = torch.library.opcheck(op.default, args)
        assert all(v == "SUCCESS" for v in result.values()), result


def test_check_finite(ops):
    found = torch.zeros(1)
    ops.check_finite_([torch.ones(3), torch.ones(2)], found)
    assert found.item() == 0
    ops.check_finite_([torch.ones(3), torch.tensor([1.0, float("inf")])], found)
    assert found.item() == 1


@pytest.mark.parametrize("cap", ["default", "avx2", "avx512"])
def test_plain_loops_bit_exact_with_torch_on_every_isa(cap):
    if cap == "avx512" and torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("CPU has no AVX512")
    r = subprocess.run([sys.executable, bench.__file__, "--isa-only"], capture_output=True,
                       text=True, env={**os.environ, "ATEN_CPU_CAPABILITY": cap})
    assert r.returncode == 0, r.stderr[-2000:]
    assert f'"isa": "{cap}"' in r.stdout and '"mismatches": 0' in r.stdout, r.stdout


def test_torchs_autograd_fallback_bumps_no_version(ops):
    """What moving the mutating ops would lose: the stable ABI registers no
    Autograd-key kernel, and torch's fallback does not bump the versions of
    the tensors the op writes (torchext's own Autograd kernel does)."""
    t = torch.randn(4)
    v = t._version
    with torch.no_grad():
        ops.asgd_fp32_([t], [torch.randn(4)], [torch.randn(4)], 0.01, 0.5, 1e-4, 0.0)
    assert t._version == v
