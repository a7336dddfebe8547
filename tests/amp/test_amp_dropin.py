"""torchext.amp.GradScaler where torch's contract is subtle, side by side with
torch.amp.GradScaler("cpu"): the `grad_scaler` keyword, a `grad_scale`
already on the optimizer, torch's OptState; and all-or-nothing
`step`/`unscale_` over several param groups and devices."""
import copy
import pickle

import pytest
import torch

import torchext
from torchext.amp import GradScaler
from helpers import SCALER_OVERRIDES, data, small_model

KW = dict(init_scale=2.0**10, growth_interval=3)
TORCH_OPTSTATE = torch.amp.grad_scaler.OptState


def scalers():
    return torch.amp.GradScaler("cpu", **KW), GradScaler(**KW)


def backward(model, scaler, poison=None):
    x, y = data()
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    if poison is not None:
        next(model.parameters()).grad.view(-1)[0] = poison


# ---------------------------------------------------------- grad_scaler kwarg

class KwargSGD(torch.optim.SGD):
    """An optimizer of torch's older contract: step(grad_scaler=...) gets the
    scaler and unscales/skips by itself."""
    _step_supports_amp_scaling = True

    def step(self, closure=None, grad_scaler=None):
        self.seen.append((grad_scaler, hasattr(self, "grad_scale"), hasattr(self, "found_inf")))
        grad_scaler.unscale_(self)
        if sum(v.item() for v in grad_scaler._found_inf_per_device(self).values()):
            return "skipped"
        super().step(closure)
        return "stepped"


def test_grad_scaler_keyword_as_torch():
    runs = []
    for scaler in scalers():
        model = small_model()
        opt = KwargSGD(model.parameters(), lr=0.05)
        opt.seen = []
        out, scales = [], []
        for i in range(6):
            opt.zero_grad()
            backward(model, scaler, poison=float("inf") if i == 2 else None)
            with pytest.warns(FutureWarning, match="stop passing itself as a keyword") as w:
                out.append(scaler.step(opt))
            assert w[0].filename == __file__  # points at the caller, as torch's
            assert scaler._per_optimizer_states[id(opt)]["stage"] is TORCH_OPTSTATE.STEPPED
            scaler.update()
            scales.append(scaler.get_scale())
        # the scaler itself was passed; no grad_scale/found_inf were set, before or after
        assert all(s is scaler and not a and not b for s, a, b in opt.seen)
        assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
        runs.append((out, scales, [p.detach().clone() for p in model.parameters()]))
    (o1, s1, p1), (o2, s2, p2) = runs
    assert o1 == o2 and "skipped" in o1 and s1 == s2
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))


class ApexStyleSGD(torch.optim.SGD):
    """The contract of apex's FusedAdam(capturable=True): step(grad_scaler=...)
    reads the scaler's private ``_check_inf_per_device`` and
    ``_get_scale_async`` and skips by itself."""
    _step_supports_amp_scaling = True

    def step(self, closure=None, grad_scaler=None):
        found = grad_scaler._check_inf_per_device(self)[torch.device("cpu")]
        inv = grad_scaler._get_scale_async().double().reciprocal().float()
        if found.item():
            return "skipped"
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad.mul_(inv)
        super().step(closure)
        return "stepped"


def test_check_inf_per_device_serves_apex_style_optimizers_as_torch():
    runs = []
    for scaler in scalers():
        model = small_model()
        opt = ApexStyleSGD(model.parameters(), lr=0.05)
        out = []
        for i in range(5):
            opt.zero_grad()
            backward(model, scaler, poison=float("nan") if i == 1 else None)
            with pytest.warns(FutureWarning):
                out.append(scaler.step(opt))
            scaler.update()
        runs.append((out, scaler.get_scale(), [p.detach().clone() for p in model.parameters()]))
    (o1, s1, p1), (o2, s2, p2) = runs
    assert o1 == o2 == ["stepped", "skipped", "stepped", "stepped", "stepped"] and s1 == s2
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))


