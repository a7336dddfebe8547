"""Gradient clipping: torchext.nn.utils' drop-ins against torch.nn.utils (and
float64), and the fused clips (GradScaler.clip_grad_norm_, ASGD.clip_grad_norm_)
against torch's recipe (unscale_, clip_grad_norm_, step) with the same
optimizer, over runs with overflows and active clipping."""
import copy
import math

import pytest
import torch

import torchext
from torch.amp.grad_scaler import OptState
from torchext.amp import GradScaler
from torchext.nn.utils import clip_grad_norm_, clip_grads_with_norm_, get_total_norm
from helpers import NoHostSync, data, rel_err, small_model

ORDERS = [2.0, 1.0, 0.0, 3.0, 0.5, -1.0, -2.5, math.inf, -math.inf]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64]
# Each dtype's own rounding: the per-tensor norms are summed in a different
# order than torch's (more precisely: blocks of 1024 in float, then double).
TOL = {torch.float32: 2e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.6e-2,
       torch.complex64: 2e-5}


def params_with_grads(dtype, seed=0, shapes=((7,), (3, 70000), (5, 4), (1,))):
    g = torch.Generator().manual_seed(seed)
    ps = []
    for s in shapes:
        p = torch.nn.Parameter(torch.randn(s, generator=g, dtype=torch.float64).to(dtype))
        p.grad = (3 * torch.randn(s, generator=g, dtype=torch.float64)).to(dtype)
        ps.append(p)
    ps[2].grad = ps[2].grad.t().contiguous().t()  # a non-contiguous grad
    return ps


def twins(ps):
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    for p, q in zip(ps, qs):
        q.grad = None if p.grad is None else p.grad.clone()
    return qs


def close(a, b, tol):
    if a.isnan().all() and b.isnan().all():
        return True
    if a.isinf().any() or b.isinf().any():
        return torch.equal(a, b)
    return rel_err(a, b) <= tol


# ----------------------------------------------------------- the drop-ins

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ORDERS)
def test_clip_grad_norm_matches_torch(dtype, order):
    ps = params_with_grads(dtype)
    qs = twins(ps)
    expected = torch.nn.utils.clip_grad_norm_(ps, 0.7, order)
    got = clip_grad_norm_(qs, 0.7, order)
    assert got.dtype == expected.dtype and got.device == expected.device
    assert close(got, expected, TOL[dtype]), (got, expected)
    for p, q in zip(ps, qs):
        assert close(q.grad, p.grad, TOL[dtype])


@pytest.mark.parametrize("order", ORDERS)
def test_total_norm_is_float64_accurate(order):
    """Against float64: torchext's fp32 norms are at least as close as torch's."""
    ps = params_with_grads(torch.float32)
    exact = get_total_norm([p.grad.double() for p in ps], order)
    ours = get_total_norm([p.grad for p in ps], order).double()
    theirs = torch.nn.utils.get_total_norm([p.grad for p in ps], order).double()
    assert rel_err(ours, exact) <= max(1e-6, rel_err(theirs, exact))


def test_inputs_torch_takes():
    # A single tensor, a generator, no grads, None grads, mixed dtypes.
    g = torch.Generator().manual_seed(3)
    p = torch.nn.Parameter(torch.randn(5, generator=g))
    p.grad = torch.randn(5, generator=g)
    q = copy.deepcopy(p)
    q.grad = p.grad.clone()
    # (the norms may differ in their last bit: another summation order)
    assert close(clip_grad_norm_(p, 0.1), torch.nn.utils.clip_grad_norm_(q, 0.1), 2e-7)
    assert close(p.grad, q.grad, 2e-7)
    ps = params_with_grads(torch.float32)
    qs = twins(ps)
    assert close(clip_grad_norm_(iter(ps), 1.0), torch.nn.utils.clip_grad_norm_(iter(qs), 1.0),
                 2e-5)
    none = [torch.nn.Parameter(torch.ones(3))]
    assert torch.equal(clip_grad_norm_(none, 1.0), torch.nn.utils.clip_grad_norm_(none, 1.0))
    with pytest.warns(UserWarning, match="empty generator"):
        clip_grad_norm_((x for x in []), 1.0)
    mixed = params_with_grads(torch.float32) + params_with_grads(torch.bfloat16, seed=1)
    mixed[1].grad = None
    twin = twins(mixed)
    expected = torch.nn.utils.clip_grad_norm_(mixed, 1.0)
    got = clip_grad_norm_(twin, 1.0)
    assert got.dtype == expected.dtype == torch.float32
    assert close(got, expected, 2e-5)
    assert torch.equal(get_total_norm([]), torch.nn.utils.get_total_norm([]))


def test_overflowing_norm_of_finite_fp16_grads_clips_to_zero_as_torch():
    p = torch.nn.Parameter(torch.zeros(10, dtype=torch.float16))
    p.grad = torch.full((10,), 6e4, dtype=torch.float16)
    q = twins([p])[0]
    expected = torch.nn.utils.clip_grad_norm_([q], 1.0)
    got = clip_grad_norm_([p], 1.0)
    assert got.isinf() and expected.isinf() and got.dtype == torch.float16
    assert torch.equal(p.grad, q.grad) and (p.grad == 0).all()


