"""The op contract: schemas, opcheck, Meta kernels, grad_scale/found_inf
semantics and bad input (clear errors, nothing mutated)."""
import copy
import functools
import math
import unittest

import pytest
import torch

import torchext  # noqa: F401
from torch.optim.asgd import asgd as torch_asgd  # torch's functional ASGD
from conftest import requires_cuda
from helpers import rel_err

try:  # the schema and message snapshots; GPU machines may lack it
    import expecttest
    _SnapshotCase = expecttest.TestCase
except ImportError:
    expecttest = None
    _SnapshotCase = unittest.TestCase

ops = torch.ops.torchext


def asgd_inputs(n=3, dtype=torch.float32, device="cpu", seed=0, sizes=(5, 70, 1)):
    g = torch.Generator().manual_seed(seed)
    shapes = [(sizes[i % len(sizes)], 3) for i in range(n)]

    def rnd(s):
        return torch.randn(s, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)

    params = [rnd(s) for s in shapes]
    grads = [rnd(s) for s in shapes]
    axs = [rnd(s) for s in shapes]
    mus = [torch.tensor(0.5 if i % 2 else 1.0, device=device) for i in range(n)]
    etas = [torch.tensor(0.01 * (i + 1), device=device) for i in range(n)]
    steps = [torch.tensor(float(i), device=device) for i in range(n)]
    return [params, grads, axs, mus, etas, steps]


def lr_t(v, device="cpu"):
    """The op's lr: a 1-element tensor (a CPU one is read on the host)."""
    return torch.tensor(v, dtype=torch.float64, device=device)


KW = dict(lr=lr_t(0.01), lambd=1e-4, alpha=0.75, t0=2.0, weight_decay=0.01, maximize=False)


def snapshot(args):
    return [[None if t is None else t.clone() for t in lst] for lst in args]


def assert_unchanged(args, snap):
    for lst, old in zip(args, snap):
        for t, o in zip(lst, old):
            if t is None or t.is_meta:
                assert (t is None) == (o is None)
                continue
            if t.is_sparse:
                t, o = t.to_dense(), o.to_dense()
            assert torch.equal(t, o) or (t.isnan().any() and torch.equal(t.isnan(), o.isnan()))


@unittest.skipIf(expecttest is None, "expecttest is not installed (pip install expecttest)")
class TestSchemas(_SnapshotCase):
    """Any change to the contract shows up here in review."""

    def test_schemas(self):
        self.assertExpectedInline(str(ops.asgd_.default._schema), """torchext::asgd_(Tensor(a! -> *)[] params, Tensor[] grads, Tensor(b! -> *)[] axs, Tensor(c! -> *)[] mus, Tensor(d! -> *)[] etas, Tensor(e! -> *)[] steps, *, Tensor lr, float lambd, float alpha, float t0, float weight_decay, bool maximize, Tensor? grad_scale=None, Tensor? found_inf=None, Tensor? clip_coef=None, int? rounding_seed=None, int[]? rounding_ids=None, int[]? rounding_offsets=None) -> ()""")
        self.assertExpectedInline(str(ops.asgd_.packed._schema), """torchext::asgd_.packed(Tensor(a! -> *)[] params, Tensor[] grads, Tensor(b! -> *)[] axs, Tensor(c!) mus, Tensor(d!) etas, Tensor(e!) steps, *, Tensor lr, float lambd, float alpha, float t0, float weight_decay, bool maximize, Tensor? grad_scale=None, Tensor? found_inf=None, Tensor? clip_coef=None, int? rounding_seed=None, int[]? rounding_ids=None, int[]? rounding_offsets=None) -> ()""")
        self.assertExpectedInline(str(ops.check_finite_.default._schema), """\
torchext::check_finite_(Tensor[] tensors, Tensor(a!) found_inf) -> ()""")
        self.assertExpectedInline(str(ops.unscale_.default._schema), """\
torchext::unscale_(Tensor(a! -> *)[] tensors, Tensor(b!) found_inf, Tensor inv_scale, Tensor? clip_coef=None) -> ()""")
        self.assertExpectedInline(str(ops.tensor_norms.default._schema), """\
torchext::tensor_norms(Tensor[] tensors, float ord=2., Tensor? inv_scale=None, Tensor(a!)? found_inf=None) -> Tensor""")
        self.assertExpectedInline(str(ops.update_scale_.default._schema), """\
torchext::update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, Tensor(c!) hysteresis_tracker, Tensor found_inf, *, float growth_factor, float backoff_factor, int growth_interval, int hysteresis=1, float? min_scale=None, float? max_scale=None) -> ()""")
        self.assertExpectedInline(str(ops.update_scale_.counted._schema), """\
torchext::update_scale_.counted(Tensor(a!) scale, Tensor(b!) growth_tracker, Tensor(c!) hysteresis_tracker, Tensor found_inf, Tensor(d!) last_step_skipped, Tensor(e!) skipped_steps, float growth_factor, float backoff_factor, int growth_interval, int hysteresis=1, float? min_scale=None, float? max_scale=None) -> ()""")

    def _msg(self, fn):
        with self.assertRaises(Exception) as ctx:
            fn()
        return f"{type(ctx.exception).__name__}: {str(ctx.exception).splitlines()[0]}"

    def test_error_messages(self):
        a = asgd_inputs()
        self.assertExpectedInline(self._msg(lambda: ops.asgd_(a[0], a[1][:2], *a[2:], **KW)), """\
ValueError: asgd_: params, grads, axs, mus, etas and steps must have the same length, got 3, 2, 3, 3, 3 and 3""")
        bad = [a[1][0], a[1][1].double(), a[1][2]]
        self.assertExpectedInline(self._msg(lambda: ops.asgd_(a[0], bad, *a[2:], **KW)), """\
TypeError: asgd_: grads[1] has dtype Double but params[1] has dtype Float""")
        bad = [a[1][0], a[1][1][:3], a[1][2]]
        self.assertExpectedInline(self._msg(lambda: ops.asgd_(a[0], bad, *a[2:], **KW)), """\
ValueError: asgd_: grads[1] has shape [3, 3] but params[1] has shape [70, 3]""")
        bad = [a[1][0], a[1][1].to_sparse(), a[1][2]]
        self.assertExpectedInline(self._msg(lambda: ops.asgd_(a[0], bad, *a[2:], **KW)), """\
RuntimeError: asgd_: ASGD does not support sparse gradients (grads[1] is sparse)""")
        bad = [a[1][0], a[1][1].to("meta"), a[1][2]]
        self.assertExpectedInline(self._msg(lambda: ops.asgd_(a[0], bad, *a[2:], **KW)), """\
RuntimeError: asgd_: grads[1] is on meta but params[1] is on cpu""")
        self.assertExpectedInline(self._msg(lambda: ops.asgd_(*a, **{**KW, "lr": lr_t(-1.0)})), """ValueError: asgd_: invalid learning rate: -1 (must be finite and >= 0)""")
        self.assertExpectedInline(
            self._msg(lambda: ops.asgd_(*a, **{**KW, "lr": torch.ones(2)})), """ValueError: asgd_: lr must hold exactly one element, got shape [2]""")
        self.assertExpectedInline(
            self._msg(lambda: ops.update_scale_(
                torch.ones(()), torch.zeros((), dtype=torch.int32),
                torch.ones((), dtype=torch.int32), torch.zeros(()), growth_factor=2.0,
                backoff_factor=2.0, growth_interval=10)), """\
ValueError: update_scale_: backoff_factor must be in (0, 1), got 2""")
        self.assertExpectedInline(
            self._msg(lambda: ops.unscale_([torch.ones(3)], torch.zeros(()), torch.ones(2))), """\
ValueError: unscale_: inv_scale must hold exactly one element, got shape [2]""")


