"""The fused clip at the edges where it once trained wrong without an error
(issue 40's list), each against torch's recipe or the documented refusal:
large loss scales, a clip that outlives its gradients, two clips, a retried
step, fp16 on every path, optimizers with no gradients, and the drop-ins
installed in torch's place (PyTorch's own clip cases, ours)."""
import copy
import math

import pytest
import torch

import torchext
from torch.amp.grad_scaler import OptState
from torchext.amp import GradScaler
from conftest import requires_cuda
from helpers import rel_err


def one_weight(init=1.0):
    return torch.nn.Parameter(torch.tensor([init]))


# ------------------------------------------------------ 1. large loss scales

@pytest.mark.parametrize("opt_kind", ["asgd", "adamw-fused", "sgd-plain"])
def test_clip_at_the_top_scale_trains_as_torch(opt_kind):
    """Scale 2**127 (where bf16/fp32 grads let torch's scaler grow), grads
    near 1 (scaled: 1.7e38, finite) and max_norm 0.1: scale / coef (1.7e39)
    overflows float32, and the folded step once took a zero update. The
    weight moves as torch's recipe moves it."""
    def make(w, ours):
        if opt_kind == "asgd":
            return (torchext.optim.ASGD([w], lr=0.05) if ours
                    else torch.optim.ASGD([w], lr=0.05, foreach=False))
        if opt_kind == "adamw-fused":
            return torch.optim.AdamW([w], lr=0.1, fused=True)
        return torch.optim.SGD([w], lr=0.1)

    runs = []
    for ours in (False, True):
        w = one_weight()
        opt = make(w, ours)
        scaler = (GradScaler if ours else torch.amp.GradScaler)(
            "cpu", init_scale=2.0 ** 127, growth_interval=10 ** 6)
        for _ in range(4):
            opt.zero_grad()
            scaler.scale((w ** 2).sum() * 0.5).backward()
            if ours:
                norm = scaler.clip_grad_norm_(opt, 0.1)
            else:
                scaler.unscale_(opt)
                norm = torch.nn.utils.clip_grad_norm_([w], 0.1)
            assert torch.isfinite(w.grad).all() and norm > 0.1  # clipping active
            scaler.step(opt)
            scaler.update()
        assert scaler.get_scale() == 2.0 ** 127  # no overflow: the scale stayed on top
        runs.append(w.detach().clone())
    torch_w, our_w = runs
    assert torch_w.item() < 0.99  # torch's recipe moves the weight
    assert rel_err(our_w, torch_w) <= 1e-6


def test_plain_path_factor_never_goes_denormal():
    """A plain optimizer's gradients are unscaled then clipped as two
    factors: (1 / 2**127) * 1e-5 is a float32 denormal (precision lost)."""
    grads = []
    for ours in (False, True):
        w = one_weight()
        opt = torch.optim.SGD([w], lr=0.1)
        scaler = (GradScaler if ours else torch.amp.GradScaler)("cpu", init_scale=2.0 ** 127)
        scaler.scale(((w - 3.0) ** 2).sum() * 1e-6).backward()
        if ours:
            scaler.clip_grad_norm_(opt, 1e-11)
        else:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_([w], 1e-11)
        scaler.step(opt)
        grads.append(w.grad.clone())
    assert grads[0].item() != 0 and rel_err(grads[1], grads[0]) <= 1e-6


# ------------------------------------------- 2. a clip outlives its gradients

def asgd_pair():
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 1)
    m2 = copy.deepcopy(m)
    return (m, torch.optim.ASGD(m.parameters(), lr=0.1, foreach=False),
            m2, torchext.optim.ASGD(m2.parameters(), lr=0.1))


def batch(seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 4, generator=g) * scale, torch.randn(8, 1, generator=g)