def test_foreach_true_on_a_device_without_foreach_raises_as_torch():
    p = torch.nn.Parameter(torch.ones(3, device="meta"))
    p.grad = torch.ones(3, device="meta")
    for fn in (torch.nn.utils.clip_grad_norm_, clip_grad_norm_):
        with pytest.raises(RuntimeError, match="foreach=True was passed, but can't use the "
                                               "foreach API on meta tensors"):
            fn([p], 1.0, foreach=True)


def test_clip_grads_with_norm_and_nonfinite_error():
    ps = params_with_grads(torch.float32)
    qs = twins(ps)
    total = get_total_norm([p.grad for p in ps])
    clip_grads_with_norm_(ps, 2.0, total)
    torch.nn.utils.clip_grads_with_norm_(qs, 2.0, total)
    for p, q in zip(ps, qs):
        assert torch.equal(p.grad, q.grad)
    ps[0].grad[0] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(ps, 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_(twins(ps), 1.0, error_if_nonfinite=True)


def test_refusals_and_what_goes_to_torch():
    # An order with no identity on an empty tensor: torch refuses, so do we,
    # before any gradient is written.
    ps = params_with_grads(torch.float32) + [torch.nn.Parameter(torch.zeros(0))]
    ps[-1].grad = torch.zeros(0)
    before = [p.grad.clone() for p in ps]
    for fn in (torch.nn.utils.clip_grad_norm_, clip_grad_norm_):
        with pytest.raises(RuntimeError, match="empty"):
            fn(ps, 0.1, -math.inf)
    assert all(torch.equal(b, p.grad) for b, p in zip(before, ps))
    # Sparse grads: torch's own function, whatever it does (older torch
    # releases have no sparse vector_norm and raise NotImplementedError).
    e1, e2 = torch.nn.Embedding(10, 3, sparse=True), torch.nn.Embedding(10, 3, sparse=True)
    e2.load_state_dict(e1.state_dict())
    for e in (e1, e2):
        e(torch.tensor([1, 2, 2])).sum().backward()
    try:
        expected = torch.nn.utils.clip_grad_norm_(e2.parameters(), 0.1)
    except NotImplementedError:
        with pytest.raises(NotImplementedError):
            clip_grad_norm_(e1.parameters(), 0.1)
    else:
        assert torch.equal(clip_grad_norm_(e1.parameters(), 0.1), expected)


def test_norm_op_reads_once_and_checks():
    """tensor_norms with inv_scale/found_inf: the norms of the unscaled grads
    (as unscale_ would store them) and unscale_'s inf check."""
    grads = [p.grad for p in params_with_grads(torch.float32)]
    inv = torch.tensor(2.0 ** -10)
    found = torch.zeros(())
    norms = torch.ops.torchext.tensor_norms(grads, 2.0, inv, found)
    expected = torch.stack(torch._foreach_norm([g * inv for g in grads], 2.0))
    assert rel_err(norms, expected) <= 2e-6 and found.item() == 0
    grads[1][0, 5] = float("inf")
    norms = torch.ops.torchext.tensor_norms(grads, 2.0, inv, found)
    assert found.item() == 1 and norms[1].isinf()
    # A norm that overflows is not an inf/NaN element: found_inf stays 0.
    found.zero_()
    big = [torch.full((10,), 6e4, dtype=torch.float16)]
    assert torch.ops.torchext.tensor_norms(big, 2.0, None, found).isinf().all()
    assert found.item() == 0


# ------------------------------------------------- the fused loop vs torch

INF_STEPS = {3: float("inf"), 9: float("nan")}


def run_loop(opt_kind, side, steps=20, max_norm=0.05, order=2.0, after_unscale=False,
             enabled=True):
    model = small_model()
    x, y = data()
    if opt_kind == "asgd":
        opt = (torch.optim.ASGD(model.parameters(), lr=0.05, t0=5, foreach=False)
               if side == "torch" else torchext.optim.ASGD(model.parameters(), lr=0.05, t0=5))
    elif opt_kind == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    kw = dict(init_scale=2.0 ** 10, growth_interval=4, enabled=enabled)
    scaler = torch.amp.GradScaler("cpu", **kw) if side == "torch" else GradScaler(**kw)
    norms, scales = [], []
    for i in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if i in INF_STEPS:
            next(model.parameters()).grad.view(-1)[1] = INF_STEPS[i]
        if side == "torch":
            scaler.unscale_(opt)
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, order))
        else:
            if after_unscale:
                scaler.unscale_(opt)
            norms.append(scaler.clip_grad_norm_(opt, max_norm, order))
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return model, opt, torch.stack(norms), scales


def same_norms(got, expected, tol=1e-5):
    assert got.dtype == expected.dtype
    assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.isinf(), expected.isinf())
    fin = expected.isfinite()
    assert rel_err(got[fin], expected[fin]) <= tol