def packed_inputs(**kw):
    """asgd_inputs with mus/etas/steps stacked: (list args, packed args)."""
    a = asgd_inputs(**kw)
    packed = [*[[t.clone() for t in lst] for lst in a[:3]], *(torch.stack(lst) for lst in a[3:])]
    return a, packed


def opcheck_samples(device):
    """(op, args, kwargs) for torch.library.opcheck: every op, asgd_ in both
    overloads (lists and packed state)."""
    samples = []
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.complex64):
        a = asgd_inputs(dtype=dtype, device=device)
        samples.append((ops.asgd_.default, a, dict(KW)))
        a = asgd_inputs(dtype=dtype, device=device)
        scale = torch.tensor(4.0, device=device)
        samples.append((ops.asgd_.default, a, dict(KW, maximize=True, grad_scale=scale,
                                                   found_inf=torch.zeros((), device=device))))
        a = asgd_inputs(dtype=dtype, device=device)
        samples.append((ops.asgd_.default, a,
                        dict(KW, lr=torch.tensor(0.02, device=device))))
    grads = asgd_inputs(device=device)[1] + [torch.tensor([1.0, float("inf")], device=device)]
    samples.append((ops.check_finite_.default, [grads, torch.zeros((), device=device)], {}))
    samples.append((ops.unscale_.default,
                    [asgd_inputs(device=device)[1], torch.zeros((), device=device),
                     torch.tensor(0.25, device=device)], {}))
    mixed = asgd_inputs(device=device)[1] + [torch.randn(4, 3, device=device).t(),
                                             torch.randn(5, dtype=torch.bfloat16, device=device),
                                             torch.randn(3, dtype=torch.complex64, device=device)]
    for order in (2.0, float("inf"), 0.5):
        samples.append((ops.tensor_norms.default, [mixed, order], {}))
    samples.append((ops.tensor_norms.default, [grads, 2.0],
                    dict(inv_scale=torch.tensor(0.25, device=device),
                         found_inf=torch.zeros((), device=device))))
    for found in (0.0, 1.0):
        samples.append((ops.update_scale_.default,
                        [torch.tensor(1024.0, device=device),
                         torch.tensor(1, dtype=torch.int32, device=device),
                         torch.tensor(1, dtype=torch.int32, device=device),
                         torch.tensor(found, device=device)],
                        dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=2)))
        samples.append((ops.update_scale_.counted,
                        [torch.tensor(1024.0, device=device),
                         torch.tensor(1, dtype=torch.int32, device=device),
                         torch.tensor(2, dtype=torch.int32, device=device),
                         torch.tensor(found, device=device),
                         torch.tensor(not found, device=device),
                         torch.tensor(5, dtype=torch.int64, device=device),
                         2.0, 0.5, 2, 2, 1.0, 4096.0], {}))
    for dtype in (torch.float32, torch.bfloat16, torch.complex64):
        _, p = packed_inputs(dtype=dtype, device=device)
        samples.append((ops.asgd_.packed, p, dict(KW)))
        _, p = packed_inputs(dtype=dtype, device=device)
        samples.append((ops.asgd_.packed, p, dict(KW, grad_scale=torch.tensor(4.0, device=device),
                                                  found_inf=torch.zeros((), device=device))))
        _, p = packed_inputs(dtype=dtype, device=device)
        samples.append((ops.asgd_.packed, p, dict(KW, lr=torch.tensor(0.02, device=device))))
    return samples


ALL_OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor",
                     "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
