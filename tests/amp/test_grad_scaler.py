"""torchext.amp.GradScaler against torch.amp.GradScaler("cpu"), side by side."""
import contextlib
import copy
import io
import os
import pickle
import runpy
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchext
from torchext.amp import GradScaler
from helpers import SRC, NoHostSync, data, rel_err, small_model, twin

EXAMPLES = os.path.join(SRC, "examples")
KW = dict(init_scale=2.0**10, growth_interval=5)
INF_STEPS = {3: float("inf"), 4: float("nan"), 11: float("-inf"), 12: float("inf"),
             13: float("nan"), 30: float("inf")}


def inject(model, step, where=0):
    """Poisons one grad element at the steps listed in INF_STEPS."""
    if step in INF_STEPS:
        p = list(model.parameters())[where]
        p.grad.view(-1)[1] = INF_STEPS[step]


def run_scaled(model, opt, scaler, steps, clip=None, record=None):
    x, y = data()
    for i in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        inject(model, i)
        if clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(opt)
        scaler.update()
        if record is not None:
            record.append((scaler.get_scale(), scaler._get_growth_tracker()))


@pytest.mark.parametrize("clip", [None, 0.5])
def test_parity_with_torch_sgd(clip):
    m1, m2 = small_model(), small_model()
    o1 = torch.optim.SGD(m1.parameters(), lr=0.05, momentum=0.9)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.05, momentum=0.9)
    s1, s2 = torch.amp.GradScaler("cpu", **KW), GradScaler(**KW)
    r1, r2 = [], []
    run_scaled(m1, o1, s1, 60, clip, r1)
    run_scaled(m2, o2, s2, 60, clip, r2)
    assert r1 == r2
    assert len({s for s, _ in r1}) > 3  # the scale really moved both ways
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)  # same unscale bits, same SGD
    assert s2.num_skipped_steps() == len(INF_STEPS)


@pytest.mark.parametrize("clip", [None, 0.5])
def test_parity_fused_asgd_with_torch_asgd(clip):
    m1, m2 = small_model(), small_model()
    o1 = torch.optim.ASGD(m1.parameters(), lr=0.05, t0=5, foreach=False)
    o2 = torchext.optim.ASGD(m2.parameters(), lr=0.05, t0=5)
    s1, s2 = torch.amp.GradScaler("cpu", **KW), GradScaler(**KW)
    r1, r2 = [], []
    run_scaled(m1, o1, s1, 60, clip, r1)
    run_scaled(m2, o2, s2, 60, clip, r2)
    assert r1 == r2
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-6
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        for k in ("step", "eta", "mu", "ax"):
            assert rel_err(o2.state[p2][k], o1.state[p1][k]) <= 1e-6, k
    # skipped steps did not advance the step counter
    assert o2.state[next(m2.parameters())]["step"].item() == 60 - len(INF_STEPS)


def test_torch_scaler_drives_torchext_asgd_sync_free():
    """torch's own GradScaler uses the _step_supports_amp_scaling contract too."""
    m1, m2 = small_model(), small_model()
    o1 = torch.optim.ASGD(m1.parameters(), lr=0.05, t0=5, foreach=False)
    o2 = torchext.optim.ASGD(m2.parameters(), lr=0.05, t0=5)
    s1, s2 = torch.amp.GradScaler("cpu", **KW), torch.amp.GradScaler("cpu", **KW)
    run_scaled(m1, o1, s1, 40)
    run_scaled(m2, o2, s2, 40)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-6


def test_fused_sgd_through_torchext_scaler_matches_torch():
    m1, m2 = small_model(), small_model()
    o1 = torch.optim.SGD(m1.parameters(), lr=0.05, momentum=0.9, fused=True)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.05, momentum=0.9, fused=True)
    s1, s2 = torch.amp.GradScaler("cpu", **KW), GradScaler(**KW)
    r1, r2 = [], []
    run_scaled(m1, o1, s1, 40, record=r1)
    run_scaled(m2, o2, s2, 40, record=r2)
    assert r1 == r2
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)