# ---------------------------------------------------- grad_scale already set

class Recorder(torch.optim.SGD):
    """Records the grad_scale/found_inf a scaler hands over, and steps."""
    _step_supports_amp_scaling = True

    def step(self, closure=None):
        gs = self.grad_scale
        self.seen.append((None if gs is None else float(gs), float(self.found_inf)))
        return None


@pytest.mark.parametrize("unscale_first", [False, True])
def test_grad_scale_on_optimizer_is_multiplied_in_as_torch(unscale_first):
    seen = []
    for scaler in scalers():
        model = small_model()
        opt = Recorder(model.parameters(), lr=0.05)
        opt.seen = []
        for user_scale in (None, torch.tensor(0.25), 3.0):
            opt.zero_grad()
            backward(model, scaler)
            if user_scale is not None:
                opt.grad_scale = user_scale
            if unscale_first:
                scaler.unscale_(opt)
            scaler.step(opt)
            assert not hasattr(opt, "grad_scale")  # deleted after the step, as torch
            scaler.update()
        seen.append(opt.seen)
    assert seen[0] == seen[1]
    if not unscale_first:
        assert [s for s, _ in seen[1]] == [2.0**10, 2.0**8, 3 * 2.0**10]


@pytest.mark.parametrize("fused", [True, False])
def test_grad_scale_on_asgd_fused_and_fallback_match_torch_scaler(fused):
    params = []
    for scaler in scalers():
        model = small_model()
        opt = torchext.optim.ASGD(model.parameters(), lr=0.05, t0=2, fused=fused)
        for i in range(5):
            opt.zero_grad()
            backward(model, scaler, poison=float("nan") if i == 3 else None)
            opt.grad_scale = torch.tensor(0.5)  # e.g. a second, user-side scale
            scaler.step(opt)
            scaler.update()
        params.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*params))
    # the user's factor really entered the update: without it the result differs
    model = small_model()
    opt = torchext.optim.ASGD(model.parameters(), lr=0.05, t0=2, fused=fused)
    scaler = GradScaler(**KW)
    for i in range(5):
        opt.zero_grad()
        backward(model, scaler, poison=float("nan") if i == 3 else None)
        scaler.step(opt)
        scaler.update()
    assert not all(torch.equal(a, p) for a, p in zip(params[1], model.parameters()))


# ------------------------------------------------------------------ OptState

def test_optstate_is_torchs_enum_pickled_scalers_included():
    assert torchext.amp.OptState is TORCH_OPTSTATE
    scaler = GradScaler(**KW)
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    backward(model, scaler)
    scaler.unscale_(opt)
    assert scaler._per_optimizer_states[id(opt)]["stage"] is TORCH_OPTSTATE.UNSCALED
    scaler.step(opt)
    assert scaler._per_optimizer_states[id(opt)]["stage"] == TORCH_OPTSTATE.STEPPED
    scaler.update()
    clone = pickle.loads(pickle.dumps(scaler))
    opt.zero_grad()
    backward(model, clone)
    clone.unscale_(opt)
    assert clone._per_optimizer_states[id(opt)]["stage"] is TORCH_OPTSTATE.UNSCALED
    assert pickle.loads(pickle.dumps(TORCH_OPTSTATE.STEPPED)) is TORCH_OPTSTATE.STEPPED


# ------------------------------------------------------------- all or nothing

def two_group_optimizer(make, bad):
    """A model in group 0 (grads already computed), and in group 1 a
    parameter whose grad is `bad`."""
    model = small_model()
    first = list(model.parameters())
    return model, make([{"params": first}, {"params": [bad]}])


def with_grad(param, grad):
    param.grad = grad
    return param


