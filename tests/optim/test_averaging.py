"""ASGD's averaged weights: the swap_ op, averaged_parameters(),
start_averaging(), NonMonotonicTrigger and averaged_state_dict()."""
import copy
import io
import math

import pytest
import torch
from conftest import requires_cuda
from helpers import SRC, data, needs_torch, small_model
from torch._dynamo.testing import CompileCounter
from torch.library import opcheck

import torchext
from torchext._compile_compat import COMPILED_STEP
from torchext.optim import NonMonotonicTrigger, averaged_state_dict

swap_ = torch.ops.torchext.swap_


def _pairs(device="cpu"):
    """Mixed dtypes and layouts: contiguous, complex, transposed alike,
    transposed against contiguous, sliced, empty."""
    g = torch.Generator().manual_seed(0)

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(device)

    a = [r(300, 7), r(5, 3, dtype=torch.float16), r(4, 6, dtype=torch.bfloat16).t(),
         torch.complex(r(9), r(9)), r(6, 8, dtype=torch.float64).t(), r(10, 10)[::2, 1:7],
         r(0, 3)]
    b = [r(300, 7), r(5, 3, dtype=torch.float16), r(4, 6, dtype=torch.bfloat16).t(),
         torch.complex(r(9), r(9)), r(8, 6, dtype=torch.float64), r(5, 6), r(0, 3)]
    return a, b


def _check_swap(device):
    a, b = _pairs(device)
    a0, b0 = [x.clone() for x in a], [x.clone() for x in b]
    ptrs = [(x.data_ptr(), y.data_ptr()) for x, y in zip(a, b)]
    swap_(a, b)
    for i in range(len(a)):
        assert torch.equal(a[i], b0[i]) and torch.equal(b[i], a0[i]), i
        assert (a[i].data_ptr(), b[i].data_ptr()) == ptrs[i]
    swap_(a, b)
    for i in range(len(a)):
        assert torch.equal(a[i], a0[i]) and torch.equal(b[i], b0[i]), i


def test_swap_exchanges_values_in_place():
    _check_swap("cpu")


def test_swap_large_tensor_spans_threads():
    a, b = torch.randn(1 << 20), torch.randn(1 << 20)
    a0, b0 = a.clone(), b.clone()
    swap_([a], [b])
    assert torch.equal(a, b0) and torch.equal(b, a0)


@requires_cuda
def test_swap_cuda():
    _check_swap("cuda")
    a, b = [torch.randn(70_000, device="cuda") for _ in range(100)], \
        [torch.randn(70_000, device="cuda") for _ in range(100)]  # several launches
    a0, b0 = [x.clone() for x in a], [x.clone() for x in b]
    swap_(a, b)
    assert all(torch.equal(x, y) for x, y in zip(a, b0))
    assert all(torch.equal(x, y) for x, y in zip(b, a0))


def test_swap_opcheck_and_meta():
    a, b = _pairs()
    opcheck(swap_.default, (a, b))
    swap_([x.to("meta") for x in a], [x.to("meta") for x in b])
    with pytest.raises(ValueError, match="shape"):
        swap_([torch.empty(2, device="meta")], [torch.empty(3, device="meta")])


@pytest.mark.parametrize("bad, match, exc", [
    (lambda a, b: (a, b[:-1]), "same length", ValueError),
    (lambda a, b: (a, b[:1] + [b[1].float()] + b[2:]), "dtype", TypeError),
    (lambda a, b: (a, b[:1] + [b[1][:2]] + b[2:]), "shape", ValueError),
    (lambda a, b: (a, b[:1] + [a[1].view(-1).view(5, 3)] + b[2:]), "overlap", RuntimeError),
    (lambda a, b: (a[:1] + [torch.zeros(1, dtype=torch.float16).expand(5, 3)], b[:2]), "share memory",
     RuntimeError),
])
def test_swap_bad_input_changes_nothing(bad, match, exc):
    a, b = _pairs()
    a, b = a[:2], b[:2]
    ta, tb = bad(a, b)
    olds = [x.clone() for x in ta + tb]
    with pytest.raises(exc, match=match):
        swap_(ta, tb)
    assert all(torch.equal(x, o) for x, o in zip(ta + tb, olds))


# ------------------------------------------------------- averaged_parameters

def _trained(steps=5, t0=1.0, freeze_last=False, **kw):
    model = small_model()
    opt = torchext.optim.ASGD(model.parameters(), lr=0.05, t0=t0, lambd=1e-3, **kw)
    x, y = data()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if freeze_last:
            model[2].bias.grad = None
        opt.step()
    return model, opt, x, y


