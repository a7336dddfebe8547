"""asgd_.packed: the same step as asgd_ with the schedule state (mus, etas,
steps) as one 1-D tensor each instead of lists of 0-d tensors. It must give
bit-identical results to the list overloads and refuse bad packed state
before writing anything (its opcheck samples are test_ops.py's)."""
import pytest
import torch

import torchext  # noqa: F401
from conftest import requires_cuda
from test_ops import KW, assert_unchanged, packed_inputs, snapshot

ops = torch.ops.torchext


def assert_same_step(lists, packed):
    for i in range(3):
        for x, y in zip(lists[i], packed[i]):
            assert (x is None and y is None) or torch.equal(x, y)
    for i in range(3, 6):
        assert torch.equal(torch.stack(lists[i]), packed[i])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.complex64])
@pytest.mark.parametrize("variant", ["cpu lr", "float32 lr", "grad_scale", "found_inf"])
def test_packed_matches_the_list_overload_bit_for_bit(dtype, variant):
    lists, packed = packed_inputs(n=7, dtype=dtype, sizes=(5, 70, 1, 0, 300))
    kw = dict(KW)
    op, op_packed = ops.asgd_.default, ops.asgd_.packed
    if variant == "float32 lr":
        kw["lr"] = torch.tensor(0.02)
    elif variant == "grad_scale":
        kw.update(grad_scale=torch.tensor(8.0), found_inf=torch.zeros(()), maximize=True)
    elif variant == "found_inf":
        kw.update(grad_scale=torch.tensor(8.0), found_inf=torch.ones(()))
    before = snapshot(packed[:3]), [t.clone() for t in packed[3:]]
    for _ in range(3):
        op(*lists, **kw)
        op_packed(*packed, **kw)
    assert_same_step(lists, packed)
    if variant == "found_inf":  # and nothing moved at all
        assert_unchanged(packed[:3], before[0])
        assert all(torch.equal(x, y) for x, y in zip(packed[3:], before[1]))


def test_packed_float64_state_and_rows_of_one_buffer():
    # The three may be rows of one (3, n) buffer: they share a storage but not
    # memory, which is allowed.
    lists, packed = packed_inputs(n=4)
    lists[3:] = [[t.double() for t in lst] for lst in lists[3:]]
    buf = torch.stack([torch.stack(lst) for lst in lists[3:]])
    packed[3:] = list(buf.unbind(0))
    ops.asgd_(*lists, **KW)
    ops.asgd_.packed(*packed, **KW)
    assert_same_step(lists, packed)
    assert packed[5].dtype == torch.float64


BAD_PACKED = {
    "short": (lambda a: a[5].__getitem__(slice(0, 2)), ValueError,
              r"steps must be a 1-D tensor with one element per param \(3\), got shape \[2\]"),
    "2-D": (lambda a: a[4].reshape(3, 1), ValueError, r"etas must be a 1-D tensor"),
    "int": (lambda a: a[3].int(), TypeError, r"mus must be a float32 or float64 tensor"),
    "mixed": (lambda a: a[4].double(), TypeError, r"mus, etas and steps must share one dtype"),
    "strided": (lambda a: torch.zeros(6)[::2], ValueError, r"steps must be contiguous"),
    "meta": (lambda a: a[5].to("meta"), RuntimeError, r"mus is on cpu but steps is on meta"),
}
SLOT = {"short": 5, "2-D": 4, "int": 3, "mixed": 4, "strided": 5, "meta": 5}


@pytest.mark.parametrize("case", BAD_PACKED)
def test_bad_packed_state_is_refused_before_anything_changes(case):
    make, exc, match = BAD_PACKED[case]
    _, packed = packed_inputs()
    packed[SLOT[case]] = make(packed)
    before = snapshot(packed[:3]), [t.clone() for t in packed[3:] if not t.is_meta]
    with pytest.raises(exc, match=match):
        ops.asgd_.packed(*packed, **KW)
    assert_unchanged(packed[:3], before[0])
    assert all(torch.equal(x, y) for x, y in zip([t for t in packed[3:] if not t.is_meta],
                                                  before[1]))


def test_overlapping_packed_state_is_refused():
    _, packed = packed_inputs()
    with pytest.raises(RuntimeError, match="etas and steps overlap in memory"):
        ops.asgd_.packed(*packed[:4], packed[5], packed[5], **KW)


def test_bad_entry_in_a_packed_call_changes_nothing():
    _, packed = packed_inputs(n=5)
    packed[1][4] = packed[1][4].double()  # the last grad
    before = snapshot(packed[:3]), [t.clone() for t in packed[3:]]
    with pytest.raises(TypeError, match=r"grads\[4\] has dtype Double"):
        ops.asgd_.packed(*packed, **KW)
    assert_unchanged(packed[:3], before[0])
    assert all(torch.equal(x, y) for x, y in zip(packed[3:], before[1]))


def test_packed_bumps_versions_of_what_it_writes():
    _, packed = packed_inputs()
    views = packed[5].unbind(0)  # as the optimizer's state entries are
    before = views[0]._version, packed[1][0]._version, packed[0][0]._version
    ops.asgd_.packed(*packed, **KW)
    assert views[0]._version > before[0]   # the view shares the buffer's counter
    assert packed[1][0]._version == before[1]  # grads are read only
    assert packed[0][0]._version == before[2] + 1


def test_packed_meta_validates_like_cpu():
    _, packed = packed_inputs(device="meta")
    ops.asgd_.packed(*packed, **KW)
    with pytest.raises(ValueError, match="1-D tensor with one element per param"):
        ops.asgd_.packed(*packed[:5], packed[5][:1], **KW)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_cuda_matches_the_cpu_list_overload(dtype):
    lists, packed = packed_inputs(n=300, dtype=dtype, sizes=(5, 70000, 1, 0))
    packed = [[t.cuda() for t in lst] for lst in packed[:3]] + [t.cuda() for t in packed[3:]]
    for _ in range(2):
        ops.asgd_(*lists, **KW)
        ops.asgd_.packed(*packed, **KW)
    # The CUDA kernel fuses `p - eta * g` into one FMA (torch's CUDA add);
    # the CPU kernels do too under AVX2/AVX512 and then match bit for bit.
    # The default-ISA CPU build rounds the multiply and the add apart (as
    # torch's own default-ISA kernel), so there results may differ by one
    # rounding of the dtype.
    if torchext.cpu_isa() == "default":
        tol = dict(rtol=2 * torch.finfo(dtype).eps, atol=torch.finfo(dtype).tiny)
    else:
        tol = dict(rtol=0, atol=0)
    for i in range(3):
        for x, y in zip(lists[i], packed[i]):
            torch.testing.assert_close(y.cpu(), x, **tol)
    # The schedule (step, eta, mu): the device's pow against the host's.
    for i in range(3, 6):
        torch.testing.assert_close(packed[i].cpu(), torch.stack(lists[i]), rtol=1e-6, atol=0)


def test_packed_state_on_another_device_than_the_params_is_refused():
    _, packed = packed_inputs()
    packed[3:] = [t.to("meta") for t in packed[3:]]
    with pytest.raises(RuntimeError, match=r"steps is on meta but params\[0\] is on cpu"):
        ops.asgd_.packed(*packed, **KW)
