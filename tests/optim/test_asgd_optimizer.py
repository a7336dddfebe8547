"""The torch.optim.Optimizer API on torchext.optim.ASGD, and checkpoints that
interchange with torch.optim.ASGD."""
import copy
import io

import pytest
import torch

import torchext
from torch.optim.optimizer import register_optimizer_step_pre_hook
from conftest import requires_cuda
from helpers import all_state, data, rel_err, small_model, train, twin

ASGD = torchext.optim.ASGD


@pytest.mark.parametrize("kwargs,match", [
    (dict(lr=-0.1), "Invalid learning rate"),
    (dict(weight_decay=-1.0), "Invalid weight_decay"),
    (dict(lambd=-1.0), "Invalid lambd"),
    (dict(alpha=-0.1), "Invalid alpha"),
    (dict(lr=torch.tensor([0.1, 0.2])), "Tensor lr must be 1-element"),
])
def test_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ASGD(small_model().parameters(), **kwargs)


def test_fused_flag_conflicts():
    with pytest.raises(RuntimeError, match="`fused` does not support `differentiable`"):
        ASGD(small_model().parameters(), fused=True, differentiable=True)
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        ASGD(small_model().parameters(), fused=True, foreach=True)


def test_defaults_match_torch_plus_fused():
    ours = ASGD(small_model().parameters())
    ref = torch.optim.ASGD(small_model().parameters())
    assert {k: v for k, v in ours.defaults.items()
            if k not in ("fused", "average_dtype", "stochastic_rounding", "rounding_seed")
            } == ref.defaults
    assert ours.defaults["fused"] is None
    assert ours.defaults["average_dtype"] == "float32"  # (a float32 average for fp16/bf16)
    assert ours.defaults["stochastic_rounding"] is False and ours.defaults["rounding_seed"] == 0
    assert isinstance(ours, torch.optim.Optimizer)


@pytest.mark.parametrize("fused,foreach,capturable", [
    (True, None, False), (False, None, False), (False, True, False), (None, None, True),
    (False, None, True)])
def test_every_path_matches_torch(fused, foreach, capturable):
    model = small_model()
    ours_model = twin(model)
    x, y = data()
    ref = torch.optim.ASGD(model.parameters(), lr=0.05, t0=3, weight_decay=1e-3, foreach=False)
    ours = ASGD(ours_model.parameters(), lr=0.05, t0=3, weight_decay=1e-3, fused=fused,
                foreach=foreach, capturable=capturable)
    train(model, ref, x, y, 60)
    train(ours_model, ours, x, y, 60)
    for p1, p2 in zip(model.parameters(), ours_model.parameters()):
        assert rel_err(p2, p1) <= 1e-6


def test_add_param_group_and_lr_scheduler():
    m1, m2 = small_model(), small_model()
    ref = torch.optim.ASGD(m1[0].parameters(), lr=0.05, foreach=False)
    ours = ASGD(m2[0].parameters(), lr=0.05)
    x, y = data()
    train(m1, ref, x, y, 5)
    train(m2, ours, x, y, 5)
    ref.add_param_group({"params": m1[2].parameters(), "lr": 0.01, "t0": 0})
    ours.add_param_group({"params": m2[2].parameters(), "lr": 0.01, "t0": 0})
    assert ours.param_groups[1]["fused"] is None and ours.param_groups[1]["lambd"] == 1e-4
    s1 = torch.optim.lr_scheduler.StepLR(ref, step_size=7, gamma=0.5)
    s2 = torch.optim.lr_scheduler.StepLR(ours, step_size=7, gamma=0.5)
    for _ in range(30):
        train(m1, ref, x, y, 1)
        train(m2, ours, x, y, 1)
        s1.step()
        s2.step()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-6
    with pytest.raises(ValueError, match="some parameters appear in more than one"):
        ours.add_param_group({"params": m2[0].parameters()})