@pytest.mark.parametrize("zero_grad", ["optimizer", "model-none", "model-zeros"])
def test_a_clip_of_a_skipped_batch_applies_to_nothing_after_it(zero_grad):
    m1, o1, m2, o2 = asgd_pair()
    x, y = batch(0, scale=30.0)
    for m in (m1, m2):
        torch.nn.functional.mse_loss(m(x), y).backward()
    torch.nn.utils.clip_grad_norm_(m1.parameters(), 0.01)
    o2.clip_grad_norm_(0.01)  # ... and the loop skips this batch
    x, y = batch(1)
    if zero_grad == "optimizer":
        o1.zero_grad()
        o2.zero_grad()
    else:
        set_to_none = zero_grad == "model-none"
        m1.zero_grad(set_to_none=set_to_none)
        m2.zero_grad(set_to_none=set_to_none)
    for m in (m1, m2):
        torch.nn.functional.mse_loss(m(x), y).backward()
    o1.step()
    o2.step()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-6


def test_a_nan_norm_batch_skipped_by_the_user_leaves_the_next_step_finite():
    m1, o1, m2, o2 = asgd_pair()
    x, y = batch(0)
    for m in (m1, m2):
        torch.nn.functional.mse_loss(m(x), y).backward()
        next(m.parameters()).grad[0, 0] = float("nan")
    assert torch.nn.utils.clip_grad_norm_(m1.parameters(), 1.0).isnan()
    assert o2.clip_grad_norm_(1.0).isnan()  # the user skips the batch
    for m, o in ((m1, o1), (m2, o2)):
        m.zero_grad()
        torch.nn.functional.mse_loss(m(batch(1)[0]), batch(1)[1]).backward()
        o.step()
    assert all(torch.isfinite(p).all() for p in m2.parameters())
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-6


def test_an_optimizer_rebuilt_from_its_state_dict_between_clip_and_step_steps_clipped():
    m1, o1, m2, o2 = asgd_pair()
    x, y = batch(0, scale=30.0)
    for m, o in ((m1, o1), (m2, o2)):
        torch.nn.functional.mse_loss(m(x), y).backward()
        o.step()
        o.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
    torch.nn.utils.clip_grad_norm_(m1.parameters(), 0.01)
    o2.clip_grad_norm_(0.01)
    # (the clip applied when called: the grads hold the clipped values)
    sd1, sd2 = copy.deepcopy(o1.state_dict()), copy.deepcopy(o2.state_dict())
    o1 = torch.optim.ASGD(m1.parameters(), lr=0.1, foreach=False)
    o1.load_state_dict(sd1)
    o2 = torchext.optim.ASGD(m2.parameters(), lr=0.1)
    o2.load_state_dict(sd2)
    o1.step()
    o2.step()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-6


def test_an_in_place_round_trip_between_clip_and_step_and_a_second_step():
    m1, o1, m2, o2 = asgd_pair()
    for i in range(3):
        x, y = batch(i, scale=30.0)
        for m, o in ((m1, o1), (m2, o2)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
        torch.nn.utils.clip_grad_norm_(m1.parameters(), 0.01)
        o2.clip_grad_norm_(0.01)
        o2.load_state_dict(copy.deepcopy(o2.state_dict()))
        o1.load_state_dict(copy.deepcopy(o1.state_dict()))
        o1.step()
        o2.step()
        o1.step()  # a second step over the same (clipped) grads: not clipped again
        o2.step()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= 1e-6


# ----------------------------------------------------------------- 3. two clips

@pytest.mark.parametrize("path", ["asgd", "disabled-scaler", "scaler", "scaler-sgd"])
def test_a_second_clip_composes_as_torchs(path):
    """The smaller bound wins and the second clip returns the clipped norm."""
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 1)
    ms = [m, copy.deepcopy(m)]
    x, y = batch(2, scale=10.0)
    sgd = path == "scaler-sgd"
    o1 = (torch.optim.SGD(ms[0].parameters(), lr=0.1) if sgd
          else torch.optim.ASGD(ms[0].parameters(), lr=0.1, foreach=False))
    o2 = (torch.optim.SGD(ms[1].parameters(), lr=0.1) if sgd
          else torchext.optim.ASGD(ms[1].parameters(), lr=0.1))
    scaling = path.startswith("scaler")
    s1 = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=path != "disabled-scaler")
    s2 = GradScaler("cpu", init_scale=1024.0, enabled=path != "disabled-scaler")
    norms = [[], []]
    for k, (model, opt, scaler) in enumerate(((ms[0], o1, s1), (ms[1], o2, s2))):
        loss = torch.nn.functional.mse_loss(model(x), y)
        (scaler.scale(loss) if scaling else loss).backward()
        if k == 0:
            if scaling:
                scaler.unscale_(opt)
            for bound in (0.5, 0.05, 1.0):
                norms[0].append(torch.nn.utils.clip_grad_norm_(model.parameters(), bound))
        else:
            clip = (opt.clip_grad_norm_ if path == "asgd"
                    else lambda b: scaler.clip_grad_norm_(opt, b))
            for bound in (0.5, 0.05, 1.0):
                norms[1].append(clip(bound))
        if path == "asgd":
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
    for a, b in zip(*norms):
        assert rel_err(b, a) <= 1e-5
    assert norms[0][1] < 0.51 and norms[0][2] < 0.051  # each clip saw the clipped grads
    for p1, p2 in zip(ms[0].parameters(), ms[1].parameters()):
        assert rel_err(p2, p1) <= 1e-5


