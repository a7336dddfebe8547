"""torchext.amp's apex API (initialize / scale_loss / ...): apex code runs with
only the import changed, on CPU (CUDA parts skip without a GPU)."""
import copy
import io
import os
import runpy
import types
import warnings

import pytest
import torch
import torch.nn.functional as F

import torchext
from torchext import amp
from torchext.amp import GradScaler
from torchext.amp import apex as amp_apex
from torchext.amp.apex._amp_state import _amp_state
from conftest import requires_cuda
from helpers import SRC, data

EXAMPLES = os.path.join(SRC, "examples")
LEVELS = ["O0", "O1", "O2", "O3"]
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "asgd": lambda params: torchext.optim.ASGD(params, lr=0.05, t0=5),
}


@pytest.fixture(autouse=True)
def fresh_amp():
    amp_apex.reset()
    yield
    amp_apex.reset()


def bn_model(seed=0, device="cpu"):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 12), torch.nn.BatchNorm1d(12), torch.nn.Tanh(),
        torch.nn.Linear(12, 3)).to(device)


def plain_model(seed=0, device="cpu"):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(),
                               torch.nn.Linear(12, 3)).to(device)


def poison(params, value=float("inf")):
    """Puts an inf/NaN into the first gradient (still scaled: inside the block)."""
    p = next(p for p in params if p.grad is not None)
    p.grad.view(-1)[1] = value


def half_dtype(device_type, level):
    if level == "O1":
        return torch.bfloat16 if device_type == "cpu" else torch.float16
    return torch.float16


# ------------------------------------------------------------ README loop