def bad_params():
    # each refused by what the scaler runs before the first write
    yield "fp16", with_grad(torch.nn.Parameter(torch.ones(4, dtype=torch.float16)),
                            torch.ones(4, dtype=torch.float16))
    yield "int64", with_grad(torch.zeros(4, dtype=torch.int64), torch.ones(4, dtype=torch.int64))
    # a second device (meta) whose list the op refuses: checked before the
    # first device's (CPU) grads are written
    yield "meta-int64", with_grad(torch.zeros(4, dtype=torch.int64, device="meta"),
                                  torch.ones(4, dtype=torch.int64, device="meta"))


def everything(model, opt, scaler):
    """The whole observable state: params, grads (values and objects),
    optimizer state_dict, scaler state_dict and per-optimizer records."""
    params = [p for g in opt.param_groups for p in g["params"]]
    return {
        "params": [p.detach().clone() for p in params],
        "grads": [None if p.grad is None else p.grad.clone() for p in params],
        "grad_ids": [id(p.grad) for p in params],
        "opt": copy.deepcopy(opt.state_dict()),
        "scaler": scaler.state_dict(),
        "records": {k: (v["stage"], {d: f.clone() for d, f in v["found_inf_per_device"].items()})
                    for k, v in scaler._per_optimizer_states.items()},
        "attrs": [a for a in ("grad_scale", "found_inf") if hasattr(opt, a)],
    }


def assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
        assert a.layout == b.layout
        if a.is_sparse:
            a, b = a.to_dense(), b.to_dense()
        assert a.device.type == "meta" or torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


OPTIMIZERS = {
    "sgd": lambda groups: torch.optim.SGD(groups, lr=0.05, momentum=0.9),  # unscale, then step
    "asgd": lambda groups: torchext.optim.ASGD(groups, lr=0.05),  # fused: check, then step
}


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("call", ["step", "unscale_", "unscale_then_step"])
@pytest.mark.parametrize("case", [name for name, _ in bad_params()])
def test_bad_grad_in_later_group_changes_nothing(case, call, opt_name):
    bad = dict(bad_params())[case]
    model, opt = two_group_optimizer(OPTIMIZERS[opt_name], bad)
    scaler = GradScaler(**KW)
    # a first, good step: the optimizer and scaler have state to keep
    bad_grad, bad.grad = bad.grad, None
    backward(model, scaler)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    backward(model, scaler)
    bad.grad = bad_grad
    if case == "fp16" and opt_name == "asgd" and call == "step":
        pytest.skip("fp16 grads are allowed on the fused path (ASGD computes in fp32)")
    before = everything(model, opt, scaler)
    with pytest.raises((TypeError, ValueError, RuntimeError)) as e:
        if call in ("unscale_", "unscale_then_step"):
            scaler.unscale_(opt)
        if call in ("step", "unscale_then_step"):
            scaler.step(opt)
    assert "FP16" in str(e.value) or "dtype" in str(e.value)
    assert_same(everything(model, opt, scaler), before)
    # and the scaler is still usable: drop the bad grad and step
    bad.grad = None
    scaler.step(opt)
    scaler.update()
    assert scaler._per_optimizer_states == {}


class RefusingFused(torch.optim.SGD):
    """A _step_supports_amp_scaling optimizer that refuses its inputs (as
    torchext's ASGD refuses a sparse grad), before changing anything."""
    _step_supports_amp_scaling = True

    def step(self, closure=None):
        raise ValueError("refused")


@pytest.mark.parametrize("unscale_first", [False, True])
def test_refused_fused_step_leaves_scaler_records_as_they_were(unscale_first):
    model = small_model()
    opt = RefusingFused(model.parameters(), lr=0.05)
    scaler = GradScaler(**KW)
    backward(model, scaler)
    opt.grad_scale = torch.tensor(0.5)
    if unscale_first:
        scaler.unscale_(opt)
    before = everything(model, opt, scaler)
    assert (before["records"] == {}) == (not unscale_first)
    with pytest.raises(ValueError, match="refused"):
        scaler.step(opt)
    assert_same(everything(model, opt, scaler), before)
    assert float(opt.grad_scale) == 0.5  # the user's own factor is kept