@pytest.mark.parametrize("opt_kind", ["asgd", "adamw", "sgd"])
@pytest.mark.parametrize("after_unscale", [False, True])
def test_fused_clip_matches_torchs_recipe(opt_kind, after_unscale):
    m1, o1, n1, s1 = run_loop(opt_kind, "torch")
    m2, o2, n2, s2 = run_loop(opt_kind, "torchext", after_unscale=after_unscale)
    same_norms(n2, n1)
    assert (n1[n1.isfinite()] > 0.05).all()  # clipping was active on every finite step
    assert s1 == s2 and len(set(s1)) > 2  # same skips, the scale moved both ways
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-5
    if opt_kind == "asgd":
        p = next(m2.parameters())
        assert o2.state[p]["step"].item() == 20 - len(INF_STEPS)


@pytest.mark.parametrize("order", [1.0, math.inf, 0.0])
def test_fused_clip_other_orders(order):
    m1, _, n1, s1 = run_loop("asgd", "torch", order=order, max_norm=0.5)
    m2, _, n2, s2 = run_loop("asgd", "torchext", order=order, max_norm=0.5)
    same_norms(n2, n1)
    assert s1 == s2
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-5


def test_disabled_scaler_clips_like_torch():
    # (steps before the first injected inf: a disabled scaler skips nothing)
    m1, _, n1, _ = run_loop("asgd", "torch", enabled=False, steps=3)
    m2, _, n2, _ = run_loop("asgd", "torchext", enabled=False, steps=3)
    same_norms(n2, n1)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-5


def test_clip_and_step_leaves_the_grads_scaled_and_reads_nothing_on_the_host():
    """The fold (clip_and_step) with torchext's ASGD: the grads are read once
    and not written; the two-call clip writes them (torch's recipe's values).
    Neither reads anything on the host with capturable=True."""
    model = small_model()
    x, y = data()
    opt = torchext.optim.ASGD(model.parameters(), lr=0.05, capturable=True)
    scaler = GradScaler(init_scale=2.0 ** 10)
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    with NoHostSync():
        scaler.clip_and_step(opt, 0.01)
        scaler.update()
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert opt.state[next(model.parameters())]["step"].item() == 1
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    with NoHostSync():
        scaler.clip_grad_norm_(opt, 0.01)
        scaler.step(opt)
        scaler.update()
    assert opt.state[next(model.parameters())]["step"].item() == 2


def test_fused_clip_misuse_and_refusals_change_nothing():
    model = small_model()
    x, y = data()
    opt = torchext.optim.ASGD(model.parameters(), lr=0.05)
    scaler = GradScaler(init_scale=2.0 ** 10)
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    with pytest.raises(AssertionError, match="_scale is None"):
        GradScaler().clip_grad_norm_(opt, 1.0)
    # A non-finite norm refused as torch's recipe refuses it, after its
    # unscale_: the inf check is recorded and the grads are unscaled (not
    # clipped), as torch's unscale_ leaves them.
    p0 = next(model.parameters())
    p0.grad.view(-1)[0] = float("nan")
    grads = [p.grad.clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="non-finite"):
        scaler.clip_grad_norm_(opt, 1.0, error_if_nonfinite=True)
    assert scaler.stage(opt) is OptState.UNSCALED and scaler.found_inf(opt).item() == 1
    assert all(torch.allclose(g * 2.0 ** -10, p.grad, rtol=0, atol=0, equal_nan=True)
               for g, p in zip(grads, model.parameters()))
    scaler.clip_grad_norm_(opt, 1.0)  # a second clip: after the first's unscale
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)  # the clip unscaled (as torch's recipe does first)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.clip_grad_norm_(opt, 1.0)
    scaler.update()
    assert scaler.was_step_skipped()
    # fp16 grads: refused as torch's unscale_ refuses them.
    h = torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))
    h.grad = torch.ones(3, dtype=torch.float16)
    opt16 = torch.optim.SGD([h], lr=0.1)
    scaler.scale(torch.ones(()))
    with pytest.raises(ValueError, match="FP16"):
        scaler.clip_grad_norm_(opt16, 1.0)
    assert id(opt16) not in scaler._per_optimizer_states


def test_optimizer_clip_without_scaler_matches_torch():
    """fp32 training: ASGD.clip_grad_norm_ clips the grads as torch's does."""
    m1, m2 = small_model(), small_model()
    o1 = torch.optim.ASGD(m1.parameters(), lr=0.05, t0=3, foreach=False)
    o2 = torchext.optim.ASGD(m2.parameters(), lr=0.05, t0=3)
    x, y = data()
    for _ in range(10):
        for m, o in ((m1, o1), (m2, o2)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
        n1 = torch.nn.utils.clip_grad_norm_(m1.parameters(), 0.05)
        n2 = o2.clip_grad_norm_(0.05)
        assert rel_err(n2, n1) <= 1e-6 and n1 > 0.05
        for p1, p2 in zip(m1.parameters(), m2.parameters()):
            assert rel_err(p2.grad, p1.grad) <= 1e-6
        o1.step()
        o2.step()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-5