@pytest.mark.parametrize("idx", range(len(opcheck_samples("cpu"))))
def test_opcheck(device, idx):
    op, args, kwargs = opcheck_samples(device)[idx]
    torch.library.opcheck(op, args, kwargs, test_utils=ALL_OPCHECK_TESTS)


def test_every_op_has_cpu_meta_and_cuda_kernels():
    for name in ("asgd_", "asgd_.packed", "check_finite_", "unscale_", "update_scale_",
                 "update_scale_.counted", "tensor_norms"):
        dump = torch._C._dispatch_dump(f"torchext::{name}")
        assert "\nCPU: registered" in dump and "\nMeta: registered" in dump, dump
        if name in ("tensor_norms", "update_scale_.counted"):
            # Devices without a kernel of their own: tensor_norms' composite
            # (ATen's multi-tensor norm); update_scale_'s CUDA kernel and two
            # ATen ops.
            assert "\nCompositeExplicitAutograd[alias]: registered" in dump, dump
        if torchext.has_cuda_kernels() and name != "update_scale_.counted":
            # CUDA picks its own kernel over the composite one.
            assert "\nCUDA: registered" in dump, dump


@pytest.mark.parametrize("order", [2.0, 1.0, 0.0, float("inf"), float("-inf"), 3.0, -1.0])
def test_tensor_norms_cpu_kernel_matches_the_composite_one(order):
    """The CPU kernel against the composite kernel (ATen's _foreach_norm, what
    devices without a kernel of their own run), reached on the CPU through
    the composite key, with inv_scale/found_inf."""
    ts = asgd_inputs(dtype=torch.float32)[1] + [torch.randn(3, 5).t(),
                                               torch.randn(9, dtype=torch.float16)]
    ts[0][1] = float("nan") if order == 1.0 else ts[0][1]
    inv = torch.tensor(0.125)
    f1, f2 = torch.zeros(()), torch.zeros(())
    composite = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
    got = ops.tensor_norms(ts, order, inv, f1)
    want = ops.tensor_norms.default.redispatch(composite, ts, order, inv, f2)
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(f1, f2) and f1.item() == (order == 1.0)
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~got.isnan()
    assert ((got[ok] - want[ok]).abs() <= 2e-5 * want[ok].abs()).all(), (got, want)


_COMPOSITE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