def _snapshot(model, opt):
    return ([p.detach().clone() for p in model.parameters()],
            {id(p): {k: v.clone() for k, v in st.items()} for p, st in opt.state.items()})


def _assert_same(model, opt, snap):
    params, state = snap
    for p, old in zip(model.parameters(), params):
        assert torch.equal(p, old)
    for p, st in opt.state.items():
        for k, v in st.items():
            assert torch.equal(v, state[id(p)][k]), k


def test_averaged_parameters_swaps_in_place_and_restores_bits():
    model, opt, x, y = _trained(freeze_last=True)
    never = model[2].bias
    assert never not in opt.state
    snap = _snapshot(model, opt)
    ptrs = [p.data_ptr() for p in model.parameters()]
    expected = copy.deepcopy(model)
    with torch.no_grad():
        for p, q in zip(model.parameters(), expected.parameters()):
            if p in opt.state:
                q.copy_(opt.state[p]["ax"])
    with opt.averaged_parameters():
        for p, old in zip(model.parameters(), snap[0]):
            if p in opt.state:
                assert torch.equal(p, snap[1][id(p)]["ax"])
                assert torch.equal(opt.state[p]["ax"], old)
            else:
                assert torch.equal(p, old)  # never stepped: its own value
        assert [p.data_ptr() for p in model.parameters()] == ptrs
        assert torch.equal(model(x), expected(x))
    _assert_same(model, opt, snap)
    assert [p.data_ptr() for p in model.parameters()] == ptrs


def test_averaged_parameters_restores_on_exception():
    model, opt, _, _ = _trained()
    snap = _snapshot(model, opt)
    with pytest.raises(KeyError):
        with opt.averaged_parameters():
            raise KeyError("boom")
    _assert_same(model, opt, snap)
    opt.step()  # usable again


def test_step_and_nesting_refused_inside_and_nothing_changes():
    model, opt, x, y = _trained()
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    with opt.averaged_parameters():
        inside = _snapshot(model, opt)
        with pytest.raises(RuntimeError, match="inside averaged_parameters"):
            opt.step()
        with pytest.raises(RuntimeError, match="nested"):
            with opt.averaged_parameters():
                pass
        with pytest.raises(RuntimeError, match="state_dict"):
            opt.state_dict()
        _assert_same(model, opt, inside)
    outside = _snapshot(model, opt)
    opt.step()
    assert not torch.equal(next(model.parameters()), outside[0][0])


def test_compiled_eval_does_not_recompile_across_the_block():
    torch._dynamo.reset()
    model, opt, x, _ = _trained()
    counter = CompileCounter()
    evaluate = torch.compile(lambda inp: model(inp), backend=counter, fullgraph=True)
    raw = evaluate(x)
    with opt.averaged_parameters():
        averaged = evaluate(x)
        eager_avg = model(x)
    again = evaluate(x)
    assert counter.frame_count == 1
    torch.testing.assert_close(averaged, eager_avg)
    assert torch.equal(raw, again) and not torch.equal(raw, averaged)


@needs_torch(COMPILED_STEP)
def test_compiled_step_does_not_recompile_after_the_block():
    torch._dynamo.reset()
    model, opt, x, y = _trained(steps=1)
    counter = CompileCounter()
    # (A lambda, as tests/compile/test_compile.py does: compiling the bound method
    # itself trips a Dynamo assertion on torch's step-hook wrapper once
    # another test compiled a step in the same process.)
    step = torch.compile(lambda: opt.step(), backend=counter, fullgraph=True)

    def train():
        opt.zero_grad(set_to_none=False)  # grads freed between calls would recompile
        torch.nn.functional.mse_loss(model(x), y).backward()
        step()

    train()
    with opt.averaged_parameters():
        model(x)
    train()
    assert counter.frame_count == 1


@requires_cuda
def test_averaged_parameters_cuda_keeps_a_captured_graph_valid():
    model = small_model(device="cuda")
    opt = torchext.optim.ASGD(model.parameters(), lr=0.05, t0=1.0, capturable=True)
    x, y = data(device="cuda")
    for _ in range(5):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            model(x)  # warm up off the default stream before capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(x)
        with opt.averaged_parameters():
            graph.replay()
            averaged = out.clone()
            eager = model(x)
        graph.replay()
    torch.testing.assert_close(averaged, eager)
    torch.testing.assert_close(out, model(x).detach())
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


# ------------------------------------------------------------ start_averaging