def readme_loop(level, opt_name, device="cpu", steps=25):
    model = bn_model(device=device)
    optimizer = OPTIMIZERS[opt_name](model.parameters())
    model, optimizer = amp.initialize(model, optimizer, opt_level=level, verbosity=0)
    x, y = data(device=device)
    losses, seen = [], {}
    for _ in range(steps):
        optimizer.zero_grad()
        output = model(x)
        loss = F.mse_loss(output, y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        # after the block: what the user would clip
        seen["grads"] = [p.grad.dtype for p in model.parameters()]
        seen["master_grads"] = [p.grad.dtype for p in amp.master_params(optimizer)]
        optimizer.step()
        losses.append(loss.item())
    seen["output"] = output.dtype
    return model, optimizer, losses, seen


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("level", LEVELS)
def test_readme_loop_each_level(level, opt_name):
    model, optimizer, losses, seen = readme_loop(level, opt_name)
    assert losses[-1] < 0.8 * losses[0]
    half = half_dtype("cpu", level)
    lin = [model[0].weight, model[0].bias, model[3].weight, model[3].bias]
    bn = [model[1].weight, model[1].bias]
    masters = list(amp.master_params(optimizer))
    if level in ("O0", "O1"):
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert seen["grads"] == [torch.float32] * 6
        assert [id(p) for p in masters] == [id(p) for p in model.parameters()]
        assert seen["output"] == (torch.float32 if level == "O0" else half)
    elif level == "O2":
        assert all(p.dtype == torch.float16 for p in lin)
        assert all(p.dtype == torch.float32 for p in bn)  # keep_batchnorm_fp32
        assert model[1].running_mean.dtype == torch.float32
        assert all(m.dtype == torch.float32 for m in masters)
        assert seen["grads"] == [torch.float16, torch.float16, torch.float32, torch.float32,
                                 torch.float16, torch.float16]
        assert seen["master_grads"] == [torch.float32] * 6
        # the masters are separate fp32 tensors; the model holds them rounded
        assert {id(m) for m in masters}.isdisjoint(id(p) for p in lin)
        by_shape = {(tuple(m.shape), i): m for i, m in enumerate(masters)}
        for i, p in enumerate(model.parameters()):
            assert torch.equal(p, by_shape[(tuple(p.shape), i)].to(p.dtype))
        assert seen["output"] == torch.float32  # outputs are cast back, as apex
    else:  # O3
        assert all(p.dtype == torch.float16 for p in model.parameters())
        assert seen["grads"] == [torch.float16] * 6
        assert [id(p) for p in masters] == [id(p) for p in model.parameters()]
        assert seen["output"] == torch.float32
        assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 1.0


def test_returns_same_shape_as_given():
    m1, m2 = plain_model(), plain_model(1)
    o1, o2 = OPTIMIZERS["sgd"](m1.parameters()), OPTIMIZERS["sgd"](m2.parameters())
    m, o = amp.initialize(m1, o1, verbosity=0)
    assert m is m1 and o is o1
    amp_apex.reset()
    ms, os_ = amp.initialize([m1, m2], [o1, o2], verbosity=0)
    assert ms == [m1, m2] and os_ == [o1, o2]
    amp_apex.reset()
    m, os_ = amp.initialize(m1, [o1], verbosity=0)
    assert m is m1 and os_ == [o1]
    amp_apex.reset()
    assert amp.initialize(m1, verbosity=0) is m1  # inference: no optimizers
    amp_apex.reset()
    assert amp.initialize([m1], verbosity=0) == [m1]


def test_disabled_is_a_no_op():
    model = plain_model()
    opt = OPTIMIZERS["sgd"](model.parameters())
    m, o = amp.initialize(model, opt, enabled=False)
    assert m is model and o is opt and type(opt) is torch.optim.SGD
    loss = F.mse_loss(model(data()[0]), data()[1])
    with amp.scale_loss(loss, opt) as scaled:
        assert scaled is loss


def test_initialize_prints_summary(capsys):
    amp.initialize(plain_model(), opt_level="O2")
    out = capsys.readouterr().out
    assert "O2" in out and "master weights" in out


# -------------------------------------------------------------- O1 parity

INF_AT = {2: float("inf"), 3: float("nan"), 9: float("-inf")}


@pytest.mark.parametrize("unscale_first", [False, True])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_o1_matches_autocast_and_gradscaler_by_hand(opt_name, unscale_first):
    """Bit for bit, with the plain scale/step/update loop, and with an explicit
    unscale_ before step (what the end of apex's block does)."""
    x, y = data()
    # apex API
    m1 = plain_model()
    o1 = OPTIMIZERS[opt_name](m1.parameters())
    m1, o1 = amp.initialize(m1, o1, opt_level="O1", verbosity=0)
    _amp_state.loss_scalers[0].scaler.set_growth_interval(4)  # exercise growth too
    # by hand: the same scaler settings as apex's dynamic scale
    m2 = plain_model()
    o2 = OPTIMIZERS[opt_name](m2.parameters())
    s2 = GradScaler(init_scale=2.0**16, growth_interval=4, max_scale=2.0**24)
    r1, r2 = [], []
    for i in range(20):
        o1.zero_grad()
        loss = F.mse_loss(m1(x), y)
        with amp.scale_loss(loss, o1) as scaled:
            scaled.backward()
            if i in INF_AT:
                poison(m1.parameters(), INF_AT[i])
        o1.step()
        r1.append((_amp_state.loss_scalers[0].loss_scale(), loss.item()))

        o2.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m2(x)
        loss = F.mse_loss(out, y)
        s2.scale(loss).backward()
        if i in INF_AT:
            poison(m2.parameters(), INF_AT[i])
        if unscale_first:
            s2.unscale_(o2)
        s2.step(o2)
        s2.update()
        r2.append((s2.get_scale(), loss.item()))
    assert r1 == r2
    assert len({s for s, _ in r1}) >= 3  # backed off and grew
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    state = amp.state_dict()["loss_scaler0"]
    assert state == {"loss_scale": s2.get_scale(), "unskipped": s2._get_growth_tracker()}


def test_o1_autocast_dtype_override_and_cast_model_outputs():
    model = amp.initialize(plain_model(), opt_level="O1", autocast_dtype=torch.float16,
                           cast_model_outputs=torch.float32, verbosity=0)
    assert model(data()[0]).dtype == torch.float32
    amp_apex.reset()
    model = amp.initialize(plain_model(), opt_level="O1", autocast_dtype=torch.float16,
                           verbosity=0)
    assert model(data()[0]).dtype == torch.float16


# ------------------------------------------------------------------- O2

@pytest.mark.parametrize("opt_name", ["sgd", "asgd"])
def test_o2_masters_get_the_update_and_overflow_skips(opt_name):
    lr = 0.05
    model = plain_model()
    init = [p.detach().clone() for p in model.parameters()]
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    else:
        opt = torchext.optim.ASGD(model.parameters(), lr=lr, lambd=0.0, alpha=0.0, t0=1e6)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    masters = list(amp.master_params(opt))
    # masters are exact fp32 copies of the weights given, not of the rounded ones
    for m, p0 in zip(masters, init):
        assert m.dtype == torch.float32 and torch.equal(m, p0)
    x, y = data()
    scaler = _amp_state.loss_scalers[0]

    # a normal step: masters get lr * (model's fp16 grad, unscaled in fp32)
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
        half_grads = [p.grad.detach().clone() for p in model.parameters()]
    assert all(g.dtype == torch.float16 for g in half_grads)
    scale = scaler.loss_scale()
    for m, g in zip(masters, half_grads):
        assert torch.equal(m.grad, g.float() * (1.0 / scale))  # unscaled master grads
    before = [m.detach().clone() for m in masters]
    opt.step()
    for m, b, g in zip(masters, before, half_grads):
        expected = b - lr * (g.float() * (1.0 / scale))
        assert torch.allclose(m, expected, rtol=1e-6, atol=1e-7)
        assert not torch.equal(m, b)
    for p, m in zip(model.parameters(), masters):
        assert p.dtype == torch.float16 and torch.equal(p, m.half())

    # an injected overflow: step skipped, scale halved
    before = [m.detach().clone() for m in masters]
    model_before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
        poison(model.parameters())
    assert scaler.loss_scale() == scale / 2
    opt.step()
    for m, b in zip(masters, before):
        assert torch.equal(m, b)
    for p, b in zip(model.parameters(), model_before):
        assert torch.equal(p, b)
    if opt_name == "asgd":
        assert opt.state[masters[0]]["step"].item() == 1  # the skip did not count


def test_o2_zero_grad_and_model_load_state_dict():
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    x, y = data()
    loss = F.mse_loss(model(x), y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    opt.zero_grad()  # clears the model's fp16 grads too, as apex
    assert all(p.grad is None for p in model.parameters())
    assert all(m.grad is None for m in amp.master_params(opt))
    # loading the (half) model refreshes the masters from it
    saved = {k: torch.full_like(v, 0.25) for k, v in model.state_dict().items()}
    model.load_state_dict(saved)
    assert all(torch.equal(m, torch.full_like(m, 0.25)) for m in amp.master_params(opt))


def test_o2_bf16_cast_model_type():
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O2", cast_model_type=torch.bfloat16,
                                verbosity=0)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(m.dtype == torch.float32 for m in amp.master_params(opt))


def test_o3_dynamic_scale_unscales_fp16_grads():
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O3", loss_scale="dynamic", verbosity=0)
    x, y = data()
    loss = F.mse_loss(model(x), y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
        poison(model.parameters())
    assert _amp_state.loss_scalers[0].loss_scale() == 2.0**15
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_static_loss_scale_stays_and_skips_overflow():
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O1", loss_scale="128.0", verbosity=0)
    x, y = data()
    for i in range(3):
        opt.zero_grad()
        before = [p.detach().clone() for p in model.parameters()]
        loss = F.mse_loss(model(x), y)
        with amp.scale_loss(loss, opt) as scaled:
            assert torch.equal(scaled, loss.float() * 128.0)
            scaled.backward()
            if i == 1:
                poison(model.parameters())
        opt.step()
        changed = any(not torch.equal(p, b) for p, b in zip(model.parameters(), before))
        assert changed == (i != 1)
        assert _amp_state.loss_scalers[0].loss_scale() == 128.0


# ------------------------------------------------------------ two losses

def reference_grads(model, x, y, losses_fn):
    ref = copy.deepcopy(model)
    sum(losses_fn(ref, x, y)).backward()
    return [p.grad for p in ref.parameters()]


def two_losses(model, x, y):
    out = model(x)
    return [F.mse_loss(out, y), out.abs().mean()]


def test_two_losses_have_separate_scales():
    model = plain_model()
    x, y = data()
    ref = reference_grads(model, x, y, two_losses)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O0", loss_scale="dynamic", num_losses=2,
                                verbosity=0)
    s0, s1 = _amp_state.loss_scalers
    s1.load(2.0**10, 0)
    l0, l1 = two_losses(model, x, y)
    with amp.scale_loss(l0, opt, loss_id=0) as scaled:
        assert scaled.item() == pytest.approx(l0.item() * 2.0**16)
        scaled.backward(retain_graph=True)
    with amp.scale_loss(l1, opt, loss_id=1) as scaled:
        assert scaled.item() == pytest.approx(l1.item() * 2.0**10)
        scaled.backward()
    # each loss's grads unscaled with its own scale, then summed
    for p, r in zip(model.parameters(), ref):
        assert torch.allclose(p.grad, r, rtol=1e-5, atol=1e-7)
    opt.step()

    # an overflow in loss 1 halves loss 1's scale only, and skips the step
    opt.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    l0, l1 = two_losses(model, x, y)
    with amp.scale_loss(l0, opt, loss_id=0) as scaled:
        scaled.backward(retain_graph=True)
    with amp.scale_loss(l1, opt, loss_id=1) as scaled:
        scaled.backward()
        poison(model.parameters())
    assert (s0.loss_scale(), s1.loss_scale()) == (2.0**16, 2.0**9)
    opt.step()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    sd = amp.state_dict()
    assert sd["loss_scaler0"] == {"loss_scale": 2.0**16, "unskipped": 2}
    assert sd["loss_scaler1"] == {"loss_scale": 2.0**9, "unskipped": 0}
    with pytest.raises(IndexError, match="num_losses"):
        with amp.scale_loss(l0, opt, loss_id=2):
            pass


def test_two_optimizers_one_loss_skip_together():
    m1, m2 = plain_model(), plain_model(1)
    o1 = torch.optim.SGD(m1.parameters(), lr=0.05)
    o2 = torchext.optim.ASGD(m2.parameters(), lr=0.05)
    [m1, m2], [o1, o2] = amp.initialize([m1, m2], [o1, o2], opt_level="O2", verbosity=0)
    x, y = data()
    before = [p.detach().clone() for p in list(m1.parameters()) + list(m2.parameters())]
    loss = F.mse_loss(m1(x) + m2(x), y)
    with amp.scale_loss(loss, [o1, o2]) as scaled:
        scaled.backward()
        poison(m2.parameters())
    o1.step()
    o2.step()
    after = list(m1.parameters()) + list(m2.parameters())
    assert all(torch.equal(p, b) for p, b in zip(after, before))


# ------------------------------------------------------------ state_dict

def test_state_dict_round_trip_and_apex_format():
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    x, y = data()
    for i in range(5):
        opt.zero_grad()
        with amp.scale_loss(F.mse_loss(model(x), y), opt) as scaled:
            scaled.backward()
            if i == 1:
                poison(model.parameters())
        opt.step()
    sd = amp.state_dict()
    assert sd == {"loss_scaler0": {"loss_scale": 2.0**15, "unskipped": 3}}
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)

    amp_apex.reset()
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    amp.load_state_dict(loaded)
    assert amp.state_dict() == sd
    # an apex checkpoint's "amp" entry: unskipped maps to the growth tracker
    apex_ckpt = {"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 1999}}
    amp.load_state_dict(apex_ckpt)
    scaler = _amp_state.loss_scalers[0]
    assert scaler._loss_scale == 1024.0 and scaler._unskipped == 1999
    assert scaler.scaler._get_growth_tracker() == 1999
    opt.zero_grad()
    with amp.scale_loss(F.mse_loss(model(x), y), opt) as scaled:
        scaled.backward()
    opt.step()
    # apex's rule: 2000 unskipped steps double the scale
    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": 2048.0, "unskipped": 0}

    with pytest.raises(RuntimeError, match="Unexpected key"), pytest.warns(UserWarning):
        amp.load_state_dict({"loss_scaler0": apex_ckpt["loss_scaler0"], "bogus": {}})
    with pytest.warns(UserWarning, match="2 entries"), pytest.warns(UserWarning, match="Skipping"):
        amp.load_state_dict({"loss_scaler0": {"loss_scale": 8.0, "unskipped": 0},
                             "loss_scaler1": {"loss_scale": 4.0, "unskipped": 0}})
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 8.0


def test_state_dict_of_static_scale():
    amp.initialize(plain_model(), opt_level="O3", verbosity=0)
    assert amp.state_dict() == {"loss_scaler0": {"loss_scale": 1.0, "unskipped": 0}}
    amp.load_state_dict({"loss_scaler0": {"loss_scale": 64.0, "unskipped": 0}})
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 64.0


# ----------------------------------------------------------- LR scheduler

@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("scheduler_first", [False, True])
def test_skipped_step_does_not_trip_lr_scheduler_warning(opt_name, scheduler_first):
    model = plain_model()
    opt = OPTIMIZERS[opt_name](model.parameters())
    if scheduler_first:
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    if not scheduler_first:
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any scheduler warning fails the test
        for i in range(3):
            opt.zero_grad()
            before = [p.detach().clone() for p in model.parameters()]
            with amp.scale_loss(F.mse_loss(model(x), y), opt) as scaled:
                scaled.backward()
                if i == 0:
                    poison(model.parameters())  # the first step overflows, as is common
            opt.step()
            sched.step()
            changed = any(not torch.equal(p, b) for p, b in zip(model.parameters(), before))
            assert changed == (i != 0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 / 8)


def test_apex_style_step_patch_would_warn():
    """Why the wrapper matters: replacing step() with a no-op, as apex does on
    overflow, makes torch's scheduler warn."""
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    real = opt.step
    opt.step = lambda closure=None: setattr(opt, "step", real)  # apex's skip_step
    opt.step()
    with pytest.warns(UserWarning):
        sched.step()


# ----------------------------------------------------- gradient accumulation

@pytest.mark.parametrize("delay_unscale", [True, False])
def test_gradient_accumulation(delay_unscale):
    model = plain_model()
    x, y = data(n=24)
    chunks = list(zip(x.chunk(3), y.chunk(3)))
    ref = copy.deepcopy(model)
    sum(F.mse_loss(ref(a), b) for a, b in chunks).backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O0", loss_scale="dynamic", verbosity=0)
    opt.zero_grad()
    for k, (a, b) in enumerate(chunks):
        last = k == len(chunks) - 1
        with amp.scale_loss(F.mse_loss(model(a), b), opt,
                            delay_unscale=delay_unscale and not last) as scaled:
            scaled.backward()
        if delay_unscale and not last:
            # still scaled: a step now would be wrong, and says so
            assert not torch.allclose(model[0].weight.grad, ref[0].weight.grad, rtol=0.5)
    for p, r in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, r.grad, rtol=1e-5, atol=1e-7)
    opt.step()