@pytest.mark.parametrize("capturable", [False, True])
def test_fused_path_is_read_only_check_plus_one_pass(capturable):
    """torchext's ASGD gets one read-only check and one update pass (no
    separate unscale write pass). capturable=True: no host sync at all, the
    skip is decided on the device. Default: one host read of found_inf (as
    torch.optim.ASGD with torch's scaler), so an overflowed step is one where
    step() is not called."""
    m = small_model()
    opt = torchext.optim.ASGD(m.parameters(), lr=0.05, t0=0, capturable=capturable)
    scaler = GradScaler(**KW)
    x, y = data()
    loss = torch.nn.functional.mse_loss(m(x), y)
    scaler.scale(loss).backward()
    grads = [p.grad.clone() for p in m.parameters()]
    calls = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(str(func))
            return func(*args, **(kwargs or {}))

    with (NoHostSync() if capturable else contextlib.nullcontext()), Record():
        scaler.step(opt)
        scaler.update()
    # grads untouched: no separate unscale write pass
    for p, g in zip(m.parameters(), grads):
        assert torch.equal(p.grad, g)
    assert "torchext.check_finite_.default" in calls and "torchext.asgd_.packed" in calls
    assert "torchext.unscale_.default" not in calls
    host_reads = [c for c in calls if c in ("aten._local_scalar_dense.default", "aten.item.default")]
    assert len(host_reads) == (0 if capturable else 1)


def test_unscale_then_fused_step_does_not_unscale_twice():
    m1, m2 = small_model(), small_model()
    o1 = torch.optim.ASGD(m1.parameters(), lr=0.05, foreach=False)
    o2 = torchext.optim.ASGD(m2.parameters(), lr=0.05)
    s1, s2 = torch.amp.GradScaler("cpu", **KW), GradScaler(**KW)
    run_scaled(m1, o1, s1, 10, clip=10.0)
    run_scaled(m2, o2, s2, 10, clip=10.0)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-6


def test_two_optimizers_two_losses():
    def run(scaler_cls, opt_cls, **okw):
        torch.manual_seed(0)
        a, b = torch.nn.Linear(6, 4), torch.nn.Linear(6, 4)
        oa, ob = opt_cls(a.parameters(), lr=0.05, **okw), opt_cls(b.parameters(), lr=0.05, **okw)
        scaler = scaler_cls(**KW)
        x = torch.randn(8, 6)
        hist = []
        for i in range(40):
            oa.zero_grad(), ob.zero_grad()
            l0 = (a(x) - b(x).detach()).pow(2).mean()
            l1 = (a(x).detach() * b(x)).mean()
            scaler.scale(l0).backward(retain_graph=True)
            scaler.scale(l1).backward()
            if i in (7, 8, 20):
                b.weight.grad[0, 0] = float("inf")
            scaler.step(oa)
            scaler.step(ob)
            scaler.update()
            hist.append(scaler.get_scale())
        return hist, [p.detach().clone() for p in (*a.parameters(), *b.parameters())]

    h1, p1 = run(lambda **k: torch.amp.GradScaler("cpu", **k), torch.optim.ASGD, foreach=False)
    h2, p2 = run(GradScaler, torchext.optim.ASGD)
    assert h1 == h2
    for x, y in zip(p1, p2):
        assert rel_err(y, x) <= 1e-6


def hand_model(found_seq, scale, gf, bf, interval, hysteresis, lo, hi):
    """The documented rule, written out in Python."""
    tracker, hyst, out = 0, hysteresis, []
    for found in found_seq:
        if found:
            tracker = 0
            hyst -= 1
            if hyst <= 0:
                hyst = 0
                scale = max(float(torch.tensor(scale * bf, dtype=torch.float32)), lo)
        else:
            tracker += 1
            if tracker >= interval:
                new = min(float(torch.tensor(scale * gf, dtype=torch.float32)), hi)
                if new != float("inf"):
                    scale = new
                tracker, hyst = 0, hysteresis
        out.append((scale, tracker, hyst))
    return out


@pytest.mark.parametrize("hysteresis,lo,hi,gf,bf", [
    (1, 0.0, float("inf"), 2.0, 0.5), (3, 0.0, float("inf"), 2.0, 0.5),
    (2, 64.0, 2.0**12, 2.0, 0.5), (1, 1.0, float("inf"), 3.0, 0.25),
    (1, 0.0, float("inf"), 2.0**40, 0.5)])
