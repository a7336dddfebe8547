"""``clip_and_step``: the clip measured and folded into the step in one call,
against torch's recipe (``unscale_``, ``torch.nn.utils.clip_grad_norm_``,
``step``), within the fold's tolerance (two float32 roundings: 1e-5 relative
at tensor scale after a few steps). Params and optimizer state are compared,
not gradients (a folded clip leaves them unclipped), except in the test that
says what each kind of optimizer leaves in them. Also: torch's hook
arguments, and torch's private scaler methods' signatures.
"""
import inspect

import pytest
import torch

import torchext
from torchext.amp import OptState

TOL = 1e-5


def _close(a, b, what, tol=TOL):
    a, b = a.detach().double(), b.detach().double()
    assert torch.equal(a.isnan(), b.isnan()), what
    a, b = a.nan_to_num(), b.nan_to_num()
    scale = b.abs().max().clamp_min(1e-30)
    err = ((a - b).abs().max() / scale).item()
    assert err <= tol, f"{what}: relative error {err:.3g}"


def _model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3)).to(dtype)


ASGD_KW = dict(lr=0.05, lambd=1e-3, t0=2.0, weight_decay=1e-3)


def _opt(kind, params, ours):
    if kind == "asgd":
        return (torchext.optim.ASGD(params, **ASGD_KW) if ours
                else torch.optim.ASGD(params, foreach=False, **ASGD_KW))
    if kind == "adamw-fused":
        return torch.optim.AdamW(params, lr=1e-2, fused=True)
    if kind == "sgd-fused":
        return torch.optim.SGD(params, lr=0.05, fused=True)
    if kind == "sgd-foreach":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=True)
    raise ValueError(kind)


def _batch(it, dtype=torch.float32):
    g = torch.Generator().manual_seed(it)
    return torch.randn(16, 6, generator=g).to(dtype), torch.randn(16, 3, generator=g).to(dtype)


def _compare_opts(o1, o2, m1, m2, what, tol=TOL):
    for i, (p, q) in enumerate(zip(m1.parameters(), m2.parameters())):
        _close(p, q, f"{what}: param {i}", tol)
        s1, s2 = o1.state.get(p, {}), o2.state.get(q, {})
        assert set(s1) == set(s2), what
        for k, v in s2.items():
            if isinstance(v, torch.Tensor):
                _close(s1[k].reshape(v.shape).to(v.dtype), v, f"{what}: state {k}", tol)


KINDS = ["asgd", "adamw-fused", "sgd-fused", "sgd-foreach"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("init_scale", [2.0 ** 16, 2.0 ** 127])
def test_clip_and_step_matches_torchs_recipe(kind, init_scale):
    ms = [_model(), _model()]
    opts = [_opt(kind, ms[0].parameters(), True), _opt(kind, ms[1].parameters(), False)]
    scalers = [torchext.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=2),
               torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=2)]
    for it in range(8):
        x, y = _batch(it)
        max_norm = [0.05, 1e-3, 10.0, float("inf")][it % 4]
        mult = 1e30 if it == 5 else 1.0  # an overflow at the top scales
        norms = []
        for k, (m, o, s) in enumerate(zip(ms, opts, scalers)):
            o.zero_grad()
            s.scale(torch.nn.functional.mse_loss(m(x), y) * mult).backward()
            if it == 3:
                next(iter(m.parameters())).grad.view(-1)[0] = float("nan")
            if k == 0:
                norm, _ = s.clip_and_step(o, max_norm)
            else:
                s.unscale_(o)
                norm = (torch.nn.utils.clip_grad_norm_(list(m.parameters()), max_norm)
                        if max_norm != float("inf") else torch.nn.utils.get_total_norm(
                            [p.grad for p in m.parameters()]))
                s.step(o)
            norms.append(norm)
            s.update()
        _close(norms[0].reshape(1), norms[1].reshape(1), f"it {it}: norm")
        _compare_opts(opts[0], opts[1], ms[0], ms[1], f"{kind} it {it}")
        assert scalers[0].get_scale() == scalers[1].get_scale()