def test_step_after_delay_unscale_only_raises():
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    x, y = data()
    with amp.scale_loss(F.mse_loss(model(x), y), opt, delay_unscale=True) as scaled:
        scaled.backward()
    with pytest.raises(RuntimeError, match="delay_unscale=False"):
        opt.step()


def test_o2_accumulation_with_delay_unscale():
    model = plain_model()
    x, y = data(n=24)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    chunks = list(zip(x.chunk(2), y.chunk(2)))
    opt.zero_grad()
    with amp.scale_loss(F.mse_loss(model(chunks[0][0]), chunks[0][1]), opt,
                        delay_unscale=True) as scaled:
        scaled.backward()
    with amp.scale_loss(F.mse_loss(model(chunks[1][0]), chunks[1][1]), opt) as scaled:
        scaled.backward()
    scale = _amp_state.loss_scalers[0].loss_scale()
    for p, m in zip(model.parameters(), amp.master_params(opt)):
        assert torch.equal(m.grad, p.grad.float() * (1.0 / scale))  # both chunks, unscaled


# ------------------------------------------------------------------ errors

def test_initialize_again_as_apex():
    """apex allows another initialize with new models and optimizers (a second
    model, a rerun notebook cell); the new call's loss scalers replace the
    old ones. It refuses an optimizer that went through initialize already,
    and non-fp32 models."""
    m1 = plain_model()
    o1 = torch.optim.SGD(m1.parameters(), lr=0.05)
    m1, o1 = amp.initialize(m1, o1, opt_level="O1", verbosity=0)
    first = list(_amp_state.loss_scalers)
    with pytest.raises(RuntimeError, match="A given optimizer should only be passed through "
                                           "amp.initialize once"):
        amp.initialize(plain_model(1), o1, opt_level="O1", verbosity=0)
    with pytest.raises(RuntimeError, match="expects an fp32 model"):
        amp.initialize(plain_model(1).half(), opt_level="O2", verbosity=0)
    assert _amp_state.loss_scalers == first  # the refused calls changed nothing
    m2 = plain_model(1)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.05)
    m2, o2 = amp.initialize(m2, o2, opt_level="O2", num_losses=2, verbosity=0)
    assert len(_amp_state.loss_scalers) == 2
    assert all(ls not in first for ls in _amp_state.loss_scalers)  # replaced
    assert _amp_state.opt_properties["opt_level"] == "O2"
    # Both set-ups keep working: the O1 model still autocasts, the O2 model is half.
    x, y = data()
    for model, opt in ((m1, o1), (m2, o2)):
        w0 = [p.detach().clone() for p in model.parameters()]
        with amp.scale_loss(F.mse_loss(model(x).float(), y), opt) as scaled:
            scaled.backward()
        opt.step()
        assert all(not torch.equal(p, w) for p, w in zip(model.parameters(), w0))
    assert m1(x).dtype == torch.bfloat16  # still O1: its forward autocasts (bf16 on CPU)
    assert next(m2.parameters()).dtype == torch.float16
    # The same O1 model again: one patch, not two nested ones.
    m1 = amp.initialize(m1, opt_level="O1", verbosity=0)
    assert m1.forward.previous is None
    amp_apex.reset()
    assert "forward" not in m1.__dict__ and type(o1) is torch.optim.SGD