def test_tensor_lr_with_scheduler_changes_lr_in_place():
    m1, m2 = small_model(), small_model()
    ref = torch.optim.ASGD(m1.parameters(), lr=torch.tensor(0.05), foreach=False)
    ours = ASGD(m2.parameters(), lr=torch.tensor(0.05))
    s1 = torch.optim.lr_scheduler.ExponentialLR(ref, gamma=0.9)
    s2 = torch.optim.lr_scheduler.ExponentialLR(ours, gamma=0.9)
    x, y = data()
    for _ in range(20):
        train(m1, ref, x, y, 1)
        train(m2, ours, x, y, 1)
        s1.step()
        s2.step()
    assert torch.is_tensor(ours.param_groups[0]["lr"])
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-6


def test_named_parameters_and_param_names_in_state_dict():
    m1, m2 = small_model(), small_model()
    ref = torch.optim.ASGD(m1.named_parameters(), lr=0.05)
    ours = ASGD(m2.named_parameters(), lr=0.05)
    x, y = data()
    train(m1, ref, x, y, 3)
    train(m2, ours, x, y, 3)
    sd = ours.state_dict()
    assert sd["param_groups"][0]["param_names"] == [n for n, _ in m2.named_parameters()]
    assert sd["param_groups"][0]["param_names"] == ref.state_dict()["param_groups"][0]["param_names"]
    # param_names survive a load into a fresh optimizer
    fresh = ASGD(small_model().named_parameters(), lr=0.05)
    fresh.load_state_dict(sd)
    assert fresh.state_dict()["param_groups"][0]["param_names"] == sd["param_groups"][0]["param_names"]


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(set_to_none):
    m = small_model()
    opt = ASGD(m.parameters())
    x, y = data()
    torch.nn.functional.mse_loss(m(x), y).backward()
    opt.zero_grad(set_to_none=set_to_none)
    for p in m.parameters():
        if set_to_none:
            assert p.grad is None
        else:
            assert p.grad is not None and not p.grad.any()


def test_step_closure_returns_loss_and_runs_with_grad():
    m = small_model()
    opt = ASGD(m.parameters())
    x, y = data()

    def closure():
        assert torch.is_grad_enabled()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        return loss

    with torch.no_grad():
        loss = opt.step(closure)
    assert torch.is_tensor(loss) and loss.item() > 0


def test_step_hooks_state_dict_hooks_and_load_hooks():
    calls = []
    m = small_model()
    opt = ASGD(m.parameters())
    h1 = opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
    h2 = opt.register_step_post_hook(lambda o, a, k: calls.append("post"))
    gpre = register_optimizer_step_pre_hook(
        lambda o, a, k: calls.append("global_pre"))
    x, y = data()
    train(m, opt, x, y, 1)
    assert calls == ["global_pre", "pre", "post"]
    h1.remove(), h2.remove(), gpre.remove()
    train(m, opt, x, y, 1)
    assert calls == ["global_pre", "pre", "post"]

    def sd_post(o, sd):
        sd["extra"] = 1
        return sd
    opt.register_state_dict_pre_hook(lambda o: calls.append("sd_pre"))
    opt.register_state_dict_post_hook(sd_post)
    sd = opt.state_dict()
    assert calls[-1] == "sd_pre" and sd["extra"] == 1

    def load_pre(o, sd):
        calls.append("load_pre")
        sd = dict(sd)
        sd.pop("extra", None)
        return sd
    opt.register_load_state_dict_pre_hook(load_pre)
    opt.register_load_state_dict_post_hook(lambda o: calls.append("load_post"))
    opt.load_state_dict(sd)
    assert calls[-2:] == ["load_pre", "load_post"]


def _train_with(opt_factory, model, x, y, steps):
    opt = opt_factory(model)
    train(model, opt, x, y, steps)
    return opt


KW = dict(lr=0.05, t0=4, lambd=1e-3, weight_decay=1e-3)