# ------------------------------------------------------- 4. a retried step

@pytest.mark.parametrize("kind", ["sgd-plain", "adamw-fused", "asgd"])
def test_a_step_that_raises_then_a_retry_clips_once(kind):
    results = []
    for ours in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        if kind == "asgd":
            opt = (torchext.optim.ASGD(model.parameters(), lr=0.1) if ours
                   else torch.optim.ASGD(model.parameters(), lr=0.1, foreach=False))
        elif kind == "adamw-fused":
            opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fail = [True]

        def hook(o, args, kwargs):
            if fail[0]:
                fail[0] = False
                raise RuntimeError("injected")
        opt.register_step_pre_hook(hook)
        scaler = (GradScaler if ours else torch.amp.GradScaler)("cpu", init_scale=256.0)
        x, y = batch(3, scale=10.0)
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        if ours:
            scaler.clip_grad_norm_(opt, 0.01)
        else:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
        with pytest.raises(RuntimeError, match="injected"):
            scaler.step(opt)
        if not ours:  # torch leaves its grad_scale on a fused optimizer (a torch bug)
            opt.__dict__.pop("grad_scale", None)
            opt.__dict__.pop("found_inf", None)
        scaler.step(opt)
        scaler.update()
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results):
        assert rel_err(b, a) <= 1e-6


# ------------------------------------------------------------ 6. fp16, one rule

def fp16_setup(kind, allow_fp16=False):
    w = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    if kind == "asgd":
        opt = torchext.optim.ASGD([w], lr=0.1)
    elif kind == "asgd-unfused":
        opt = torchext.optim.ASGD([w], lr=0.1, fused=False)
    elif kind == "asgd-capturable":
        opt = torchext.optim.ASGD([w], lr=0.1, capturable=True)
    elif kind == "adam-fused":
        opt = torch.optim.Adam([w], lr=0.1, fused=True)
    else:
        opt = torch.optim.SGD([w], lr=0.1)
    scaler = GradScaler("cpu", init_scale=8.0, allow_fp16=allow_fp16)
    scaler.scale((w.float() ** 2).sum()).backward()
    return w, opt, scaler


KINDS = ["asgd", "asgd-unfused", "asgd-capturable", "adam-fused", "sgd"]


@pytest.mark.parametrize("kind", KINDS)
def test_fp16_grads_the_clip_refuses_on_every_path_as_torchs_unscale(kind):
    """The clip is unscale_ + clip_grad_norm_, and torch's unscale_ refuses
    fp16 gradients: on every optimizer and path, unless allow_fp16."""
    w, opt, scaler = fp16_setup(kind)
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.clip_grad_norm_(opt, 1.0)
    assert scaler.stage(opt) is OptState.READY
    w, opt, scaler = fp16_setup(kind, allow_fp16=True)
    norm = scaler.clip_grad_norm_(opt, 1.0)
    assert norm.dtype == torch.float16 and rel_err(norm, torch.tensor(4.0)) < 1e-3
    scaler.step(opt)
    assert (w < 1).all()