def test_initialize_after_parallel_wrapping_raises(tmp_path):
    import torch.distributed as dist
    with pytest.raises(RuntimeError, match="amp.initialize.*first, then wrap"):
        amp.initialize(torch.nn.DataParallel(plain_model()), verbosity=0)
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                                rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(plain_model())
        with pytest.raises(RuntimeError, match="DistributedDataParallel.*first, then wrap"):
            amp.initialize(ddp, verbosity=0)
    finally:
        if own:
            dist.destroy_process_group()
    assert not _amp_state.initialized  # a failed initialize leaves nothing behind


def test_other_errors():
    with pytest.raises(RuntimeError, match="amp.initialize.*must be called"):
        with amp.scale_loss(torch.ones(()), torch.optim.SGD(plain_model().parameters(), lr=1)):
            pass
    with pytest.raises(RuntimeError, match="Options are"):
        amp.initialize(plain_model(), opt_level="O4", verbosity=0)
    with pytest.raises(RuntimeError, match="Do not call .half"):
        amp.initialize(plain_model().half(), opt_level="O2", verbosity=0)
    with pytest.raises(RuntimeError, match="O2"):
        amp.initialize(plain_model(), opt_level="O1", cast_model_type=torch.float16, verbosity=0)
    with pytest.raises(TypeError, match="Optimizer"):
        amp.initialize(plain_model(), object(), verbosity=0)
    with pytest.raises(RuntimeError, match="torch.compile"):
        amp.initialize(torch.compile(plain_model()), verbosity=0)
    assert not _amp_state.initialized
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, verbosity=0)
    stranger = torch.optim.SGD(plain_model().parameters(), lr=0.05)
    with pytest.raises(RuntimeError, match="not passed to amp.initialize"):
        with amp.scale_loss(F.mse_loss(model(data()[0]), data()[1]), stranger):
            pass
    with pytest.raises(RuntimeError, match="[Cc]losure"):
        with amp.scale_loss(F.mse_loss(model(data()[0]), data()[1]), opt) as scaled:
            scaled.backward()
        opt.step(lambda: None)