@pytest.mark.parametrize("direction", ["torch->torchext", "torchext->torch"])
def test_checkpoints_interchange_both_ways(direction):
    first, second = ((lambda m: torch.optim.ASGD(m.parameters(), foreach=False, **KW)),
                     (lambda m: ASGD(m.parameters(), **KW)))
    if direction == "torchext->torch":
        first, second = second, first
    x, y = data()
    model = small_model()
    opt = _train_with(first, model, x, y, 25)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    # Continue with the same class: the reference trajectory.
    ref_model = twin(model)
    ref_opt = first(ref_model)
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    train(ref_model, ref_opt, x, y, 40)
    # Continue with the other class from the checkpoint (weights_only load).
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    new_model = small_model(seed=123)
    new_model.load_state_dict(ckpt["model"])
    new_opt = second(new_model)
    new_opt.load_state_dict(ckpt["opt"])
    train(new_model, new_opt, x, y, 40)
    for p1, p2 in zip(ref_model.parameters(), new_model.parameters()):
        assert rel_err(p2, p1) <= 1e-6
    for (k, s1), (_, s2) in zip(all_state(ref_opt), all_state(new_opt)):
        assert rel_err(s2, s1) <= 1e-6, k


def test_old_checkpoint_with_float_step_loads():
    m = small_model()
    opt = ASGD(m.parameters(), **KW)
    x, y = data()
    train(m, opt, x, y, 5)
    sd = opt.state_dict()
    for st in sd["state"].values():  # what pre-1.12 torch saved
        st["step"] = float(st["step"].item())
        st["eta"] = float(st["eta"].item())
        st["mu"] = float(st["mu"].item())
    m2 = twin(m)
    opt2 = ASGD(m2.parameters(), **KW)
    opt2.load_state_dict(sd)
    for st in opt2.state.values():
        for key in ("step", "eta", "mu"):
            assert torch.is_tensor(st[key]) and st[key].dtype == torch.float32
    m3 = twin(m)
    opt3 = ASGD(m3.parameters(), **KW)
    opt3.load_state_dict(opt.state_dict())
    train(m2, opt2, x, y, 10)
    train(m3, opt3, x, y, 10)
    for p2, p3 in zip(m2.parameters(), m3.parameters()):
        assert torch.equal(p2, p3)


def test_bf16_eta_mu_stay_float32_after_load():
    m = small_model(torch.bfloat16)
    opt = ASGD(m.parameters(), lr=0.0123, t0=0)
    x, y = data(torch.bfloat16)
    train(m, opt, x, y, 3)
    sd = copy.deepcopy(opt.state_dict())
    ref_torch = torch.optim.ASGD(twin(m).parameters(), lr=0.0123, t0=0)
    ref_torch.load_state_dict(copy.deepcopy(sd))
    st_torch = next(iter(ref_torch.state.values()))
    assert st_torch["eta"].dtype == torch.bfloat16  # what torch does (and drifts)
    opt2 = ASGD(twin(m).parameters(), lr=0.0123, t0=0)
    opt2.load_state_dict(sd)
    for st, st_saved in zip(opt2.state.values(), sd["state"].values()):
        for key in ("step", "eta", "mu"):
            assert st[key].dtype == torch.float32
            assert torch.equal(st[key], st_saved[key])


def test_load_state_dict_rejects_bad_input_without_mutating():
    m = small_model()
    opt = ASGD(m.parameters(), **KW)
    x, y = data()
    train(m, opt, x, y, 3)
    before = copy.deepcopy(opt.state_dict())
    bad = copy.deepcopy(before)
    first = next(iter(bad["state"].values()))
    first["ax"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="'ax' of parameter 0 has shape"):
        opt.load_state_dict(bad)
    bad = copy.deepcopy(before)
    bad["param_groups"][0]["params"] = bad["param_groups"][0]["params"][:2]
    with pytest.raises(ValueError, match="doesn't match the size"):
        opt.load_state_dict(bad)
    bad = copy.deepcopy(before)
    next(iter(bad["state"].values()))["eta"] = torch.ones(2)
    with pytest.raises(ValueError, match="'eta' of parameter 0 must hold one element"):
        opt.load_state_dict(bad)
    with pytest.raises(ValueError, match="must have a 'state' dict"):
        opt.load_state_dict({"param_groups": before["param_groups"]})
    after = opt.state_dict()
    for pid, st in before["state"].items():
        for key, v in st.items():
            assert torch.equal(after["state"][pid][key], v)