@pytest.mark.parametrize("route", ["cpu", "composite"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tensor_norms_of_scaled_low_precision_grads_round_after_inv_scale(route, dtype):
    """fp16 grads whose *scaled* norm passes 65504 (94868 here) but whose
    unscaled norm (92.6) does not: the norm is accumulated in float32 and
    rounded to fp16 only after inv_scale, on the CPU kernel and on the
    composite one (reached here on the CPU). Reference: float64. The CUDA
    kernel: test_tensor_norms_cuda_matches_cpu_kernel."""
    g = torch.full((1000,), 3000.0, dtype=dtype)
    inv = torch.tensor(1 / 1024)
    found = torch.zeros(())
    if route == "cpu":
        got = ops.tensor_norms([g], 2.0, inv, found)
    else:
        got = ops.tensor_norms.default.redispatch(_COMPOSITE, [g], 2.0, inv, found)
    want = torch.linalg.vector_norm(g.double() * inv.double()).to(dtype)
    assert got.dtype == dtype and torch.equal(got, want.reshape(1)), (got, want)
    assert found.item() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scaled", [True, False])
def test_tensor_norms_of_tiny_grads_are_float64_accurate(dtype, scaled):
    """Gradients below 1e-19 (unscaled ones of a deep bf16 model under a
    GradScaler: 7e-23) square to float32 denormals: summed in float32 the
    2-norm lost 1.7% (and the read ran several times slower). The CPU kernel
    squares in double: the norm of what unscale_ would store, within float32
    rounding of float64's. Sizes around the vector widths; the tail too."""
    torch.manual_seed(0)
    inv = torch.tensor(2.0**-16)
    ts = [(torch.randn(n) * 7e-23 * (2.0**16 if scaled else 1.0)).to(dtype)
          for n in (4096, 33, 16, 7, 1)]
    got = ops.tensor_norms(ts, 2.0, inv if scaled else None, None)
    stored = [(t.float() * inv).to(dtype) if scaled else t for t in ts]  # what unscale_ stores
    want = torch.stack([torch.linalg.vector_norm(t.double()) for t in stored])
    assert got.dtype == dtype
    assert rel_err(got.double(), want) < (1e-6 if dtype == torch.float32 else 8e-3), (got, want)


@pytest.mark.parametrize("route", ["cpu", "composite"])
@pytest.mark.parametrize("order", [2.0, 1.0, 3.0, -2.0])
def test_tensor_norms_overflow_where_torchs_float_sums_do(route, order):
    """torch sums |x|^p of float32 (and fp16/bf16/complex64) tensors in
    float32: past FLT_MAX the norm is inf (0 for negative p) although every
    element is finite, and a clip then zeroes the update. Both kernels give
    torch's value; float64 tensors keep their finite norm."""
    big = 1e-30 if order < 0 else 1.5e19 if order == 2.0 else 4e37 if order == 1.0 else 1e13
    ts = [torch.cat([torch.full((10,), big), torch.zeros(5000)]), torch.ones(4),
          torch.full((10,), big, dtype=torch.float64)]
    want = torch.stack(torch._foreach_norm(ts, order))
    call = ops.tensor_norms if route == "cpu" else functools.partial(
        ops.tensor_norms.default.redispatch, _COMPOSITE)
    got = call(ts, order, None, None)
    assert want[0].item() in (0.0, math.inf)  # torch's overflow, the case under test
    assert torch.equal(got[:2], want[:2].to(got.dtype)), (got, want)
    assert math.isfinite(got[2].item()) and got[2].item() != 0.0
    assert rel_err(got[2:], want[2:].to(got.dtype)) < 1e-12


def _norms_close(got, want, tensors, order):
    """The CUDA kernel's norms against the CPU kernel's (cpp_tests/cuda_cases.h:
    close_norms says why): the same bits for 0, inf and -inf; within 2^-16
    (float32 sums: 1-norms of float32/fp16/bf16) or 1e-10 (double sums: the
    rest, 2-norms included) relative, plus one unit in the last place of the
    tensor's dtype."""
    exact = order == 0 or math.isinf(order)
    for g, w, t in zip(got.cpu().double().tolist(), want.double().tolist(), tensors):
        if (math.isnan(g) and math.isnan(w)) or g == w:
            continue
        assert not exact and math.isfinite(g) and math.isfinite(w), (g, w, t.dtype, order)
        real = t.real.dtype if t.is_complex() else t.dtype
        float_sums = order == 1 and not t.is_complex() and real != torch.float64
        ulp = torch.finfo(real).eps * max(abs(w), torch.finfo(real).tiny)
        assert abs(g - w) <= (2**-16 if float_sums else 1e-10) * abs(w) + ulp, (g, w, t.dtype)


@requires_cuda
@pytest.mark.parametrize("order", [0.0, 1.0, 2.0, math.inf, -math.inf, 3.0, 0.5, -1.0, -2.5])
def test_tensor_norms_cuda_matches_cpu_kernel(order):
    """The CUDA kernel (one read: norms, unscale and inf check) against the CPU
    kernel: mixed dtypes, complex, a non-dense tensor, an unaligned slice,
    sizes around the vector width, inv_scale and found_inf; no host sync."""
    torch.manual_seed(0)
    ts = [torch.randn(n, dtype=dt) * 64 for n in (1, 3, 4, 5, 4097, 70000)
          for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                     torch.complex64)]
    ts += [torch.randn(6, 7).t() * 64, torch.randn(101)[1:] * 64, torch.randn(10, 4)[:, ::2] * 64]
    if order >= 0 and not math.isinf(order):
        ts.append(torch.zeros(0, dtype=torch.float16))
    for with_inf in (False, True):
        if with_inf:
            ts[20][-1] = float("inf")
        inv = torch.tensor(1 / 64)
        f_cpu = torch.zeros(())
        want = ops.tensor_norms(ts, order, inv, f_cpu)
        f_gpu = torch.zeros((), device="cuda")
        cuda = [t.cuda() for t in ts]
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = ops.tensor_norms(cuda, order, inv.cuda(), f_gpu)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert got.device.type == "cuda" and got.dtype == want.dtype
        assert f_gpu.item() == f_cpu.item() == float(with_inf)
        _norms_close(got, want, ts, order)
        # Without inv_scale/found_inf too.
        _norms_close(ops.tensor_norms(cuda, order), ops.tensor_norms(ts, order), ts, order)


def test_tensor_norms_bad_input_raises_and_writes_nothing():
    good = [torch.randn(3), torch.randn(4)]
    cases = [
        ([torch.randn(3), torch.ones(3, dtype=torch.int64)], {}, TypeError, "unsupported dtype"),
        ([torch.randn(3), torch.randn(3, device="meta")], {}, RuntimeError,
         r"tensors\[1\] is on meta"),
        ([torch.randn(3), torch.randn(3).to_sparse()], {}, RuntimeError, "sparse"),
        ([torch.randn(3), torch.zeros(0)], dict(ord=float("-inf")), RuntimeError, "empty"),
        (good, dict(inv_scale=torch.ones(2)), ValueError, "exactly one element"),
        (good, dict(inv_scale=torch.ones((), dtype=torch.float64)), TypeError, "float32"),
        (good, dict(found_inf=torch.zeros((), device="meta")), RuntimeError, "found_inf is on"),
    ]
    for tensors, kw, exc, match in cases:
        found = torch.zeros(())
        tensors[0][0] = float("inf")  # found_inf would be set by a call that ran
        with pytest.raises(exc, match=match):
            ops.tensor_norms(tensors, **{"found_inf": found, **kw})
        assert found.item() == 0
        # The composite kernel (devices without their own) and the CUDA
        # kernel's host code (redispatched with CPU tensors: no GPU needed)
        # refuse the same.
        keys = [torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)]
        if torchext.has_cuda_kernels():
            keys.append(_CUDA_KEY)
        for key in keys:
            with pytest.raises(exc, match=match):
                ops.tensor_norms.default.redispatch(key, tensors, kw.get("ord", 2.0),
                                                    kw.get("inv_scale"),
                                                    kw.get("found_inf", found))
            assert found.item() == 0
        # The Meta kernel (torch.compile's trace) refuses the same.
        meta = [t.to("meta") for t in tensors if not t.is_sparse]
        if not (exc is RuntimeError and "is on" in match) and len(meta) == len(tensors):
            with pytest.raises(exc, match=match):
                ops.tensor_norms(meta, **{k: v.to("meta") for k, v in
                                          {"found_inf": found, **kw}.items()
                                          if isinstance(v, torch.Tensor)},
                                 **{k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)})


def test_meta_kernels_validate_like_cpu():
    """opcheck cannot notice a missing Meta kernel for ops returning (): call
    the Meta kernels directly, with good and bad input."""
    a = asgd_inputs(device="meta")
    ops.asgd_(*a, **KW)  # runs, touches nothing
    with pytest.raises(ValueError, match="invalid lambd value: inf"):
        ops.asgd_(*a, **{**KW, "lambd": float("inf")})
    ops.asgd_(*a, **{**KW, "lr": torch.tensor(0.1, device="meta")})
    with pytest.raises(TypeError, match=r"grads\[1\] has dtype Double"):
        ops.asgd_(a[0], [a[1][0], a[1][1].double(), a[1][2]], *a[2:], **KW)
    with pytest.raises(ValueError, match="same length"):
        ops.asgd_(a[0][:1], *a[1:], **KW)
    ops.check_finite_(a[1], torch.zeros((), device="meta"))
    with pytest.raises(TypeError, match="found_inf must be a float32"):
        ops.check_finite_(a[1], torch.zeros((), device="meta", dtype=torch.int32))