def test_clip_and_step_after_unscale_and_after_a_two_call_clip():
    # It measures the gradients as they are and clips again; no second unscale.
    for first in ("unscale_", "clip"):
        ms = [_model(), _model()]
        opts = [_opt("asgd", ms[0].parameters(), True), _opt("asgd", ms[1].parameters(), False)]
        scalers = [torchext.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu")]
        for it in range(3):
            x, y = _batch(it)
            for k, (m, o, s) in enumerate(zip(ms, opts, scalers)):
                o.zero_grad()
                s.scale(torch.nn.functional.mse_loss(m(x), y)).backward()
                if k == 0:
                    if first == "unscale_":
                        s.unscale_(o)
                    else:
                        s.clip_grad_norm_(o, 0.2)
                    s.clip_and_step(o, 0.05)
                else:
                    s.unscale_(o)
                    if first == "clip":
                        torch.nn.utils.clip_grad_norm_(list(m.parameters()), 0.2)
                    torch.nn.utils.clip_grad_norm_(list(m.parameters()), 0.05)
                    s.step(o)
                s.update()
            _compare_opts(opts[0], opts[1], ms[0], ms[1], f"after {first}, it {it}")


def test_without_a_scaler_and_with_a_disabled_one():
    for how in ("opt", "disabled scaler"):
        ms = [_model(), _model()]
        opts = [_opt("asgd", ms[0].parameters(), True), _opt("asgd", ms[1].parameters(), False)]
        off = torchext.amp.GradScaler("cpu", enabled=False)
        for it in range(4):
            x, y = _batch(it)
            for k, (m, o) in enumerate(zip(ms, opts)):
                o.zero_grad()
                torch.nn.functional.mse_loss(m(x), y).backward()
                if k == 0:
                    res = (o.clip_and_step(0.05) if how == "opt" else off.clip_and_step(o, 0.05))
                    assert res.result is None and res.total_norm.dim() == 0
                else:
                    torch.nn.utils.clip_grad_norm_(list(m.parameters()), 0.05)
                    o.step()
            _compare_opts(opts[0], opts[1], ms[0], ms[1], f"{how} it {it}")
    # A foreign optimizer on a disabled scaler: clipped, then stepped.
    ms = [_model(), _model()]
    opts = [_opt("sgd-foreach", ms[0].parameters(), True),
            _opt("sgd-foreach", ms[1].parameters(), False)]
    x, y = _batch(0)
    for k, (m, o) in enumerate(zip(ms, opts)):
        torch.nn.functional.mse_loss(m(x), y).backward()
        if k == 0:
            off.clip_and_step(o, 0.05)
        else:
            torch.nn.utils.clip_grad_norm_(list(m.parameters()), 0.05)
            o.step()
    _compare_opts(opts[0], opts[1], ms[0], ms[1], "foreign optimizer, disabled scaler")


def test_closure_and_step_pre_hooks():
    """With a closure the clip measures what the closure made, after the
    pre-hooks ran; without one, pre-hooks see torch's (clipped) values."""
    for closure in (True, False):
        seen = {True: [], False: []}
        ms = [_model(), _model()]
        opts = [_opt("asgd", ms[0].parameters(), True), _opt("asgd", ms[1].parameters(), False)]
        for ours, o in zip((True, False), opts):
            o.register_step_pre_hook(lambda opt, a, kw, ours=ours: seen[ours].append(
                [p.grad.clone() if p.grad is not None else None
                 for g in opt.param_groups for p in g["params"]]))
        for it in range(3):
            x, y = _batch(it)
            for k, (m, o) in enumerate(zip(ms, opts)):
                def fn(m=m, o=o, k=k):
                    o.zero_grad()
                    loss = torch.nn.functional.mse_loss(m(x), y)
                    loss.backward()
                    if k == 1:  # torch's recipe clips inside the closure
                        torch.nn.utils.clip_grad_norm_(list(m.parameters()), 0.05)
                    return loss
                if k == 0:
                    if closure:
                        total, loss = o.clip_and_step(0.05, closure=fn)
                        assert loss is not None
                    else:
                        o.zero_grad()
                        torch.nn.functional.mse_loss(m(x), y).backward()
                        o.clip_and_step(0.05)
                elif closure:
                    o.step(fn)
                else:
                    fn()
                    o.step()
            _compare_opts(opts[0], opts[1], ms[0], ms[1], f"closure={closure} it {it}")
        if not closure:  # the hooks saw the same (clipped) grads
            for a, b in zip(seen[True], seen[False]):
                for ga, gb in zip(a, b):
                    assert (ga is None) == (gb is None)
                    if ga is not None:
                        _close(ga, gb, "grads a pre-hook saw")


def test_scaler_clip_and_step_with_a_pre_hook_applies_the_clip_first():
    ms = [_model(), _model()]
    opts = [_opt("adamw-fused", ms[0].parameters(), True),
            _opt("adamw-fused", ms[1].parameters(), False)]
    scalers = [torchext.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu")]
    seen = []
    for o in opts:
        o.register_step_pre_hook(lambda opt, a, kw: seen.append(
            torch.cat([p.grad.reshape(-1) for g in opt.param_groups for p in g["params"]])))
    x, y = _batch(0)
    for k, (m, o, s) in enumerate(zip(ms, opts, scalers)):
        s.scale(torch.nn.functional.mse_loss(m(x), y)).backward()
        if k == 0:
            s.clip_and_step(o, 0.05)
        else:
            s.unscale_(o)
            torch.nn.utils.clip_grad_norm_(list(m.parameters()), 0.05)
            s.step(o)
    _close(seen[0], seen[1], "a pre-hook's view of the grads")
    _compare_opts(opts[0], opts[1], ms[0], ms[1], "pre-hook")


def test_two_optimizers_and_the_joint_clip():
    def world(ours):
        m = _model()
        ps = list(m.parameters())
        return m, [_opt("asgd", ps[:2], ours), _opt("adamw-fused", ps[2:], ours)], (
            torchext.amp.GradScaler("cpu") if ours else torch.amp.GradScaler("cpu"))

    for joint in (False, True):
        w = [world(True), world(False)]
        for it in range(3):
            x, y = _batch(it)
            for k, (m, opts, s) in enumerate(w):
                for o in opts:
                    o.zero_grad()
                s.scale(torch.nn.functional.mse_loss(m(x), y)).backward()
                if k == 0 and joint:
                    s.clip_grad_norm_(opts, 0.05)
                    for o in opts:
                        s.step(o)
                elif k == 0:
                    s.clip_and_step(opts[0], 0.05)
                    s.clip_and_step(opts[1], 0.02)
                else:
                    for o in opts:
                        s.unscale_(o)
                    ps = list(m.parameters())
                    if joint:
                        torch.nn.utils.clip_grad_norm_(ps, 0.05)
                    else:
                        torch.nn.utils.clip_grad_norm_(ps[:2], 0.05)
                        torch.nn.utils.clip_grad_norm_(ps[2:], 0.02)
                    for o in opts:
                        s.step(o)
                s.update()
            for p, q in zip(w[0][0].parameters(), w[1][0].parameters()):
                _close(p, q, f"joint={joint} it {it}")


def test_bf16_params_against_float64():
    # bf16 grads (pure bf16 training): torchext's fold, torch's recipe and a
    # float64 run of torch's recipe. Both bf16 runs stay within bf16's
    # rounding of each other.
    ms = [_model(torch.bfloat16), _model(torch.bfloat16)]
    opts = [_opt("asgd", ms[0].parameters(), True), _opt("asgd", ms[1].parameters(), False)]
    scalers = [torchext.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu")]
    for it in range(4):
        x, y = _batch(it, torch.bfloat16)
        for k, (m, o, s) in enumerate(zip(ms, opts, scalers)):
            o.zero_grad()
            s.scale(torch.nn.functional.mse_loss(m(x), y)).backward()
            if k == 0:
                s.clip_and_step(o, 0.05)
            else:
                s.unscale_(o)
                torch.nn.utils.clip_grad_norm_(list(m.parameters()), 0.05)
                s.step(o)
            s.update()
    for p, q in zip(ms[0].parameters(), ms[1].parameters()):
        _close(p, q, "bf16 params", tol=2.0 ** -7)


def test_fp16_grads_with_allow_fp16_against_an_emulated_recipe():
    # torch's unscale_ refuses fp16 grads: the reference emulates its recipe
    # (unscale in float32 stored in fp16, then the clip in fp16 as torch's
    # clip_grads_with_norm_ multiplies).
    m0, m1 = _model(torch.float16), _model(torch.float16)
    o0 = _opt("asgd", m0.parameters(), True)
    o1 = _opt("asgd", m1.parameters(), False)
    s0 = torchext.amp.GradScaler("cpu", allow_fp16=True, init_scale=2.0 ** 8)
    scale = 2.0 ** 8
    for it in range(3):
        x, y = _batch(it, torch.float16)
        o0.zero_grad()
        s0.scale(torch.nn.functional.mse_loss(m0(x).float(), y.float())).backward()
        s0.clip_and_step(o0, 0.05)
        s0.update()
        o1.zero_grad()
        (torch.nn.functional.mse_loss(m1(x).float(), y.float()) * scale).backward()
        grads = [p.grad for p in m1.parameters()]
        for g in grads:
            g.copy_((g.float() * (1.0 / scale)).half())
        torch.nn.utils.clip_grad_norm_(list(m1.parameters()), 0.05)
        o1.step()
    for p, q in zip(m0.parameters(), m1.parameters()):
        _close(p, q, "fp16 params", tol=2.0 ** -9)


def test_error_if_nonfinite_leaves_torchs_record():
    ms = [_model(), _model()]
    opts = [_opt("asgd", ms[0].parameters(), True), _opt("asgd", ms[1].parameters(), False)]
    scalers = [torchext.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu")]
    x, y = _batch(0)
    for k, (m, o, s) in enumerate(zip(ms, opts, scalers)):
        s.scale(torch.nn.functional.mse_loss(m(x), y)).backward()
        next(iter(m.parameters())).grad.view(-1)[0] = float("inf")
        with pytest.raises(RuntimeError, match="non-finite"):
            if k == 0:
                s.clip_and_step(o, 0.05, error_if_nonfinite=True)
            else:
                s.unscale_(o)
                torch.nn.utils.clip_grad_norm_(list(m.parameters()), 0.05,
                                               error_if_nonfinite=True)
        st = s._per_optimizer_states[id(o)]
        assert st["stage"] is OptState.UNSCALED
        assert sum(f.item() for f in st["found_inf_per_device"].values()) > 0
        s.step(o)  # skipped
        s.update()
    assert scalers[0].get_scale() == scalers[1].get_scale() == 2.0 ** 15
    for p, q in zip(ms[0].parameters(), ms[1].parameters()):
        _close(p.grad, q.grad, "grads left by the refused clip")
        _close(p, q, "params")


class _FailOnce(torch.optim.SGD):
    """A plain optimizer whose step raises once, before it writes."""
    armed = False

    def step(self, closure=None):
        if self.armed:
            self.armed = False
            raise RuntimeError("injected failure")
        return super().step(closure)


def test_a_step_that_raises_then_the_retry():
    # A plain optimizer: the pass wrote the grads, so the record says
    # UNSCALED, and scaler.step retries without clipping twice.
    ms = [_model(), _model()]
    o0 = _FailOnce(ms[0].parameters(), lr=0.05, foreach=False)
    o1 = torch.optim.SGD(ms[1].parameters(), lr=0.05, foreach=False)
    s0, s1 = torchext.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu")
    x, y = _batch(0)
    s0.scale(torch.nn.functional.mse_loss(ms[0](x), y)).backward()
    o0.armed = True
    with pytest.raises(RuntimeError, match="injected failure"):
        s0.clip_and_step(o0, 0.05)
    assert s0._per_optimizer_states[id(o0)]["stage"] is OptState.UNSCALED
    s0.step(o0)  # the retry
    s0.update()
    s1.scale(torch.nn.functional.mse_loss(ms[1](x), y)).backward()
    s1.unscale_(o1)
    torch.nn.utils.clip_grad_norm_(list(ms[1].parameters()), 0.05)
    s1.step(o1)
    s1.update()
    for p, q in zip(ms[0].parameters(), ms[1].parameters()):
        _close(p, q, "plain optimizer, retried")

    # torchext's ASGD (the fold): a step that raises before it writes
    # changes nothing, and clip_and_step itself is retried.
    ms = [_model(), _model()]
    o0, o1 = _opt("asgd", ms[0].parameters(), True), _opt("asgd", ms[1].parameters(), False)
    s0, s1 = torchext.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu")
    s0.scale(torch.nn.functional.mse_loss(ms[0](x), y)).backward()
    before = [p.grad.clone() for p in ms[0].parameters()]
    real = o0._run_step

    def fail(*a, **k):
        o0._run_step = real
        raise RuntimeError("injected failure")

    o0._run_step = fail
    with pytest.raises(RuntimeError, match="injected failure"):
        s0.clip_and_step(o0, 0.05)
    assert id(o0) not in s0._per_optimizer_states
    for p, g in zip(ms[0].parameters(), before):
        assert torch.equal(p.grad, g)
    s0.clip_and_step(o0, 0.05)
    s0.update()
    s1.scale(torch.nn.functional.mse_loss(ms[1](x), y)).backward()
    s1.unscale_(o1)
    torch.nn.utils.clip_grad_norm_(list(ms[1].parameters()), 0.05)
    s1.step(o1)
    _compare_opts(o0, o1, ms[0], ms[1], "ASGD, retried")


@pytest.mark.parametrize("kind", ["asgd", "adamw-fused", "sgd-foreach"])
def test_what_the_grads_hold_afterwards(kind):
    """torchext's ASGD: scaled and unclipped; torch's fused optimizers: what
    they write back (grad / grad_scale); plain ones: unscaled and clipped
    (torch's recipe's)."""
    m, ref = _model(), _model()
    o = _opt(kind, m.parameters(), True)
    s = torchext.amp.GradScaler("cpu")
    x, y = _batch(0)
    s.scale(torch.nn.functional.mse_loss(m(x), y)).backward()
    scaled = [p.grad.clone() for p in m.parameters()]
    s.clip_and_step(o, 0.05)
    (torch.nn.functional.mse_loss(ref(x), y) * s.get_scale()).backward()
    for p in ref.parameters():
        p.grad.mul_(1.0 / s.get_scale())
    torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 0.05)
    for p, g, r in zip(m.parameters(), scaled, ref.parameters()):
        if kind == "asgd":
            assert torch.equal(p.grad, g)
        else:
            _close(p.grad, r.grad, f"{kind}: grads after clip_and_step")


def test_hook_arguments_are_torchs():
    """Pre- and post-hooks get the args torch's step wrapper gives them (the
    optimizer first), for step() and step(closure), and a pre-hook may
    replace them."""
    calls = {}
    for ours in (True, False):
        m = _model()
        o = _opt("asgd", m.parameters(), ours)
        got = calls[ours] = []
        o.register_step_pre_hook(lambda opt, a, kw: got.append(
            ("pre", len(a), a[0] is opt, sorted(kw))))
        o.register_step_post_hook(lambda opt, a, kw: got.append(
            ("post", len(a), a[0] is opt, sorted(kw))))
        x, y = _batch(0)

        def closure():
            o.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            return loss

        closure()
        o.step()
        o.step(closure)
        o.step(closure=closure)
        # A pre-hook that replaces the arguments (the closure) as torch allows.
        h = o.register_step_pre_hook(lambda opt, a, kw: ((a[0],), {"closure": closure}))
        assert o.step() is not None
        h.remove()
    assert calls[True] == calls[False]


# torch's private GradScaler methods that its tests and subclasses
# (ShardedGradScaler) call or override: where torchext defines one, its
# parameters are torch's.
PRIVATE = ["_unscale_grads_", "_check_inf_per_device", "_found_inf_per_device",
           "_maybe_opt_step", "_lazy_init_scale_growth_tracker", "_check_scale_growth_tracker",
           "_get_growth_tracker", "_get_scale_async"]


def test_private_scaler_methods_keep_torchs_signatures():
    ours = torchext.amp.GradScaler
    checked = 0
    for name in PRIVATE:
        theirs = getattr(torch.amp.GradScaler, name, None)
        if theirs is None or name not in vars(ours):
            continue
        a = list(inspect.signature(getattr(ours, name)).parameters)
        b = list(inspect.signature(theirs).parameters)
        assert a == b, (name, a, b)
        checked += 1
    assert checked >= 3
    # Called as torch's own test_grad_scaling_unscale_* call it.
    s = torchext.amp.GradScaler("cpu")
    p = torch.nn.Parameter(torch.ones(4))
    p.grad = torch.full((4,), 4.0)
    p.grad[1] = float("inf")
    opt = torch.optim.SGD([p], lr=1.0)
    inv_scale = torch.full((1,), 0.25)
    found_inf = torch.zeros((1,))
    found = s._unscale_grads_(opt, inv_scale, found_inf, False)[torch.device("cpu")]
    assert found.item() == 1.0 and found_inf.item() == 0.0  # (a copy per device, as torch's)
    assert p.grad[0].item() == 1.0