def test_hysteresis_and_clamps_follow_the_rule(hysteresis, lo, hi, gf, bf):
    g = torch.Generator().manual_seed(1)
    found_seq = (torch.rand(200, generator=g) < 0.25).tolist()
    found_seq[50:60] = [True] * 10  # a burst drives the scale to its floor
    scaler = GradScaler(init_scale=1024.0, growth_factor=gf, backoff_factor=bf,
                        growth_interval=3, hysteresis=hysteresis,
                        min_scale=lo or None, max_scale=None if hi == float("inf") else hi)
    scaler.scale(torch.ones(()))
    got = []
    for f in found_seq:
        scaler._per_optimizer_states[0]["found_inf_per_device"] = {
            torch.device("cpu"): torch.tensor(float(f))}
        scaler.update()
        got.append((scaler.get_scale(), scaler._get_growth_tracker(),
                    scaler._get_hysteresis_tracker()))
    assert got == hand_model(found_seq, 1024.0, gf, bf, 3, hysteresis, lo, hi)
    assert scaler.num_skipped_steps() == sum(found_seq)


def test_defaults_reproduce_torch_update_rule():
    g = torch.Generator().manual_seed(2)
    found_seq = (torch.rand(300, generator=g) < 0.1).tolist()
    ours, ref = GradScaler(growth_interval=7), torch.amp.GradScaler("cpu", growth_interval=7)
    ours.scale(torch.ones(())), ref.scale(torch.ones(()))
    for f in found_seq:
        for s in (ours, ref):
            s._per_optimizer_states[0]["found_inf_per_device"] = {
                torch.device("cpu"): torch.tensor(float(f))}
            s.update()
        assert ours.get_scale() == ref.get_scale()
        assert ours._get_growth_tracker() == ref._get_growth_tracker()


def test_skip_reporting_and_update_optimizer():
    m = small_model()
    opt = torchext.optim.ASGD(m.parameters())
    scaler = GradScaler(**KW)
    x, y = data()
    for i, poison in enumerate([False, True, False]):
        opt.zero_grad()
        scaler.scale(torch.nn.functional.mse_loss(m(x), y)).backward()
        if poison:
            next(m.parameters()).grad[0, 0] = float("nan")
        scaler.step(opt)
        scaler.update(opt)
        assert scaler.last_step_skipped.dtype == torch.bool
        assert bool(scaler.last_step_skipped) == poison == scaler.was_step_skipped()
    assert scaler.skipped_steps.item() == 1
    assert scaler.get_scale() == 2.0**9
    assert scaler._per_optimizer_states == {}
    with pytest.raises(AssertionError, match="No inf checks were recorded for this optimizer"):
        scaler.update(opt)


def test_update_optimizer_only_resets_that_optimizer():
    a, b = small_model(seed=1), small_model(seed=2)
    oa, ob = torchext.optim.ASGD(a.parameters()), torch.optim.SGD(b.parameters(), lr=0.1)
    scaler = GradScaler(**KW)
    x, y = data()
    loss = torch.nn.functional.mse_loss(a(x), y) + torch.nn.functional.mse_loss(b(x), y)
    scaler.scale(loss).backward()
    next(b.parameters()).grad[0, 0] = float("inf")
    scaler.step(oa)
    scaler.step(ob)
    scaler.update(oa)  # oa had no overflow: scale unchanged, ob's state kept
    assert scaler.get_scale() == 2.0**10 and id(ob) in scaler._per_optimizer_states
    scaler.update(ob)  # ob overflowed: back off
    assert scaler.get_scale() == 2.0**9 and not scaler._per_optimizer_states


def test_update_new_scale_float_and_tensor_and_errors():
    scaler = GradScaler()
    scaler.scale(torch.ones(()))
    scaler.update(123.0)
    assert scaler.get_scale() == 123.0
    scaler.update(torch.tensor(256.0))
    assert scaler.get_scale() == 256.0
    ref = torch.amp.GradScaler("cpu")
    ref.scale(torch.ones(()))
    for bad in (torch.ones(2), torch.ones((), requires_grad=True)):
        for s in (scaler, ref):
            with pytest.raises(AssertionError, match="new_scale should be a float"):
                s.update(bad)