def _record(model, opt, x, y, steps, params, freeze=None):
    sums = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    counts = [0] * len(params)
    for step in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if freeze is not None and step % 2 == 0:
            freeze.grad = None
        opt.step()
        for i, p in enumerate(params):
            if p.grad is not None:
                sums[i] += p.detach().double()
                counts[i] += 1
    return [s / c for s, c in zip(sums, counts)]


@pytest.mark.parametrize("t0", [0.0, 2.0, 1e6])
@pytest.mark.parametrize("before", [0, 4])
def test_start_averaging_is_the_mean_of_the_next_iterates(t0, before):
    model, opt, x, y = _trained(steps=before, t0=t0)
    opt.start_averaging()
    params = list(model.parameters())
    means = _record(model, opt, x, y, 9, params)
    for p, mean in zip(params, means):
        torch.testing.assert_close(opt.state[p]["ax"].double(), mean, rtol=1e-6, atol=1e-7)
    assert opt.param_groups[0]["t0"] == before - 1


def test_start_averaging_with_different_step_counts_in_one_group():
    model, opt, x, y = _trained(steps=3, t0=1e6, freeze_last=True)  # bias: 0 steps
    frozen = model[2].bias
    opt.start_averaging()
    group = opt.param_groups[0]
    assert group["t0"] == 2.0 and group["t0_per_param"] == [2.0, 2.0, 2.0, -1.0]
    # Survives a round trip through state_dict.
    sd = copy.deepcopy(opt.state_dict())
    opt2 = torchext.optim.ASGD(model.parameters())
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["t0_per_param"] == [2.0, 2.0, 2.0, -1.0]
    params = list(model.parameters())
    means = _record(model, opt2, x, y, 8, params, freeze=frozen)  # frozen steps 4 times
    for p, mean in zip(params, means):
        torch.testing.assert_close(opt2.state[p]["ax"].double(), mean, rtol=1e-6, atol=1e-7)


def test_start_averaging_checkpoint_continues_in_torch_asgd():
    model, opt, x, y = _trained(steps=4, t0=1e6)
    opt.start_averaging()
    twin = copy.deepcopy(model)
    ref = torch.optim.ASGD(twin.parameters(), foreach=False)
    ref.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert ref.param_groups[0]["t0"] == 3.0
    for m, o in ((model, opt), (twin, ref)):
        for _ in range(6):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(opt.state[p]["ax"], ref.state[q]["ax"], rtol=1e-6, atol=1e-7)


def test_torch_t0_zero_skips_the_first_iterate():
    """The documented off-by-one, checked on torch.optim.ASGD itself: with
    t0=0, ax after n steps is the mean of iterates 2..n."""
    model = small_model()
    opt = torch.optim.ASGD(model.parameters(), lr=0.05, t0=0, lambd=1e-3, foreach=False)
    x, y = data()
    params = list(model.parameters())
    iterates = []
    for _ in range(6):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        iterates.append([p.detach().double().clone() for p in params])
    for i, p in enumerate(params):
        mean = torch.stack([it[i] for it in iterates[1:]]).mean(0)
        torch.testing.assert_close(opt.state[p]["ax"].double(), mean, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------- NonMonotonicTrigger

class _Spy:
    def __init__(self):
        self.calls = 0

    def start_averaging(self):
        self.calls += 1


def _rule(seq, nonmono, mode):
    """The issue's rule, literally: the first index where it fires, or None."""
    history = []
    for i, v in enumerate(seq):
        if len(history) > nonmono:
            older = history[:-nonmono]
            if (v > min(older)) if mode == "min" else (v < max(older)):
                return i
        history.append(v)
    return None


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("nonmono", [1, 2, 5])
@pytest.mark.parametrize("seed", range(6))
def test_trigger_follows_the_rule(mode, nonmono, seed):
    g = torch.Generator().manual_seed(seed)
    trend = -1.0 if mode == "min" else 1.0
    seq = [trend * i * 0.1 + 0.3 * torch.rand((), generator=g).item() for i in range(12)]
    seq += seq[::-1]  # gets worse: the rule fires at some point
    spy = _Spy()
    trig = NonMonotonicTrigger(spy, nonmono=nonmono, mode=mode)
    fired = [i for i, v in enumerate(seq) if trig.step(v)]
    expected = _rule(seq, nonmono, mode)
    assert expected is not None
    assert fired == [expected] and spy.calls == 1 and trig.triggered
    assert trig.history == seq


def test_trigger_scripted_and_state_dict():
    spy = _Spy()
    trig = NonMonotonicTrigger(spy, nonmono=2)
    # Improving never fires; after the round trip, 5.5 > min(9, 8, 5) fires.
    assert [trig.step(v) for v in (9.0, 8.0, 5.0, 4.0, 3.0)] == [False] * 5
    saved = trig.state_dict()
    again = NonMonotonicTrigger(_Spy(), nonmono=7, mode="max")
    again.load_state_dict(saved)
    assert again.step(5.5) is True and again.optimizer.calls == 1
    assert again.step(100.0) is False and again.optimizer.calls == 1
    assert trig.step(5.0) is False  # 5.0 is not > min(9, 8, 5)
    with pytest.raises(ValueError, match="mode"):
        NonMonotonicTrigger(spy, mode="median")
    with pytest.raises(TypeError, match="start_averaging"):
        NonMonotonicTrigger(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1))