@pytest.mark.parametrize("kind", KINDS)
def test_fp16_grads_step_as_torch_would_step_them(kind):
    """Without a clip, torch's scaler steps fp16 grads of an optimizer it
    steps fused (torch's fused Adam; torchext's ASGD with capturable=True,
    which says so) and refuses them for any other (its unscale_)."""
    w, opt, scaler = fp16_setup(kind)
    if kind in ("adam-fused", "asgd-capturable"):
        scaler.step(opt)
        assert (w < 1).all()
    else:
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
            scaler.step(opt)
        assert (w == 1).all() and scaler.stage(opt) is OptState.READY


def test_fp16_compiled_step_follows_the_same_rule():
    w, opt, scaler = fp16_setup("asgd")

    @torch.compile(backend="eager", fullgraph=True)
    def clip():
        return scaler.clip_grad_norm_(opt, 1.0)

    with pytest.raises(Exception, match="Attempting to unscale FP16 gradients"):
        clip()


# ------------------------------------------------ 7. an optimizer with no grads

@pytest.mark.parametrize("clip", [False, True])
def test_an_optimizer_without_grads_steps_as_torch(clip):
    """torch's scaler steps a no-op for an optimizer it steps fused (torch's
    fused SGD/AdamW), and raises for any other (torch.optim.ASGD: no inf
    checks recorded); torchext's scaler keeps both answers."""
    used = torch.nn.Parameter(torch.ones(2))
    for Scaler in (torch.amp.GradScaler, GradScaler):
        unused = torch.nn.Parameter(torch.ones(2))
        fused = torch.optim.AdamW([unused], lr=0.1, fused=True)
        main = torch.optim.SGD([used], lr=0.1)
        scaler = Scaler("cpu", init_scale=4.0)
        scaler.scale((used ** 2).sum()).backward()
        if clip:
            if Scaler is GradScaler:
                scaler.clip_grad_norm_(fused, 1.0)
            else:
                scaler.unscale_(fused)
                torch.nn.utils.clip_grad_norm_([unused], 1.0)
        scaler.step(fused)  # a no-op
        assert torch.equal(unused, torch.ones(2))
        scaler.step(main)
        scaler.update()
        used.grad = None
        for plain in (torch.optim.ASGD([unused], lr=0.1, foreach=False) if Scaler is not GradScaler
                      else torchext.optim.ASGD([unused], lr=0.1),):
            scaler.scale((used ** 2).sum()).backward()
            if clip:
                if Scaler is GradScaler:
                    scaler.clip_grad_norm_(plain, 1.0)
                else:
                    scaler.unscale_(plain)
                    torch.nn.utils.clip_grad_norm_([unused], 1.0)
            with pytest.raises(AssertionError, match="No inf checks were recorded for this "
                                                     "optimizer"):
                scaler.step(plain)
            used.grad = None


# ------------------------------------------------ 8. the drop-ins in torch's place

@pytest.fixture
def dropins_installed(monkeypatch):
    """The three drop-ins installed where people install them."""
    for name in ("clip_grad_norm_", "get_total_norm", "clip_grads_with_norm_"):
        ours = getattr(torchext.nn.utils, name)
        monkeypatch.setattr(torch.nn.utils, name, ours)
        monkeypatch.setattr(torch.nn.utils.clip_grad, name, ours, raising=False)
    for name in ("_get_total_norm", "_clip_grads_with_norm_"):
        if hasattr(torch.nn.utils.clip_grad, name):
            monkeypatch.setattr(torch.nn.utils.clip_grad, name,
                                getattr(torchext.nn.utils, name.lstrip("_")))
    yield


def test_installed_dropins_never_call_themselves(dropins_installed):
    """No RecursionError: an empty list (what Lightning clips when
    training_step returned None), an exhausted generator, sparse grads."""
    assert torch.nn.utils.clip_grad_norm_([], 1.0).item() == 0
    gen = (p for p in [torch.nn.Parameter(torch.ones(2))])
    list(gen)
    with pytest.warns(UserWarning, match="empty generator"):
        torch.nn.utils.clip_grad_norm_(gen, 1.0)
    assert torch.nn.utils.get_total_norm([]).item() == 0
    torch.nn.utils.clip_grads_with_norm_([], 1.0, torch.tensor(0.0))
    e = torch.nn.Embedding(10, 3, sparse=True)
    e(torch.tensor([1, 2, 2])).sum().backward()
    try:
        torch.nn.utils.clip_grad_norm_(e.parameters(), 0.1)
    except NotImplementedError:
        pass  # an older torch without sparse vector_norm: torch's own error