def test_uncoalesced_fp16_sparse_grad_kept_when_a_later_device_is_refused():
    """An uncoalesced fp16 sparse grad is coalesced (and replaced) by
    unscale_, as torch does; but not when a later group's grads, on
    another device, are refused."""
    emb = torch.nn.Embedding(10, 3, sparse=True).half()
    bad = with_grad(torch.zeros(4, dtype=torch.int64, device="meta"),
                    torch.ones(4, dtype=torch.int64, device="meta"))
    opt = torch.optim.SGD([{"params": emb.parameters()}, {"params": [bad]}], lr=0.05)
    scaler = GradScaler(**KW, allow_fp16=True)
    scaler.scale(emb(torch.tensor([1, 1, 2])).float().sum()).backward()
    assert emb.weight.grad.is_sparse and not emb.weight.grad.is_coalesced()
    before = everything(emb, opt, scaler)
    with pytest.raises(TypeError, match="dtype"):
        scaler.unscale_(opt)
    assert_same(everything(emb, opt, scaler), before)
    assert not emb.weight.grad.is_coalesced()
    bad.grad = None
    scaler.unscale_(opt)
    assert emb.weight.grad.is_coalesced()  # as torch
    torch.testing.assert_close(emb.weight.grad.to_dense()[1], torch.full((3,), 2.0,
                                                                          dtype=torch.float16))


# ------------------------------------------------------------- public hooks

def test_found_inf_is_the_recorded_count_for_that_optimizer():
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref, ours = scalers()
    counts = []
    for scaler in (ref, ours):
        opt.zero_grad()
        backward(model, scaler, poison=float("inf"))
        scaler.unscale_(opt)
        counts.append(sum(f.item() for f in scaler._found_inf_per_device(opt).values()))
    found = ours.found_inf(opt)
    assert found.shape == () and found.device == ours._scale.device
    assert found.item() == counts[0] == counts[1] == 1.0
    ours.step(opt)
    ours.update()
    with pytest.raises(AssertionError, match="No inf checks were recorded"):
        ours.found_inf(opt)


class Wrapper:
    """An optimizer wrapper whose param_groups is a property (as some
    frameworks' wrappers): the scaler reads the groups through it."""

    def __init__(self, opt):
        self.opt = opt

    @property
    def param_groups(self):
        return self.opt.param_groups

    def step(self, *args, **kwargs):
        return self.opt.step(*args, **kwargs)


def test_param_groups_of_optimizers_and_wrappers():
    from torchext._compile_compat import param_groups
    params = []
    for scaler in scalers():
        model = small_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        assert param_groups(opt) is opt.param_groups
        wrapped = Wrapper(opt)
        assert param_groups(wrapped) is opt.param_groups
        for i in range(4):
            opt.zero_grad()
            backward(model, scaler, poison=float("inf") if i == 1 else None)
            scaler.step(wrapped)
            scaler.update()
        params.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*params))


@pytest.mark.parametrize("init_scale", [0.0, -1.0, float("nan")])
def test_init_scale_is_checked_as_the_cpp_scaler(init_scale):
    with pytest.raises(ValueError, match="init_scale must be > 0"):
        GradScaler(init_scale=init_scale)
    assert not GradScaler(init_scale=init_scale, enabled=False).is_enabled()