def test_misuse_errors_match_torch():
    def msgs(scaler):
        out = []
        m = small_model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        x, y = data()
        with pytest.raises(AssertionError) as e:
            scaler.step(opt)
        out.append(str(e.value))
        scaler.scale(torch.nn.functional.mse_loss(m(x), y)).backward()
        scaler.unscale_(opt)
        with pytest.raises(RuntimeError) as e:
            scaler.unscale_(opt)
        out.append(str(e.value))
        scaler.step(opt)
        with pytest.raises(RuntimeError) as e:
            scaler.step(opt)
        out.append(str(e.value))
        with pytest.raises(RuntimeError) as e:
            scaler.unscale_(opt)
        out.append(str(e.value))
        with pytest.raises(RuntimeError) as e:
            scaler.step(opt, closure=lambda: None)
        out.append(str(e.value))
        scaler.update()
        m.half()
        opt.zero_grad()
        scaler.scale(m(x.half()).float().sum()).backward()
        with pytest.raises(ValueError) as e:
            scaler.unscale_(opt)
        out.append(str(e.value))
        with pytest.raises(AssertionError) as e:
            type(scaler)("cpu", growth_factor=0.5)
        out.append(str(e.value))
        return out

    assert msgs(GradScaler()) == msgs(torch.amp.GradScaler("cpu"))


def test_allow_fp16_unscales_fp16_grads():
    m = small_model(torch.float16)
    opt = torchext.optim.ASGD(m.parameters(), lr=0.01)
    scaler = GradScaler(init_scale=256.0, allow_fp16=True)
    x, y = data(torch.float16)
    scaler.scale(torch.nn.functional.mse_loss(m(x).float(), y.float())).backward()
    g = [p.grad.float() / 256 for p in m.parameters()]
    scaler.unscale_(opt)
    for p, ref in zip(m.parameters(), g):
        torch.testing.assert_close(p.grad.float(), ref)
    before = [p.detach().clone() for p in m.parameters()]
    scaler.step(opt)
    scaler.update()
    assert any(not torch.equal(p, b) for p, b in zip(m.parameters(), before))


def test_state_dict_round_trips():
    def trained(scaler):
        m = small_model()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        run_scaled(m, opt, scaler, 14)
        return scaler

    ours = trained(GradScaler(**KW, hysteresis=2))
    ref = trained(torch.amp.GradScaler("cpu", **KW))
    sd = ours.state_dict()
    assert all(isinstance(v, (int, float)) for v in sd.values())
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    # ours -> ours, before the first scale() and after it
    for first_scale in (False, True):
        new = GradScaler()
        if first_scale:
            new.scale(torch.ones(()))
        new.load_state_dict(loaded)
        assert new.state_dict() == sd
    # torch -> ours: torch's keys taken, the rest as constructed
    new = GradScaler(hysteresis=3)
    new.load_state_dict(ref.state_dict())
    nsd = new.state_dict()
    assert {k: nsd[k] for k in ref.state_dict()} == ref.state_dict()
    assert nsd["_hysteresis_tracker"] == 3 and nsd["skipped_steps"] == 0
    # ours -> torch: torch reads its keys and ignores ours
    t = torch.amp.GradScaler("cpu")
    t.load_state_dict(sd)
    assert t.state_dict() == {k: sd[k] for k in t.state_dict()}
    # bad input changes nothing
    with pytest.raises(KeyError, match="missing"):
        new.load_state_dict({"scale": 1.0})
    with pytest.raises(RuntimeError, match="empty"):
        new.load_state_dict({})
    assert new.state_dict() == nsd


def test_pickle_and_disabled_behaviour():
    s = GradScaler(**KW, hysteresis=2)
    s.scale(torch.ones(()))
    s.update(32.0)
    s2 = pickle.loads(pickle.dumps(s))
    assert s2.get_scale() == 32.0 and s2.state_dict() == s.state_dict()
    d = GradScaler(enabled=False)
    t = torch.ones(3)
    assert d.scale(t) is t and d.state_dict() == {} and d.get_scale() == 1.0
    assert not d.is_enabled() and isinstance(d, torch.amp.GradScaler)