def test_public_names():
    """torchext.amp exports apex's API and reset(), and no private state."""
    for name in ("initialize", "scale_loss", "master_params", "state_dict", "load_state_dict",
                 "disable_casts", "register_half_function", "register_float_function",
                 "register_promote_function", "half_function", "float_function",
                 "promote_function", "reset"):
        assert name in amp.__all__ and getattr(amp, name) is getattr(amp_apex, name)
    assert not hasattr(amp, "_amp_state")


def test_reset_restores_patches():
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    amp.initialize(model, opt, opt_level="O1", verbosity=0)
    assert "forward" in model.__dict__ and type(opt) is not torch.optim.SGD
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    amp_apex.reset()
    assert "forward" not in model.__dict__ and type(opt) is torch.optim.SGD
    assert model(data()[0]).dtype == torch.float32


def test_deepcopy_keeps_the_copy_working():
    model = amp.initialize(plain_model(), opt_level="O1", verbosity=0)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone[0].weight.zero_()
    x = data()[0]
    assert not torch.equal(model(x), clone(x))  # the copy's forward runs the copy
    assert clone(x).dtype == torch.bfloat16


def test_step_hooks_run_once_even_after_deepcopy():
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    calls = []
    opt.register_step_pre_hook(lambda *a: calls.append("pre"))
    copy.deepcopy(opt)  # runs Optimizer.__setstate__ on a copy of amp's class
    x, y = data()
    with amp.scale_loss(F.mse_loss(model(x), y), opt) as scaled:
        scaled.backward()
    opt.step()
    assert calls == ["pre"]