def test_sparse_grad_is_rejected_before_anything_changes():
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = ASGD(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    w = emb.weight.detach().clone()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        opt.step()
    assert torch.equal(emb.weight, w)


def test_differentiable_matches_torch_and_flows_gradients():
    """Gradient of a function of the updated params w.r.t. a hyper-input,
    through one step, against torch's differentiable ASGD."""
    results = []
    for cls in (torch.optim.ASGD, ASGD):
        torch.manual_seed(0)
        p0 = torch.randn(5, dtype=torch.float64, requires_grad=True)
        g = torch.randn(5, dtype=torch.float64, requires_grad=True)
        p = p0.clone()  # non-leaf, as torch's differentiable tests use
        opt = cls([p], lr=0.1, t0=0, differentiable=True,
                  **({"foreach": False} if cls is torch.optim.ASGD else {}))
        p.grad = g
        opt.step()
        out = (p ** 2).sum() + opt.state[p]["ax"].sum()
        results.append(torch.autograd.grad(out, (p0, g)))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


def test_fused_none_picks_fused_op_on_meta():
    # One device rule (torchext._devices.KERNEL_DEVICES, C++'s twin tested by
    # ASGD.FusedDefaultMetaParamsTakeTheFusedOpAsInPython): meta params take
    # the fused op (its Meta kernel) and stay on meta; the unfused reference
    # would read eta on the host, which meta cannot.
    from torchext import _devices
    assert _devices.KERNEL_DEVICES == ("cpu", "cuda", "meta")
    cpu = torch.nn.Parameter(torch.randn(3))
    p = torch.nn.Parameter(torch.empty(4, device="meta"))
    opt = ASGD([cpu, p])
    cpu.grad = torch.ones(3)
    p.grad = torch.empty(4, device="meta")
    opt.step()
    assert opt.state[p]["ax"].is_meta
    assert opt.state[cpu]["step"].item() == 1.0
    ASGD([p], fused=True).step()
    with pytest.raises((RuntimeError, NotImplementedError)):
        ASGD([p], fused=False).step()


def test_fused_none_is_decided_over_every_param_of_the_group():
    # The fused default looks at every param of the group, with a grad or
    # not (the slot groups are built before any grad exists), as C++'s
    # ASGD::step (cpp_tests ASGD.FusedDefaultCountsParamsWithoutGrads, the
    # same case). A param without a grad on the lazy device (no torchext
    # kernels) makes the group unfused, so the meta param beside it takes
    # the reference step, which reads eta on the host and cannot on meta.
    import torch._lazy.ts_backend
    torch._lazy.ts_backend.init()
    meta = torch.nn.Parameter(torch.empty(3, device="meta"))
    lazy = torch.nn.Parameter(torch.zeros(3, device="lazy"))
    meta.grad = torch.empty(3, device="meta")
    with pytest.raises((RuntimeError, NotImplementedError), match="meta"):
        ASGD([meta, lazy]).step()
    ASGD([meta]).step()  # alone, the meta param takes the fused op (its Meta kernel)


def test_pickle_and_deepcopy():
    m = small_model()
    opt = ASGD(m.parameters(), **KW)
    x, y = data()
    train(m, opt, x, y, 2)
    clone = copy.deepcopy(opt)
    assert clone.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["param_groups"][0]["t0"] == 4


def test_step_shows_in_the_profiler_as_torchs_does():
    # torch wraps step() in a record_function range; torchext enters it only
    # while a profiler runs (it costs ~10 us of an eager step otherwise).
    names = {}
    for cls in (torch.optim.ASGD, torchext.optim.ASGD):
        p = torch.nn.Parameter(torch.randn(4))
        opt = cls([p], lr=0.1)
        p.grad = torch.ones(4)
        opt.step()  # outside the profiler: no range needed
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            opt.step()
        names[cls] = {e.key for e in prof.key_averages() if e.key.startswith("Optimizer.step")}
    assert names[torchext.optim.ASGD] == names[torch.optim.ASGD] == {"Optimizer.step#ASGD.step"}
    assert getattr(torchext.optim.ASGD.step, "hooked", False)


@pytest.mark.parametrize("key", ["lr", "lambd", "alpha", "weight_decay"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_hyperparameters_refused_everywhere(key, value):
    # inf for any of these makes the first step's params and state NaN.
    p, q = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2))
    with pytest.raises(ValueError, match="finite"):
        torchext.optim.ASGD([p], **{key: value})
    with pytest.raises(ValueError, match=rf"param_groups\[0\].*'{key}'"):
        torchext.optim.ASGD([{"params": [p], key: value}])
    opt = torchext.optim.ASGD([p], lr=0.1)
    with pytest.raises(ValueError, match=rf"param_groups\[1\].*'{key}'"):
        opt.add_param_group({"params": [q], key: value})
    assert len(opt.param_groups) == 1  # nothing added
    if key == "lr":  # a tensor lr is checked when it is given, not at each step
        with pytest.raises(ValueError, match="finite"):
            torchext.optim.ASGD([p], lr=torch.tensor(value))


@pytest.mark.parametrize("t0", [float("inf"), float("-inf")])
def test_infinite_t0_is_allowed_and_matches_torch(t0):
    # t0 is any number but NaN: inf means never average; -inf gives mu = 0
    # after the first step, as torch.
    p = torch.nn.Parameter(torch.randn(3))
    ref = torch.nn.Parameter(p.detach().clone())
    opt = torchext.optim.ASGD([p], lr=0.1, t0=t0)
    topt = torch.optim.ASGD([ref], lr=0.1, t0=t0, foreach=False)
    for _ in range(3):
        p.grad = torch.ones(3)
        ref.grad = torch.ones(3)
        opt.step()
        topt.step()
    assert torch.equal(p, ref)
    for k in ("ax", "mu", "eta", "step"):
        assert torch.equal(opt.state[p][k], topt.state[ref][k]), k
    with pytest.raises(ValueError, match="t0"):
        torchext.optim.ASGD([p], t0=float("nan"))


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_tensor_lr_refused_where_it_is_given(value):
    # A CPU tensor lr is read (no device sync) in the constructor, per group,
    # in add_param_group and in load_state_dict; nothing changes when refused.
    p, q = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2))
    for dtype in (torch.float32, torch.float64):
        bad = torch.tensor(value, dtype=dtype)
        with pytest.raises(ValueError, match="learning rate"):
            torchext.optim.ASGD([p], lr=bad)
        with pytest.raises(ValueError, match=r"param_groups\[0\].*'lr'"):
            torchext.optim.ASGD([{"params": [p], "lr": bad}], lr=torch.tensor(0.1))
        opt = torchext.optim.ASGD([p], lr=torch.tensor(0.1))
        with pytest.raises(ValueError, match=r"param_groups\[1\].*'lr'"):
            opt.add_param_group({"params": [q], "lr": bad})
        assert len(opt.param_groups) == 1
        p.grad = torch.ones(3)
        opt.step()
        sd = opt.state_dict()
        sd["param_groups"][0]["lr"] = bad
        before = (p.detach().clone(), copy.deepcopy(dict(opt.state[p])))
        with pytest.raises(ValueError, match=r"param_groups\[0\].*'lr'"):
            opt.load_state_dict(sd)
        assert torch.equal(p, before[0]) and opt.param_groups[0]["lr"].item() == pytest.approx(0.1)
        assert all(torch.equal(opt.state[p][k], v) for k, v in before[1].items())