def test_scale_nested_iterables():
    s = GradScaler(init_scale=4.0)
    out = s.scale([torch.ones(2), (torch.ones(1), [torch.ones(3)])])
    assert isinstance(out, list) and isinstance(out[1], tuple)
    assert out[0].tolist() == [4.0, 4.0] and out[1][1][0].tolist() == [4.0] * 3
    gen = s.scale(t for t in [torch.ones(1)])
    assert next(iter(gen)).item() == 4.0
    with pytest.raises(ValueError, match="outputs must be a Tensor"):
        s.scale([1.0])


def test_device_inferred_and_cuda_disabled_without_gpu():
    s = GradScaler()
    assert s._device is None
    s.scale(torch.ones(()))
    assert s._device == "cpu" and s.is_enabled()
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="CUDA is not available"):
            c = GradScaler("cuda")
        assert not c.is_enabled()


def test_getters_setters():
    s = GradScaler()
    s.set_growth_factor(3.0), s.set_backoff_factor(0.25), s.set_growth_interval(7)
    assert (s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval()) == (3.0, 0.25, 7)


# torch's reference for each example: update(optimizer) is torchext's, so
# torch runs those disabled (unscaled steps print the same numbers: power-of-
# two scaling is exact); the no-optimizer one runs torch's enabled scaler.
TORCH_DISABLED = "import functools, torch.amp\nGradScaler = functools.partial(torch.amp.GradScaler, enabled=False)"
TORCH_ENABLED = "from torch.amp import GradScaler"


@pytest.mark.parametrize("example,reference", [
    ("gradscaler_update_optimizer.py", TORCH_DISABLED),
    ("gradscaler_update_epochs.py", TORCH_DISABLED),
    ("gradscaler_update_no_optimizer.py", TORCH_ENABLED)])
def test_user_examples_print_what_torch_prints(example, reference, capsys):
    """Each documented program runs with only the import changed, with our
    scaler enabled, and prints what torch prints."""
    path = os.path.join(EXAMPLES, example)
    src = open(path).read()
    assert "\t" not in src and "torch.cuda.amp" not in src
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no deprecated autocast
        ns = runpy.run_path(path, run_name="__main__")
        ours = capsys.readouterr().out
        assert ns["scaler"].is_enabled()
        code = compile(src.replace("from torchext.amp import GradScaler", reference), path, "exec")
        ns_torch = {"__name__": "__main__"}
        exec(code, ns_torch)
        theirs = capsys.readouterr().out
    assert ours == theirs and ours.strip()
    if example == "gradscaler_update_no_optimizer.py":
        assert "optimizer" not in ns and ns["scaler"].get_scale() == 2.0**12
        assert "No inf checks were recorded" in ours
    else:
        assert ns["scaler"].get_scale() == 2.0**16 and not ns_torch["scaler"].is_enabled()


def test_sync_free_lr_schedule_recipe_from_readme():
    """docs/scaler.md's recipe: decay a tensor lr only on steps that ran, on the
    device, from scaler.last_step_skipped (capturable=True: no host sync)."""
    m = small_model()
    lr = torch.tensor(0.1)
    opt = torchext.optim.ASGD(m.parameters(), lr=lr, capturable=True)
    scaler = GradScaler(**KW)
    x, y = data()
    expected = 0.1
    for i in range(6):
        opt.zero_grad()
        scaler.scale(torch.nn.functional.mse_loss(m(x), y)).backward()
        if i in (2, 3):
            next(m.parameters()).grad[0, 0] = float("inf")
        with NoHostSync():
            scaler.step(opt)
            scaler.update()
            opt.param_groups[0]["lr"].mul_(torch.where(scaler.last_step_skipped, 1.0, 0.5))
        if i not in (2, 3):
            expected *= 0.5
    assert opt.param_groups[0]["lr"] is lr
    assert lr.item() == pytest.approx(expected)


# --- the inf check through ASGD's C++ holders (the fused-step protocol) -------