def test_trigger_starts_averaging_on_asgd():
    model, opt, _, _ = _trained(steps=3, t0=1e6)
    trig = NonMonotonicTrigger(opt, nonmono=1)
    assert [trig.step(v) for v in (3.0, 2.0, 3.5)] == [False, False, True]
    assert opt.param_groups[0]["t0"] == 2.0


def test_trigger_watches_any_optimizer_through_on_trigger():
    sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1)
    fired = []
    trig = NonMonotonicTrigger(sgd, nonmono=1, on_trigger=lambda: fired.append(True))
    assert [trig.step(v) for v in (3.0, 2.0, 3.5, 1.0)] == [False, False, True, False]
    assert fired == [True]
    trig = NonMonotonicTrigger(on_trigger=lambda: fired.append(True), nonmono=0)
    assert trig.optimizer is None and [trig.step(v) for v in (1.0, 2.0)] == [False, True]
    with pytest.raises(TypeError, match="on_trigger must be callable"):
        NonMonotonicTrigger(on_trigger=3)


def _awd_lstm_style_run(asgd_cls, epochs=10, nonmono=2):
    """AWD-LSTM's NT-ASGD script, shrunk: train with SGD, watch the
    validation loss with the trigger, and when it fires switch to a new
    ASGD(t0=0, lambd=0.0) over the same parameters (the script's exact
    call); evaluate and checkpoint with the averaged weights afterwards
    (the script's `prm.data = ax` dance, here averaged_parameters())."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 6, generator=gen), torch.randn(64, 3, generator=gen)
    xv, yv = torch.randn(32, 6, generator=gen), torch.randn(32, 3, generator=gen)
    box = {"opt": torch.optim.SGD(model.parameters(), lr=0.5, weight_decay=1e-4)}

    def switch():
        box["opt"] = asgd_cls(model.parameters(), lr=0.5, t0=0, lambd=0.0, weight_decay=1e-4)

    trig = NonMonotonicTrigger(box["opt"], nonmono=nonmono, on_trigger=switch)
    losses, switched_at = [], None
    for epoch in range(epochs):
        for i in range(0, 64, 16):
            box["opt"].zero_grad()
            torch.nn.functional.mse_loss(model(x[i:i + 16]), y[i:i + 16]).backward()
            box["opt"].step()
        with torch.no_grad():
            val = torch.nn.functional.mse_loss(model(xv), yv).item()
        losses.append(val)
        # The script's validation noise: an epoch that got worse fires it.
        if trig.step(val + (0.05 if epoch == 4 else 0.0)) and switched_at is None:
            switched_at = epoch
    return model, box["opt"], losses, switched_at


def test_awd_lstm_style_sgd_to_asgd_switch_matches_torch():
    ours = _awd_lstm_style_run(torchext.optim.ASGD)
    ref = _awd_lstm_style_run(torch.optim.ASGD)
    assert ours[3] is not None and ours[3] == ref[3]  # fired, at the same epoch
    assert isinstance(ours[1], torchext.optim.ASGD)
    assert ours[2] == ref[2]  # every validation loss, bit for bit
    for p, q in zip(ours[0].parameters(), ref[0].parameters()):
        assert torch.equal(p, q)
        for k in ("step", "eta", "mu", "ax"):
            assert torch.equal(ours[1].state[p][k], ref[1].state[q][k]), k
    # The averaged weights the script evaluates: torch's ax, swapped in.
    with ours[1].averaged_parameters():
        for p, q in zip(ours[0].parameters(), ref[0].parameters()):
            assert torch.equal(p, ref[1].state[q]["ax"])


def test_pickling_inside_averaged_parameters_saves_the_true_average():
    """AWD-LSTM saves [model, criterion, optimizer] with torch.save while the
    parameters hold their averages: the saved optimizer's ax must be the
    average (not the training weights the swap parked in ax)."""
    model, opt, x, y = _trained(steps=6, t0=2)
    averages = [opt.state[p]["ax"].clone() for p in model.parameters()]
    training = [p.detach().clone() for p in model.parameters()]
    with opt.averaged_parameters():
        buf = io.BytesIO()
        torch.save([model, opt], buf)
        twin = copy.deepcopy(opt)
    buf.seek(0)
    saved_model, saved_opt = torch.load(buf, weights_only=False)
    for sp, avg in zip(saved_model.parameters(), averages):
        assert torch.equal(sp, avg)  # the model was saved with its averages, as the script wants
        assert torch.equal(saved_opt.state[sp]["ax"], avg)
        assert saved_opt.state[sp]["ax"].data_ptr() != sp.data_ptr()
    for p, tp in zip(model.parameters(), twin.param_groups[0]["params"]):
        assert torch.equal(twin.state[tp]["ax"], opt.state[p]["ax"])
    # The live optimizer and model are exactly as before.
    for p, t, avg in zip(model.parameters(), training, averages):
        assert torch.equal(p, t) and torch.equal(opt.state[p]["ax"], avg)
    # And the loaded optimizer steps (its state is owned again).
    for sp in saved_model.parameters():
        sp.grad = torch.ones_like(sp)
    saved_opt.step()


# ------------------------------------------------------- averaged_state_dict

def test_averaged_state_dict_returns_copies_of_the_averages():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Linear(4, 3))
    opt = torchext.optim.ASGD(model.parameters(), lr=0.05, t0=0)
    x, y = data()
    for _ in range(4):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    snap = _snapshot(model, opt)
    sd = averaged_state_dict(model, opt)
    plain = model.state_dict()
    assert list(sd) == list(plain)
    params = dict(model.named_parameters())
    for k, v in sd.items():
        if k in params:
            assert torch.equal(v, opt.state[params[k]]["ax"])
            assert v.data_ptr() not in (params[k].data_ptr(), opt.state[params[k]]["ax"].data_ptr())
        else:
            assert torch.equal(v, plain[k]) and v.data_ptr() != plain[k].data_ptr()
    _assert_same(model, opt, snap)
    fresh = copy.deepcopy(model)
    fresh.load_state_dict(sd)
    with opt.averaged_parameters():
        model.eval(), fresh.eval()
        assert torch.equal(model(x), fresh(x))


# ------------------------------------------------------- DTensor (2 ranks)

def _scenario_dtensor(rank, world, tmpdir):
    import test_distributed as td
    from torch.distributed.tensor import DTensor

    model = td._fsdp_model(world)
    opt, scaler = td._torchext(model)
    for step in range(td.STEPS):
        td._train_step(model, opt, scaler, step, rank, world)
    ref_model, ref_opt, _ = td._reference(td.STEPS)
    params = list(model.parameters())
    assert all(isinstance(p, DTensor) for p in params)
    locals_before = [p.to_local().clone() for p in params]
    ptrs = [p.to_local().data_ptr() for p in params]
    x, _ = td._batch(0)
    with opt.averaged_parameters():
        for p, ref in zip(params, ref_model.parameters()):
            torch.testing.assert_close(td._full(p.detach()), ref_opt.state[ref]["ax"],
                                       rtol=2e-5, atol=1e-6)
        assert [p.to_local().data_ptr() for p in params] == ptrs
        out = model(x)
    with torch.no_grad():
        for ref in ref_model.parameters():
            ref.copy_(ref_opt.state[ref]["ax"])
    torch.testing.assert_close(out, ref_model(x), rtol=2e-5, atol=1e-6)
    for p, old in zip(params, locals_before):
        assert torch.equal(p.to_local(), old)
    sd = averaged_state_dict(model, opt)
    for name, ref in ref_model.named_parameters():
        torch.testing.assert_close(td._full(sd[name]), ref.detach(), rtol=2e-5, atol=1e-6)


def test_dtensor_fsdp2_swaps_local_shards(tmp_path):
    import test_distributed as td

    td._spawn(_scenario_dtensor, tmp_path)


def test_ntasgd_example_runs(capsys):
    """examples/ntasgd_language_model.py, scaled down to seconds."""
    import os
    import runpy

    path = os.path.join(SRC, "examples", "ntasgd_language_model.py")
    main = runpy.run_path(path)["main"]
    history, _ = main(["--epochs", "3", "--train-chars", "6000", "--val-chars", "2000",
                       "--dim", "16", "--batch", "8", "--threads", str(torch.get_num_threads())])
    assert [h[0] for h in history] == [1, 2, 3]
    assert all(math.isfinite(h[1]) and h[1] < 96 for h in history)  # below uniform over chars
    assert "raw ppl" in capsys.readouterr().out