def test_asgd_under_fake_tensor_mode():
    # Under FakeTensorMode the op runs its Meta kernel, which is its
    # validation: a good call runs (and bumps the versions of what it
    # writes), a bad one raises as on real tensors.
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    with FakeTensorMode():
        a = asgd_inputs()
        assert all(isinstance(t, FakeTensor) for lst in a for t in lst)
        before = [t._version for t in a[0]]
        ops.asgd_(*a, **{**KW, "lr": lr_t(0.01)})
        assert [t._version for t in a[0]] == [v + 1 for v in before]
        with pytest.raises(ValueError, match="invalid lambd value: inf"):
            ops.asgd_(*a, **{**KW, "lr": lr_t(0.01), "lambd": float("inf")})
        with pytest.raises(TypeError, match=r"grads\[1\] has dtype Double"):
            ops.asgd_(a[0], [a[1][0], a[1][1].double(), a[1][2]], *a[2:],
                      **{**KW, "lr": lr_t(0.01)})


def _reference_step(a, kw, grad_scale=None):
    """torch.optim.ASGD for-loop update on copies of the lists (float64 math
    for the schedule, like torch)."""
    params, grads, axs, mus, etas, steps = [[t.clone() for t in lst] for lst in a]
    if grad_scale is not None:
        inv = torch.tensor(1.0 / grad_scale, dtype=torch.float32)
        grads = [g * inv for g in grads]
    torch_asgd(params, grads, axs, mus, etas, steps, foreach=False, maximize=kw["maximize"],
               lambd=kw["lambd"], lr=float(kw["lr"]), t0=kw["t0"], alpha=kw["alpha"],
               weight_decay=kw["weight_decay"])
    return [params, grads, axs, mus, etas, steps]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_op_matches_torch_single_step_with_mu_one_and_averaging(dtype):
    a = asgd_inputs(dtype=dtype)
    ref = _reference_step(a, KW)
    ops.asgd_(*a, **KW)
    for i in (0, 2, 3, 4, 5):
        for t, r in zip(a[i], ref[i]):
            torch.testing.assert_close(t, r, rtol=1e-6, atol=0)


def test_found_inf_leaves_every_tensor_bit_identical():
    a = asgd_inputs(n=5, sizes=(100000, 3, 0))
    snap = snapshot(a)
    ops.asgd_(*a, **KW, grad_scale=torch.tensor(8.0), found_inf=torch.tensor(1.0))
    assert_unchanged(a, snap)
    ops.asgd_(*a, **{**KW, "lr": torch.tensor(0.1)}, found_inf=torch.tensor(1.0))
    assert_unchanged(a, snap)
    # found_inf == 0 steps as if it were not given
    b = copy.deepcopy(snap)
    ops.asgd_(*a, **KW, found_inf=torch.tensor(0.0))
    ops.asgd_(*b, **KW)
    for la, lb in zip(a, b):
        for x, y in zip(la, lb):
            assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16,
                                   torch.float16, torch.complex64])
def test_grad_scale_unscales_on_the_fly(dtype):
    """Scaled grads + grad_scale give the bits of unscaled grads (power-of-two
    scale), and match torch's unscale_-then-step for a non-power-of-two."""
    for scale in (1024.0, 3.0):
        a = asgd_inputs(dtype=dtype)
        b = snapshot(a)
        scaled = [g * scale for g in a[1]] if scale == 1024.0 else a[1]
        ops.asgd_(a[0], scaled, *a[2:], **KW, grad_scale=torch.tensor(scale))
        if scale == 1024.0:
            ops.asgd_(*b, **KW)
            for x, y in zip(a[0] + a[2], b[0] + b[2]):
                assert torch.equal(x, y)
        elif dtype in (torch.float32, torch.float64):
            ref = _reference_step(b, KW, grad_scale=scale)
            for x, y in zip(a[0] + a[2], ref[0] + ref[2]):
                assert rel_err(x, y) <= 1e-6  # FMA vs separate rounding: ulp-level


def test_empty_list_is_noop():
    """Empty lists are a no-op: found_inf stays 0, the scalars passed in are
    untouched (asgd_ with grad_scale/found_inf; unscale_ with an inf scale)."""
    found_inf, grad_scale, lr = torch.zeros(()), torch.tensor(float("inf")), torch.tensor(0.1)
    before = [t.clone() for t in (found_inf, grad_scale, lr)]
    ops.asgd_([], [], [], [], [], [], **KW, grad_scale=grad_scale, found_inf=found_inf)
    ops.asgd_([], [], [], [], [], [], **{**KW, "lr": lr}, grad_scale=grad_scale,
              found_inf=found_inf)
    ops.check_finite_([], found_inf)
    ops.unscale_([], found_inf, grad_scale)
    for t, b in zip((found_inf, grad_scale, lr), before):
        assert torch.equal(t, b)
    assert found_inf.item() == 0.0


def test_mixed_dtypes_in_one_call():
    a32 = asgd_inputs(dtype=torch.float32)
    a64 = asgd_inputs(dtype=torch.float64, seed=1)
    mixed = [x + y for x, y in zip(a32, a64)]
    ref32, ref64 = _reference_step(a32, KW), _reference_step(a64, KW)
    ops.asgd_(*mixed, **KW)
    for t, r in zip(mixed[0], ref32[0] + ref64[0]):
        torch.testing.assert_close(t, r, rtol=1e-6, atol=0)