def test_inf_lambd_checkpoint_in_the_first_group_is_refused():
    # issue 25's report: it loaded without a word and the next step went NaN
    p = torch.nn.Parameter(torch.randn(3))
    opt = torchext.optim.ASGD([p], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    sd = opt.state_dict()
    sd["param_groups"][0]["lambd"] = float("inf")
    with pytest.raises(ValueError, match=r"param_groups\[0\]: 'lambd' must be a finite number"):
        opt.load_state_dict(sd)
    assert opt.param_groups[0]["lambd"] == 1e-4
    opt.step()
    assert torch.isfinite(p).all() and all(torch.isfinite(v).all() for v in opt.state[p].values())


@pytest.mark.parametrize("key", ["lambd", "alpha", "weight_decay", "lr"])
def test_non_finite_value_set_after_construction_is_refused_by_the_step(key):
    # The op's validator refuses it before writing anything (lr: a float, or a
    # CPU tensor, read without a sync; a device lr is never read on the step).
    p = torch.nn.Parameter(torch.randn(3))
    opt = torchext.optim.ASGD([p], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    before = (p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()})
    for bad in (float("inf"), float("nan")):
        opt.param_groups[0][key] = bad
        with pytest.raises(ValueError, match="learning rate" if key == "lr" else key):
            opt.step()
    if key == "lr":
        opt.param_groups[0]["lr"] = torch.tensor(float("inf"))
        with pytest.raises(ValueError, match="learning rate"):
            opt.step()
    assert torch.equal(p, before[0])
    assert all(torch.equal(opt.state[p][k], v) for k, v in before[1].items())


def test_a_device_tensor_lr_is_not_read_at_construction():
    # Its value cannot be read without a sync (meta: it has none): only its
    # shape and dtype are checked; the user owns it, as with torch.
    m = torch.nn.Parameter(torch.empty(3, device="meta"))
    opt = torchext.optim.ASGD([m], lr=torch.tensor(0.1, device="meta"))
    opt.add_param_group({"params": [torch.nn.Parameter(torch.empty(2, device="meta"))],
                         "lr": torch.tensor(0.2, device="meta")})
    with pytest.raises(ValueError, match="1-element"):
        torchext.optim.ASGD([m], lr=torch.ones(2, device="meta"))


@requires_cuda
def test_a_cuda_tensor_lr_is_not_read_at_construction():
    from helpers import NoHostSync
    p = torch.nn.Parameter(torch.randn(3, device="cuda"))
    lr = torch.tensor(0.1, device="cuda")
    with NoHostSync():
        opt = torchext.optim.ASGD([p], lr=lr)
        opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(2, device="cuda"))],
                             "lr": lr})
    assert opt.param_groups[0]["lr"] is lr