def test_clip_grads_with_norm_reads_a_generator_of_sparse_grads_once():
    e1, e2 = torch.nn.Embedding(10, 3, sparse=True), torch.nn.Embedding(10, 3, sparse=True)
    e2.load_state_dict(e1.state_dict())
    for e in (e1, e2):
        e(torch.tensor([1, 2, 2])).sum().backward()
    total = torch.tensor(100.0)
    torch.nn.utils.clip_grads_with_norm_((p for p in e1.parameters()), 1.0, total)
    torchext.nn.utils.clip_grads_with_norm_((p for p in e2.parameters()), 1.0, total)
    assert torch.equal(e1.weight.grad.to_dense(), e2.weight.grad.to_dense())
    assert not torch.equal(e2.weight.grad.to_dense(), torch.zeros(10, 3)) and \
        e2.weight.grad.to_dense().abs().max() < 0.1  # clipped, not skipped


def _grads(shapes, seed, dtype=torch.float32, none=()):
    g = torch.Generator().manual_seed(seed)
    ps = []
    for i, s in enumerate(shapes):
        p = torch.nn.Parameter(torch.randn(s, generator=g).to(dtype))
        if i not in none:
            p.grad = torch.randn(s, generator=g).to(dtype)
        ps.append(p)
    return ps


@pytest.mark.parametrize("norm_type", [0.5, 1.0, 2.0, 4.0, math.inf])
@pytest.mark.parametrize("foreach", [None, False, True])
def test_pytorchs_clip_cases_with_the_dropins_installed(dropins_installed, norm_type, foreach):
    """The cases of PyTorch's test_nn clip_grad tests (every norm type,
    foreach on and off, clipping active and not, grads that are None, a
    single tensor, a generator), run through torch.nn.utils with the three
    drop-ins installed, against a float64 computation."""
    shapes = [(10, 10), (5,), (3, 4, 2)]
    for max_norm in (1.25, 1e4):
        ps = _grads(shapes, seed=7 if norm_type == math.inf else int(norm_type * 10) + 1, none=(1,))
        expected_grads = [None if p.grad is None else p.grad.double().clone() for p in ps]
        present = [g for g in expected_grads if g is not None]
        expected = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g, norm_type) for g in present]), norm_type)
        coef = min(max_norm / (expected.item() + 1e-6), 1.0)
        total = torch.nn.utils.clip_grad_norm_(iter(ps), max_norm, norm_type, foreach=foreach)
        assert total.dtype == torch.float32 and rel_err(total, expected) <= 1e-5
        for p, g in zip(ps, expected_grads):
            if g is None:
                assert p.grad is None
            else:
                assert rel_err(p.grad, g * coef) <= 1e-5
        # the clipped grads' norm is the bound when clipping was active
        after = torch.nn.utils.get_total_norm([p.grad for p in ps if p.grad is not None],
                                              norm_type, foreach=foreach)
        assert rel_err(after, torch.tensor(min(max_norm, expected.item()))) <= 1e-4
    single = _grads([(7,)], seed=3)[0]
    g = single.grad.double().clone()
    total = torch.nn.utils.clip_grad_norm_(single, 0.5, norm_type, foreach=foreach)
    assert rel_err(total, torch.linalg.vector_norm(g, norm_type)) <= 1e-6
    assert rel_err(single.grad, g * min(0.5 / (total.item() + 1e-6), 1.0)) <= 1e-6


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_pytorchs_error_if_nonfinite_cases_with_the_dropins_installed(dropins_installed, value):
    ps = _grads([(4, 4), (3,)], seed=7)
    ps[0].grad[1, 2] = value
    before = [p.grad.clone() for p in ps]
    with pytest.raises(RuntimeError, match="is non-finite, so it cannot be clipped"):
        torch.nn.utils.clip_grad_norm_(ps, 1.0, error_if_nonfinite=True)
    assert all(torch.equal(b.nan_to_num(), p.grad.nan_to_num()) for b, p in zip(before, ps))
    total = torch.nn.utils.clip_grad_norm_(ps, 1.0, error_if_nonfinite=False)
    assert not torch.isfinite(total)


