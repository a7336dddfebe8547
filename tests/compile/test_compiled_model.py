"""torchext's recommended torch.compile recipe (docs/compile.md): the model
compiled with ``torch.compile(model)``, torchext's GradScaler and ASGD
stepping it outside the graph. Checked against torch's classes in the same
recipe, bit for bit, with no recompile after the first call whatever the
user did before it.

Compiles are slow on 2 CPU cores: small models, one inductor test."""
import copy

import pytest
import torch

import torchext
from conftest import requires_cuda
from helpers import NoHostSync, amp_train_step


def make(lib, device="cpu", capturable=False, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1)).to(device)
    # A CPU tensor lr is read on the host (no sync); torch's capturable ASGD
    # on a GPU wants it on the device.
    lr = torch.tensor(0.01, device=device if capturable else "cpu")
    if lib == "torchext":
        opt = torchext.optim.ASGD(model.parameters(), lr=lr, t0=3, weight_decay=1e-4,
                                  capturable=capturable)
        scaler = torchext.amp.GradScaler(init_scale=2.0**10, growth_interval=3)
    else:
        opt = torch.optim.ASGD(model.parameters(), lr=lr, t0=3, weight_decay=1e-4,
                               capturable=capturable)
        scaler = torch.amp.GradScaler(torch.device(device).type, init_scale=2.0**10,
                                      growth_interval=3)
    return model, opt, scaler


def batches(n, device="cpu", inf_at=(4,)):
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        x, y = torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)
        if i in inf_at:
            x[0, 0] = float("inf")  # overflowed grads: the step is skipped
        out.append((x.to(device), y.to(device)))
    return out


def train(model, opt, scaler, data, compiled_model, device_type="cpu", dtype=torch.bfloat16,
          no_recompile_after=1):
    """The recipe's loop, with an LR scheduler; from call ``no_recompile_after``
    on, any recompile of the compiled model raises. Returns the losses."""
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    losses = []
    for i, (x, y) in enumerate(data):
        with torch._dynamo.config.patch(error_on_recompile=i >= no_recompile_after):
            losses.append(amp_train_step(compiled_model, opt, scaler, x, y, device_type, dtype))
        sched.step()
    return losses


def assert_same(a, b):
    (m1, o1, s1), (m2, o2, s2) = a, b
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
        for k in ("step", "eta", "mu", "ax"):
            assert torch.equal(o1.state[p1][k], o2.state[p2][k]), k
    assert s1.get_scale() == s2.get_scale()
    assert s1._get_growth_tracker() == s2._get_growth_tracker()


class Counting:
    """A backend that counts the graphs Dynamo compiles (1: no graph break,
    no recompile), compiling each with ``backend``."""

    def __init__(self, backend):
        self.backend, self.graphs = backend, 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx
            return compile_fx(gm, example_inputs)
        from torch._dynamo.backends.common import aot_autograd
        return aot_autograd(fw_compiler=lambda g, _: g.forward)(gm, example_inputs)


@pytest.mark.parametrize("before", ["nothing", "eager_steps", "checkpoint"])
def test_recommended_recipe_matches_torch_with_no_recompile(before):
    # aot_eager-like (AOTAutograd, eager kernels): fast, and the same graphs
    # for both, so torch's classes and torchext's must agree bit for bit.
    runs = {}
    data = batches(9)
    for lib in ("torch", "torchext"):
        model, opt, scaler = make(lib)
        if before == "eager_steps":  # a few eager steps, then compile
            train(model, opt, scaler, batches(2, inf_at=()), model, no_recompile_after=99)
        elif before == "checkpoint":  # resume from torch's checkpoint, both alike
            src = make("torch")
            train(*src, batches(2, inf_at=()), src[0], no_recompile_after=99)
            opt.load_state_dict(src[1].state_dict())
            scaler.load_state_dict(src[2].state_dict())
            model.load_state_dict(src[0].state_dict())
        counter = Counting("aot_eager")
        compiled = torch.compile(model, backend=counter)
        losses = train(model, opt, scaler, data, compiled)
        assert counter.graphs == 1  # one graph, no recompile, no break
        runs[lib] = (model, opt, scaler), losses
    (tm, tl), (xm, xl) = runs["torch"], runs["torchext"]
    for i, (a, b) in enumerate(zip(tl, xl)):
        assert torch.equal(a, b) or (i == 4 and not a.isfinite() and not b.isfinite())
    assert_same(tm, xm)
    assert xm[2].num_skipped_steps() == 1
    tg, xg = tm[1].param_groups[0], xm[1].param_groups[0]
    assert all(bool(xg[k] == v) for k, v in tg.items() if k != "params")  # lr followed the schedule