def test_scaler_checks_grads_through_the_asgd_holders_and_matches_torch():
    g = torch.Generator().manual_seed(3)
    shapes = [(4, 3), (7,), (2, 2)]
    groups = lambda ps: [{"params": ps[:2]}, {"params": ps[2:], "lr": 0.02}]  # noqa: E731
    ours_p = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    ref_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    opt = torchext.optim.ASGD(groups(ours_p), lr=0.05, t0=1)
    ref = torch.optim.ASGD(groups(ref_p), lr=0.05, t0=1, foreach=False)
    sc = torchext.amp.GradScaler(init_scale=2.0**8, growth_interval=2)
    rsc = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    one = torch.ones((), requires_grad=True)
    planned = []
    for step in range(8):
        grads = [torch.randn(s, generator=g) * 2.0**8 for s in shapes]
        if step in (4, 6):
            grads[2][0, 1] = float("inf") if step == 4 else float("nan")
        drop = step == 5  # a param without grad: checked all the same
        for i, (p, q, gr) in enumerate(zip(ours_p, ref_p, grads)):
            p.grad = None if drop and i == 1 else gr.clone()
            q.grad = None if drop and i == 1 else gr.clone()
        planned.append(opt._torchext_amp_check() is not None)
        sc.scale(one)
        rsc.scale(one)
        sc.step(opt)
        rsc.step(ref)
        sc.update()
        rsc.update()
        assert sc.get_scale() == rsc.get_scale(), step
        for p, q in zip(ours_p, ref_p):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
            if q in ref.state:
                for k in ("ax", "step", "eta", "mu"):
                    torch.testing.assert_close(opt.state[p][k], ref.state[q][k], rtol=1e-6,
                                               atol=1e-7)
    # every step's check goes through the holders (no list from Python)
    assert planned == [True] * 8


@pytest.mark.parametrize("kwargs,name", [
    (dict(growth_factor=float("inf")), "growth_factor"),
    (dict(init_scale=float("inf")), "init_scale"),
    (dict(init_scale=float("nan")), "init_scale"),
    (dict(growth_interval=float("inf")), "growth_interval"),
    (dict(growth_interval=float("nan")), "growth_interval"),
    (dict(hysteresis=float("inf")), "hysteresis"),
    (dict(min_scale=float("inf")), "min_scale"),
    (dict(min_scale=float("nan")), "min_scale"),
    (dict(growth_factor=float("nan")), "growth_factor"),  # torch's `<= 1` lets NaN through
    (dict(backoff_factor=float("nan")), "backoff_factor"),
    (dict(backoff_factor=float("-inf")), "backoff_factor"),
    (dict(init_scale=float("-inf")), "init_scale"),
    (dict(hysteresis=float("nan")), "hysteresis"),
    (dict(growth_interval=float("-inf")), "growth_interval"),
    (dict(min_scale=float("-inf")), "min_scale"),
    (dict(max_scale=float("nan")), "max_scale must not be NaN"),
    (dict(max_scale=float("-inf")), "max_scale"),
])
def test_non_finite_options_refused(kwargs, name):
    with pytest.raises(ValueError, match=name):
        torchext.amp.GradScaler("cpu", **kwargs)


@pytest.mark.parametrize("kwargs", [dict(growth_factor=1.0), dict(growth_factor=0.5),
                                    dict(backoff_factor=1.0), dict(backoff_factor=2.0)])
def test_what_torch_refuses_stays_torchs_assertion(kwargs):
    with pytest.raises(AssertionError) as theirs:
        torch.amp.GradScaler("cpu", **kwargs)
    with pytest.raises(AssertionError) as ours:
        torchext.amp.GradScaler("cpu", **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_max_scale_inf_means_no_clamp_as_none():
    runs = []
    for max_scale in (None, float("inf")):
        s = torchext.amp.GradScaler("cpu", init_scale=2.0 ** 100, growth_factor=2.0 ** 20,
                                    growth_interval=1, max_scale=max_scale)
        w = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([w], lr=0.0)
        for _ in range(3):
            s.scale(w.sum()).backward()
            s.step(opt)
            s.update()
            opt.zero_grad()
        runs.append(s.get_scale())
        assert s.load_state_dict(s.state_dict()) is None  # its own checkpoint loads
    assert runs[0] == runs[1] and runs[0] > 2.0 ** 100