def _bad_asgd_cases():
    def mk():
        return asgd_inputs()

    cases = {}
    a = mk(); a[1] = a[1][:2]; cases["length"] = (a, KW, ValueError, "same length")
    a = mk(); a[1][1] = a[1][1][:2]; cases["shape"] = (a, KW, ValueError, r"grads\[1\] has shape")
    a = mk(); a[2][2] = torch.zeros(2, 3); cases["ax shape"] = (a, KW, ValueError, r"axs\[2\] has shape")
    a = mk(); a[1][0] = a[1][0].half(); cases["dtype"] = (a, KW, TypeError, r"grads\[0\] has dtype Half")
    a = mk(); a[0][1] = a[0][1].int(); a[1][1] = a[1][1].int(); a[2][1] = a[2][1].int()
    cases["int params"] = (a, KW, TypeError, "unsupported dtype")
    a = mk(); a[1][2] = a[1][2].to_sparse(); cases["sparse"] = (a, KW, RuntimeError, "sparse")
    a = mk(); a[4][1] = torch.tensor([0.1, 0.2]); cases["eta shape"] = (a, KW, ValueError, "one element")
    a = mk(); a[5][0] = torch.tensor(1, dtype=torch.int64); cases["step dtype"] = (a, KW, TypeError, "float32 or float64")
    a = mk(); a[1][1] = a[1][1].to("meta"); cases["device"] = (a, KW, RuntimeError, "is on meta")
    a = mk(); a[2][0] = a[0][0]; cases["alias"] = (a, KW, RuntimeError, "must not share memory")
    for name, val in (("lr", -0.1), ("lambd", -1.0), ("alpha", -0.5), ("weight_decay", -1e-3)):
        cases[f"negative {name}"] = (mk(), {**KW, name: lr_t(val) if name == "lr" else val}, ValueError, f"invalid {name.replace('lr', 'learning rate')}")
    # issue 25: inf makes the step's params and state NaN (t0 = inf is allowed)
    for name in ("lr", "lambd", "alpha", "weight_decay"):
        for val in (float("inf"), float("nan")):
            cases[f"{val} {name}"] = (mk(), {**KW, name: lr_t(val) if name == "lr" else val}, ValueError, f"invalid {name.replace('lr', 'learning rate')}.*must be finite")
    cases["nan t0"] = (mk(), {**KW, "t0": float("nan")}, ValueError, "invalid t0")
    cases["grad_scale shape"] = (mk(), {**KW, "grad_scale": torch.ones(2)}, ValueError, "grad_scale must hold")
    cases["grad_scale dtype"] = (mk(), {**KW, "grad_scale": torch.ones((), dtype=torch.float64)}, TypeError, "grad_scale must be a float32")
    cases["found_inf dtype"] = (mk(), {**KW, "found_inf": torch.zeros((), dtype=torch.int32)}, TypeError, "found_inf must be a float32")
    return cases


@pytest.mark.parametrize("name", list(_bad_asgd_cases()))
def test_bad_input_raises_and_mutates_nothing(name):
    a, kw, exc, match = _bad_asgd_cases()[name]
    snap = snapshot(a)
    with pytest.raises(exc, match=match):
        ops.asgd_(*a, **kw)
    assert_unchanged(a, snap)


def _update_scale_args():
    return [torch.tensor(1024.0), torch.tensor(0, dtype=torch.int32),
            torch.tensor(1, dtype=torch.int32), torch.tensor(0.0)]


@pytest.mark.parametrize("index,bad,exc,match", [
    (0, torch.tensor(1024.0, dtype=torch.float64), TypeError, "scale must be a float32"),
    (0, torch.ones(2), ValueError, "scale must hold exactly one element"),
    (1, torch.tensor(0.0), TypeError, "growth_tracker must be an int32"),
    (2, torch.tensor(1, dtype=torch.int64), TypeError, "hysteresis_tracker must be an int32"),
    (3, torch.tensor(0, dtype=torch.int32), TypeError, "found_inf must be a float32"),
    (3, torch.zeros((), device="meta"), RuntimeError, "found_inf is on meta"),
])
def test_update_scale_bad_input(index, bad, exc, match):
    args = _update_scale_args()
    args[index] = bad
    snap = [a.clone() for a in args if not a.is_meta]
    with pytest.raises(exc, match=match):
        ops.update_scale_(*args, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    for a, b in zip([a for a in args if not a.is_meta], snap):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kwargs,match", [
    (dict(growth_factor=1.0), "growth_factor must be > 1"),
    (dict(growth_interval=0), "growth_interval must be >= 1"),
    (dict(hysteresis=0), "hysteresis must be >= 1"),
    (dict(min_scale=10.0, max_scale=1.0), "min_scale <= max_scale"),
    (dict(growth_factor=float("inf")), "growth_factor must be > 1 and finite"),
    (dict(growth_factor=float("nan")), "growth_factor must be > 1 and finite"),
    (dict(backoff_factor=float("nan")), "backoff_factor must be in"),
    (dict(min_scale=float("inf")), "min_scale must be finite"),
    (dict(max_scale=float("nan")), "max_scale must not be NaN"),
])
def test_update_scale_bad_settings(kwargs, match):
    kw = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ops.update_scale_(*_update_scale_args(), **kw)