def test_group_values_edited_between_steps_follow_torch():
    # The eager step keeps each slot group's lr tensor and hyperparameter
    # list between steps (ParamGroupSlots/SlotGroup.holder_args): every edit
    # of a group's values must still reach the next step, as in torch.
    model = small_model()
    ref_model = twin(model)
    ours = ASGD(model.parameters(), lr=0.05, t0=2)
    ref = torch.optim.ASGD(ref_model.parameters(), lr=0.05, t0=2, foreach=False)
    x, y = data()
    lr_t = torch.tensor(0.02, dtype=torch.float64)
    edits = [{}, {"lr": 0.03}, {}, {"lambd": 1e-2}, {"alpha": 0.5}, {"weight_decay": 0.1},
             {"maximize": True}, {"maximize": False, "t0": 0.0}, {"lr": lr_t}, {}, "in place",
             {"lr": 0.01}]
    for edit in edits:
        for opt in (ours, ref):
            group = opt.param_groups[0]
            if edit == "in place":
                group["lr"].fill_(0.04)  # the same tensor: only its value changes
            else:
                group.update({k: v.clone() if isinstance(v, torch.Tensor) else v
                              for k, v in edit.items()})
        train(model, ours, x, y, 1)
        train(ref_model, ref, x, y, 1)
        for a, b in zip(model.parameters(), ref_model.parameters()):
            assert torch.equal(a, b), edit
    for (ka, a), (kb, b) in zip(all_state(ours), all_state(ref)):
        assert ka == kb and torch.equal(a, b.to(a.dtype)), ka