def test_sparse_grad_refused_by_asgd_leaves_the_scaler_as_it_was():
    """The fused path: the scaler's read-only check accepts the sparse grad's
    values and torchext's ASGD refuses it. Nothing the scaler owns changes:
    no records, grads as they were, no grad_scale/found_inf left behind.
    (That ASGD itself changes nothing is tested with ASGD, issue 11.)"""
    emb = torch.nn.Embedding(10, 3, sparse=True)
    lin = torch.nn.Linear(3, 2)
    opt = torchext.optim.ASGD([{"params": lin.parameters()}, {"params": emb.parameters()}],
                              lr=0.05)
    scaler = GradScaler(**KW)
    scaler.scale(lin(emb(torch.tensor([1, 2]))).sum()).backward()
    before = everything(lin, opt, scaler)
    with pytest.raises(RuntimeError, match="sparse"):
        scaler.step(opt)
    after = everything(lin, opt, scaler)
    for key in ("grads", "grad_ids", "scaler", "records", "attrs"):
        assert_same(after[key], before[key])


# ------------------------------------------- what GradScaler takes from torch

def test_grad_scaler_overrides_only_what_differs():
    # SCALER_OVERRIDES (tests/helpers.py): what torchext's GradScaler
    # overrides, and why; everything else must be torch's own function.
    theirs = torch.amp.GradScaler
    ours_defined = {k for k, v in vars(GradScaler).items() if callable(v)}
    shared = {k for k, v in vars(theirs).items() if callable(v)}
    assert ours_defined & shared == set(SCALER_OVERRIDES)
    for name in shared - set(SCALER_OVERRIDES):
        assert getattr(GradScaler, name) is getattr(theirs, name), name


def test_inherited_getters_setters_and_pickling_behave_as_torch():
    t, o = torch.amp.GradScaler("cpu", **KW), GradScaler(**KW)
    for s in (t, o):
        model = small_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for i in range(5):
            opt.zero_grad()
            backward(model, s, poison=float("nan") if i == 1 else None)
            s.step(opt)
            s.update()
        s.set_growth_factor(3.0)
        s.set_backoff_factor(0.25)
        s.set_growth_interval(7)
    for getter in ("get_scale", "get_growth_factor", "get_backoff_factor",
                   "get_growth_interval", "is_enabled", "_get_growth_tracker"):
        assert getattr(t, getter)() == getattr(o, getter)(), getter
    sd_t, sd_o = t.state_dict(), o.state_dict()
    assert list(sd_o)[:5] == list(sd_t) and all(sd_o[k] == sd_t[k] for k in sd_t)
    t2, o2 = pickle.loads(pickle.dumps(t)), pickle.loads(pickle.dumps(o))
    assert t2.state_dict() == t.state_dict() and o2.state_dict() == o.state_dict()
    # Each loads the other's checkpoint and continues identically.
    t3, o3 = torch.amp.GradScaler("cpu"), GradScaler()
    t3.load_state_dict(sd_o)
    o3.load_state_dict(sd_t)
    assert t3.state_dict() == sd_t and {k: o3.state_dict()[k] for k in sd_t} == sd_t


def test_step_returns_what_the_optimizer_step_returned():
    class Returns(torch.optim.SGD):
        def step(self, closure=None):
            super().step(closure)
            return "ran"

    def step_results(model, opt, s):
        results = []  # what scaler.step returned, an overflow at the second step
        for i in range(3):
            opt.zero_grad()
            backward(model, s, poison=float("inf") if i == 1 else None)
            results.append(s.step(opt))
            s.update()
        return results

    for s in scalers():
        model = small_model()
        assert step_results(model, Returns(model.parameters(), lr=0.05), s) == ["ran", None, "ran"]
    # torchext's ASGD through the fused protocol too: on an overflow its
    # step() is not called (None), unless capturable=True (always called,
    # the skip happens on the device).
    class ASGDReturns(torchext.optim.ASGD):
        def step(self, closure=None):
            super().step(closure)
            return "ran"

    for capturable, want in ((False, ["ran", None, "ran"]), (True, ["ran"] * 3)):
        model = small_model()
        opt = ASGDReturns(model.parameters(), lr=0.05, capturable=capturable)
        assert step_results(model, opt, GradScaler(**KW)) == want, capturable