def test_amp_ops_bad_input():
    g = [torch.randn(3), torch.randn(2)]
    with pytest.raises(TypeError, match="unsupported dtype"):
        ops.check_finite_([torch.ones(2, dtype=torch.int64)], torch.zeros(()))
    with pytest.raises(RuntimeError, match=r"tensors\[1\] is on meta"):
        ops.unscale_([g[0], torch.ones(2, device="meta")], torch.zeros(()), torch.ones(()))
    with pytest.raises(TypeError, match="inv_scale must be a float32"):
        ops.unscale_(g, torch.zeros(()), torch.ones((), dtype=torch.float64))
    with pytest.raises(ValueError, match="found_inf must hold exactly one element"):
        ops.check_finite_(g, torch.zeros(2))


@pytest.mark.parametrize("lr", [torch.ones(2), torch.tensor(-1.0), torch.tensor(1, dtype=torch.int64)])
def test_bad_tensor_lr(lr):
    a = asgd_inputs()
    snap = snapshot(a)
    with pytest.raises((ValueError, TypeError), match="lr|learning rate"):
        ops.asgd_(*a, **{**KW, "lr": lr})
    assert_unchanged(a, snap)


# --------------------------------------------------------------- AMP ops

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_check_finite_is_read_only(dtype):
    grads = [torch.randn(70000).to(dtype), torch.randn(3, 5).to(dtype).t(), torch.randn(0).to(dtype)]
    before = [g.clone() for g in grads]
    found = torch.zeros(())
    ops.check_finite_(grads, found)
    assert found.item() == 0.0
    for bad in (float("inf"), float("-inf"), float("nan")):
        for pos in (0, 65536, 69999):
            g2 = [g.clone() for g in grads]
            g2[0][pos] = bad
            found = torch.zeros(())
            ops.check_finite_(g2, found)
            assert found.item() == 1.0, (bad, pos)
    for g, b in zip(grads, before):
        assert torch.equal(g, b)
    # OR-ed: a set flag stays set
    found = torch.ones(())
    ops.check_finite_(grads, found)
    assert found.item() == 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_unscale_matches_torch(dtype):
    torch.manual_seed(0)
    grads = [torch.randn(70001).to(dtype), torch.randn(4, 6).to(dtype).t(), torch.randn(7).to(dtype)]
    grads[2][3] = float("nan")
    ref = [g.clone() for g in grads]
    inv = torch.tensor(1.0 / 3.0)
    found, ref_found = torch.zeros(()), torch.zeros(())
    ops.unscale_(grads, found, inv)
    torch._amp_foreach_non_finite_check_and_unscale_(ref, ref_found, inv)
    assert found.item() == ref_found.item() == 1.0
    for g, r in zip(grads, ref):
        assert torch.equal(g.isnan(), r.isnan())
        torch.testing.assert_close(g, r, rtol=0, atol=0, equal_nan=True)


def test_update_scale_matches_torch_rule():
    g = torch.Generator().manual_seed(0)
    found_seq = (torch.rand(300, generator=g) < 0.1).float()
    s, t = torch.tensor(2.0 ** 16), torch.tensor(0, dtype=torch.int32)
    rs, rt = s.clone(), t.clone()
    h = torch.tensor(1, dtype=torch.int32)
    for f in found_seq:
        ops.update_scale_(s, t, h, f.clone(), growth_factor=2.0, backoff_factor=0.5,
                          growth_interval=7)
        torch._amp_update_scale_(rs, rt, f.clone(), 2.0, 0.5, 7)
        assert s.item() == rs.item() and t.item() == rt.item()


def _counted_args(device="cpu"):
    return _update_scale_args() + [torch.tensor(False), torch.tensor(3, dtype=torch.int64)]


@pytest.mark.parametrize("route", ["cpu", "composite", "meta"])
def test_update_scale_counted_is_update_scale_and_the_skip_record(route):
    """The CPU kernel, and the composite kernel CUDA runs (reached on the CPU
    through its key), against update_scale_ then torch's copy_/add_ (what
    GradScaler did before), over an overflow sequence with hysteresis and
    clamps; on meta it only validates."""
    g = torch.Generator().manual_seed(0)
    found_seq = (torch.rand(200, generator=g) < 0.2).float() * torch.randint(
        1, 3, (200,), generator=g)  # found_inf counts overflows
    settings = (2.0, 0.5, 3, 2, 4.0, 2.0 ** 18)
    got = [torch.tensor(2.0 ** 16), torch.tensor(0, dtype=torch.int32),
           torch.tensor(2, dtype=torch.int32), None, torch.tensor(True),
           torch.tensor(7, dtype=torch.int64)]
    want = [t if t is None else t.clone() for t in got]
    composite = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
    if route == "meta":
        got = [t if t is None else t.to("meta") for t in got]
        ops.update_scale_.counted(*got[:3], torch.zeros((), device="meta"), *got[4:], *settings)
        return
    for f in found_seq:
        got[3], want[3] = f.clone(), f.clone()
        if route == "cpu":
            ops.update_scale_.counted(*got, *settings)
        else:
            ops.update_scale_.counted.redispatch(composite, *got, *settings)
        ops.update_scale_(*want[:4], growth_factor=2.0, backoff_factor=0.5, growth_interval=3,
                          hysteresis=2, min_scale=4.0, max_scale=2.0 ** 18)
        want[4].copy_(want[3])
        want[5].add_(want[4])
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), (got, want)
    assert got[5].item() > 7 + 10  # the sequence had overflows