def test_recommended_recipe_inductor_second_call_never_recompiles():
    # The default backend, as users run it: the first call compiles the
    # forward and the backward; any compile after it fails the test.
    from torch._dynamo.callback import callback_handler
    runs = {}
    data = batches(6, inf_at=(3,))
    for lib in ("torch", "torchext"):
        torch._dynamo.reset()  # else the second run reuses the first one's graph
        model, opt, scaler = make(lib)
        compiled = torch.compile(model)
        compiles = []
        cb = callback_handler.register_start_callback(lambda args: compiles.append(args))
        try:
            losses = train(model, opt, scaler, data[:1], compiled)
            n_first = len(compiles)
            losses += train(model, opt, scaler, data[1:], compiled, no_recompile_after=0)
        finally:
            callback_handler.remove_start_callback(cb)
        assert n_first >= 1 and len(compiles) == n_first, "compiled again after the first call"
        runs[lib] = (model, opt, scaler), losses
    (tm, tl), (xm, xl) = runs["torch"], runs["torchext"]
    for i, (a, b) in enumerate(zip(tl, xl)):
        assert torch.equal(a, b) or (i == 3 and not a.isfinite() and not b.isfinite())
    assert_same(tm, xm)


def test_recommended_recipe_capturable_step_has_no_host_sync():
    # capturable=True: the skip is decided on the device, nothing is read
    # on the host by the scaler or the optimizer (what CUDA graphs need).
    model, opt, scaler = make("torchext", capturable=True)
    compiled = torch.compile(model, backend=Counting("aot_eager"))
    ref = make("torch", capturable=False)
    ref_compiled = torch.compile(ref[0], backend=Counting("aot_eager"))
    data = batches(6, inf_at=(2,))
    for i, (x, y) in enumerate(data):
        for m, o, s, cm, guard in ((model, opt, scaler, compiled, True),
                                   (*ref, ref_compiled, False)):
            amp_train_step(cm, o, s, x, y, around_step=NoHostSync() if guard else None)
    assert scaler.num_skipped_steps() == 1
    assert_same(ref, (model, opt, scaler))


@requires_cuda
def test_recommended_recipe_reduce_overhead_cuda():
    # CUDA graphs for the model (mode="reduce-overhead"), torchext's
    # capturable step outside them: no host sync in step/update, no
    # recompile after the first call, and the same training as torch's
    # classes in the same recipe.
    runs = {}
    data = batches(8, "cuda", inf_at=(5,))
    for lib in ("torch", "torchext"):
        model, opt, scaler = make(lib, "cuda", capturable=True)
        compiled = torch.compile(model, mode="reduce-overhead")
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
        for i, (x, y) in enumerate(data):
            with torch._dynamo.config.patch(error_on_recompile=i >= 1):
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = torch.nn.functional.mse_loss(compiled(x), y)
                scaler.scale(loss).backward()
                if lib == "torchext" and i >= 2:
                    torch.cuda.set_sync_debug_mode("error")
                try:
                    scaler.step(opt)
                    scaler.update()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            sched.step()
        runs[lib] = (model, opt, scaler)
    t, x = runs["torch"], runs["torchext"]
    assert x[2].num_skipped_steps() == 1
    for p1, p2 in zip(t[0].parameters(), x[0].parameters()):
        torch.testing.assert_close(p2, p1, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(x[1].state[p2]["ax"], t[1].state[p1]["ax"], rtol=1e-5,
                                   atol=1e-6)
    assert x[2].get_scale() == t[2].get_scale()