# ------------------------------------------------------------ 9. smaller ones

def test_a_disabled_scaler_calls_only_torchexts_own_clip():
    class WithClip(torch.optim.SGD):  # a foreign optimizer with a method of that name
        def clip_grad_norm_(self, *args):
            raise AssertionError("a foreign clip_grad_norm_ was called")

    w = torch.nn.Parameter(torch.ones(3))
    w.grad = torch.full((3,), 2.0)
    opt = WithClip([w], lr=0.1)
    total = GradScaler("cpu", enabled=False).clip_grad_norm_(opt, 1.0)
    assert rel_err(total, torch.tensor(12.0).sqrt()) < 1e-6
    assert rel_err(w.grad.norm(), torch.tensor(1.0)) < 1e-5


def test_sparse_grads_through_the_scaler_refuse_before_recording():
    e = torch.nn.Embedding(10, 3, sparse=True)
    opt = torch.optim.SGD(e.parameters(), lr=0.1)
    scaler = GradScaler("cpu", init_scale=4.0)
    scaler.scale(e(torch.tensor([1, 2, 2])).sum()).backward()
    e.weight.grad._values()[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite"):
        scaler.clip_grad_norm_(opt, 1.0, error_if_nonfinite=True)
    # torch's recipe: unscale_, then its clip refuses; the unscale stands.
    assert scaler.stage(opt) is OptState.UNSCALED and scaler.found_inf(opt).item() == 1
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0


@requires_cuda
def test_model_parallel_plain_clip_multiplies_on_each_device():
    a = torch.nn.Parameter(torch.ones(3))
    b = torch.nn.Parameter(torch.ones(3, device="cuda"))
    opt = torch.optim.SGD([a, b], lr=0.1)
    scaler = GradScaler(init_scale=4.0)
    loss = (a ** 2).sum().cuda() + (b ** 2).sum()
    scaler.scale(loss).backward()
    total = scaler.clip_grad_norm_(opt, 1.0)
    scaler.step(opt)
    expected = torch.tensor(24.0).sqrt()
    assert rel_err(total.cpu(), expected) < 1e-6
    assert rel_err(a.grad, torch.full((3,), 2.0) / expected) < 1e-6


@pytest.mark.parametrize("through", ["asgd", "scaler"])
def test_a_second_clip_of_gradients_written_in_place_measures_what_they_hold(through):
    """torch's second clip measures the first clip's result plus what was
    written since (an accumulated backward); so does torchext's, since the
    first clip applied when called."""
    def world(ours):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = (torchext.optim.ASGD(model.parameters(), lr=0.1) if ours
               else torch.optim.ASGD(model.parameters(), lr=0.1, foreach=False))
        scaler = (GradScaler if ours else torch.amp.GradScaler)("cpu", init_scale=8.0)
        return model, opt, scaler

    x, y = batch(8, scale=10.0)
    results = []
    for ours in (True, False):
        model, opt, scaler = world(ours)

        def backward():
            loss = torch.nn.functional.mse_loss(model(x), y)
            (scaler.scale(loss) if through == "scaler" else loss).backward()

        def clip(first):
            if not ours:
                if through == "scaler" and first:
                    scaler.unscale_(opt)
                return torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            return (scaler.clip_grad_norm_(opt, 0.01) if through == "scaler"
                    else opt.clip_grad_norm_(0.01))

        backward()
        clip(True)
        backward()  # accumulates into the same gradient tensors (scaled, with a scaler)
        norm = clip(False)
        if through == "scaler":
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        results.append((norm, [p.detach().clone() for p in model.parameters()]))
    assert rel_err(results[0][0], results[1][0]) <= 1e-6
    for a, b in zip(results[0][1], results[1][1]):
        assert rel_err(a, b) <= 1e-6