def test_whole_model_and_optimizer_pickle():
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    buf = io.BytesIO()
    torch.save({"model": model, "opt": opt}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    x = data()[0]
    assert torch.equal(loaded["model"](x), model(x))  # still runs under autocast
    assert loaded["model"](x).dtype == torch.bfloat16
    assert type(loaded["opt"]) is torch.optim.SGD  # a plain optimizer, outside amp
    copied = copy.deepcopy(opt)
    assert type(copied) is torch.optim.SGD
    copied.step()


# ------------------------------------------------------------ cast helpers

def test_disable_casts():
    model = amp.initialize(plain_model(), opt_level="O1", verbosity=0)
    x = data()[0]
    assert model(x).dtype == torch.bfloat16
    with amp.disable_casts():
        assert model(x).dtype == torch.float32
    assert model(x).dtype == torch.bfloat16


def test_register_functions():
    ns = types.ModuleType("userops")
    seen = {}

    def record(name):
        def fn(a, b):
            seen[name] = (a.dtype, b.dtype, torch.is_autocast_enabled("cpu"))
            return a + b
        return fn

    for name in ("half_fn", "float_fn", "promote_fn"):
        setattr(ns, name, record(name))
    amp.register_half_function(ns, "half_fn")
    amp.register_float_function(ns, "float_fn")
    amp.register_promote_function(ns, "promote_fn")
    a32, b16 = torch.ones(2), torch.ones(2, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ns.half_fn(a32, a32)
        ns.float_fn(b16, b16)
        ns.promote_fn(a32, b16)
    assert seen["half_fn"] == (torch.bfloat16, torch.bfloat16, False)
    assert seen["float_fn"] == (torch.float32, torch.float32, False)
    assert seen["promote_fn"] == (torch.float32, torch.float32, False)
    ns.half_fn(a32, a32)  # outside autocast: untouched
    assert seen["half_fn"] == (torch.float32, torch.float32, False)
    with torch.autocast("cpu", dtype=torch.bfloat16), amp.disable_casts():
        ns.float_fn(b16, b16)
    assert seen["float_fn"][:2] == (torch.bfloat16, torch.bfloat16)
    with pytest.raises(ValueError, match="No function named"):
        amp.register_half_function(ns, "missing")


def test_register_float_function_inside_o1_model():
    ns = types.ModuleType("userops2")
    ns.softplus = F.softplus
    amp.register_float_function(ns, "softplus")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 3)

        def forward(self, x):
            return ns.softplus(self.lin(x))

    model = amp.initialize(Net(), opt_level="O1", verbosity=0)
    assert model(data()[0]).dtype == torch.float32


def test_cast_decorators():
    @amp.half_function
    def h(a):
        return a.dtype

    @amp.float_function
    def f(a):
        return a.dtype

    @amp.promote_function
    def pr(a, b):
        return a.dtype, b.dtype

    x32, x16 = torch.ones(2), torch.ones(2, dtype=torch.bfloat16)
    assert (h(x32), f(x16), pr(x32, x16)) == (torch.float32, torch.bfloat16,
                                              (torch.float32, torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (h(x32), f(x16), pr(x32, x16)) == (torch.bfloat16, torch.float32,
                                                  (torch.float32, torch.float32))


def test_o2_casts_nested_inputs():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 3)

        def forward(self, batch):
            x, idx = batch["x"][0], batch["idx"]
            assert x.dtype == torch.float16 and idx.dtype == torch.int64
            return {"out": self.lin(x)[idx], "aux": [x.sum()]}

    model = amp.initialize(Net(), opt_level="O2", verbosity=0)
    out = model({"x": [data()[0]], "idx": torch.tensor([0, 2])})
    assert out["out"].dtype == torch.float32 and out["aux"][0].dtype == torch.float32


def test_failed_block_restores_grads():
    model = plain_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    x, y = data()
    with amp.scale_loss(F.mse_loss(model(x), y), opt) as scaled:
        scaled.backward()
    kept = [p.grad.clone() for p in model.parameters()]
    with pytest.raises(ValueError):
        with amp.scale_loss(F.mse_loss(model(x), y), opt) as scaled:
            scaled.backward()
            raise ValueError("user error in the block")
    assert all(torch.equal(p.grad, k) for p, k in zip(model.parameters(), kept))
    opt.step()  # still works


# -------------------------------------------------------------- example

def test_example_runs(capsys):
    runpy.run_path(os.path.join(EXAMPLES, "apex_migration.py"), run_name="__main__")
    assert "loss went down" in capsys.readouterr().out


# ------------------------------------------------------------------- CUDA

@requires_cuda
@pytest.mark.parametrize("opt_name", ["sgd", "asgd"])
@pytest.mark.parametrize("level", LEVELS)
def test_readme_loop_cuda(level, opt_name):
    model, optimizer, losses, seen = readme_loop(level, opt_name, device="cuda")
    assert losses[-1] < 0.8 * losses[0]
    if level == "O1":
        assert seen["output"] == torch.float16
    if level == "O2":
        assert all(m.dtype == torch.float32 for m in amp.master_params(optimizer))
        assert model[0].weight.dtype == torch.float16


@requires_cuda
def test_o1_cuda_overflow_skips_on_device_without_sync():
    model = plain_model(device="cuda")
    opt = torchext.optim.ASGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    x, y = data(device="cuda")
    before = [p.detach().clone() for p in model.parameters()]
    with amp.scale_loss(F.mse_loss(model(x), y), opt) as scaled:
        scaled.backward()
        poison(model.parameters())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert _amp_state.loss_scalers[0].loss_scale() == 2.0**15