@pytest.mark.parametrize("route", ["cpu", "composite", "meta"])
@pytest.mark.parametrize("index,bad,exc,match", [
    (4, torch.tensor(0.0), TypeError, "last_step_skipped must be a bool"),
    (4, torch.zeros(2, dtype=torch.bool), ValueError, "last_step_skipped must hold exactly one"),
    (5, torch.tensor(0, dtype=torch.int32), TypeError, "skipped_steps must be an int64"),
    (5, torch.zeros(2, dtype=torch.int64), ValueError, "skipped_steps must hold exactly one"),
    (5, torch.zeros((), dtype=torch.int64, device="meta"), RuntimeError, "skipped_steps is on meta"),
    (1, torch.tensor(0.0), TypeError, "growth_tracker must be an int32"),
])
def test_update_scale_counted_bad_input_writes_nothing(route, index, bad, exc, match):
    args = _counted_args()
    args[3] = torch.tensor(1.0)  # an overflow: everything would change
    args[index] = bad
    if route == "meta":
        args = [a.to("meta") for a in args]
        if index == 5 and bad.is_meta:
            pytest.skip("every tensor on meta")
    snap = [a.clone() for a in args if not a.is_meta]
    with pytest.raises(exc, match=match):
        if route == "composite":
            ops.update_scale_.counted.redispatch(
                torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd),
                *args, 2.0, 0.5, 3)
        else:
            ops.update_scale_.counted(*args, 2.0, 0.5, 3)
    for a, b in zip([a for a in args if not a.is_meta], snap):
        assert torch.equal(a, b)


def test_t0_inf_is_allowed_by_the_op():
    a = asgd_inputs()
    b = copy.deepcopy(a)
    ops.asgd_(*a, **{**KW, "t0": float("inf")})
    ops.asgd_(*b, **{**KW, "t0": 1e300})  # the same schedule: never averaging
    for x, y in zip(a, b):
        for s, t in zip(x, y):
            assert torch.equal(s, t)
    assert all(torch.isfinite(t).all() for lst in a for t in lst)


# --- The CUDA kernels' host code, driven from the CPU ------------------------
# On a GPU machine (GCC 13, torch 2.11) every bad-input message that formats a
# number crashed the process: that library held its own copy of libstdc++'s
# locale code (setup.py: links_libstdcxx_statically). Redispatching to the
# CUDA kernel with CPU tensors runs its validation here without a GPU: the
# same errors, with their numbers, must come back as exceptions.
_CUDA_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


def _cuda_host_cases():
    def lists(n=2):
        p = [torch.randn(5, 3), torch.randn(7)][:n]
        return [p, [torch.randn_like(x) for x in p], [torch.zeros_like(x) for x in p],
                [torch.ones(()) for _ in p], [torch.full((), 0.1) for _ in p],
                [torch.zeros(()) for _ in p]]

    def asgd(a, lr=0.1):
        return lambda: ops.asgd_.default.redispatch(
            _CUDA_KEY, *a, lr=torch.tensor(lr, dtype=torch.float64), lambd=1e-4, alpha=0.75,
            t0=0.0, weight_decay=0.0, maximize=False)

    a = lists()
    a[1].pop()
    yield "asgd_ lists of different lengths", asgd(a), ValueError, r"same length, got 2, 1, 2"
    yield "asgd_ negative lr", asgd(lists(), lr=-1.0), ValueError, r"invalid learning rate: -1"
    found2 = torch.zeros(2)
    yield ("check_finite_ 2-element found_inf",
           lambda: ops.check_finite_.default.redispatch(_CUDA_KEY, [torch.ones(3)], found2),
           ValueError, r"exactly one element, got shape \[2\]")
    def norms(tensors, ord=2.0, inv_scale=None, found_inf=None):
        return lambda: ops.tensor_norms.default.redispatch(_CUDA_KEY, tensors, ord, inv_scale,
                                                           found_inf)

    yield ("tensor_norms -inf norm of an empty tensor",
           norms([torch.randn(3), torch.zeros(0)], float("-inf")), RuntimeError,
           r"tensors\[1\] is empty: the -inf norm")
    yield ("tensor_norms 2-element inv_scale",
           norms([torch.randn(3)], 2.0, torch.ones(2)), ValueError,
           r"exactly one element, got shape \[2\]")
    yield ("tensor_norms float64 found_inf",
           norms([torch.randn(3)], 2.0, None, torch.zeros((), dtype=torch.float64)), TypeError,
           "found_inf")
    # Valid arguments pass validation and stop where the kernel needs the
    # device: CPU tensors given to the CUDA kernel.
    yield ("tensor_norms valid arguments reach the device",
           norms([torch.randn(3), torch.randn(2, dtype=torch.complex64)], 2.0,
                 torch.ones(()), torch.zeros(())),
           RuntimeError, "CUDAGuardImpl initialized with non-CUDA DeviceType: cpu")
    g = [torch.randn(4), torch.ones(3, dtype=torch.int64)]
    yield ("unscale_ integer tensor after a valid one",
           lambda: ops.unscale_.default.redispatch(_CUDA_KEY, g, torch.zeros(()),
                                                   torch.full((), 0.5)),
           TypeError, r"tensors\[1\] has unsupported dtype Long")


@pytest.mark.skipif(not torchext.has_cuda_kernels(), reason="built without the CUDA kernels")
@pytest.mark.parametrize("case", [c[0] for c in _cuda_host_cases()])
def test_cuda_kernels_host_validation_raises(case):
    _, call, exc, match = next(c for c in _cuda_host_cases() if c[0] == case)
    with pytest.raises(exc, match=match):
        call()


def test_library_shares_the_process_libstdcxx():
    """No second copy of libstdc++ inside the library (see above): its
    number formatting must be the shared library's."""
    import shutil
    import subprocess
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) not on PATH")
    lib = torchext.library_path
    syms = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                          check=True).stdout
    assert "_ZNSo9_M_insertImEERSoT_" not in syms, (
        f"{lib} defines libstdc++'s ostream inserters itself (libstdc++ linked statically)")
