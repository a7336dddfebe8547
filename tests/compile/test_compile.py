"""torch.compile(fullgraph=True), no recompiles, no extra copies, no host
syncs, CUDA graphs and torch.export/AOTInductor for torchext's training step.

Compiles are slow on 2 CPU cores: each test compiles once, small models."""
import copy
import os
import re
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchext
from conftest import requires_cuda
from helpers import amp_train_step, needs_torch, rel_err
from torchext._compile_compat import COMPILED_STEP

GROWTH_INTERVAL = 3


def make(device="cpu", lr=0.01, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1)).to(device)
    lr = torch.tensor(lr, device=device) if lr is not None else 0.01
    opt = torchext.optim.ASGD(model.parameters(), lr=lr, t0=3, weight_decay=1e-4)
    scaler = torchext.amp.GradScaler(init_scale=2.0**10, growth_interval=GROWTH_INTERVAL)
    return model, opt, scaler


def make_train_step(model, opt, scaler, device_type="cpu", dtype=torch.bfloat16, clip=None):
    def train_step(x, y):
        return amp_train_step(model, opt, scaler, x, y, device_type, dtype, clip)
    return train_step


def batches(n, device="cpu", inf_at=(6,)):
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        x = torch.randn(32, 8, generator=g)
        y = torch.randn(32, 1, generator=g)
        if i in inf_at:
            x[0, 0] = float("inf")  # overflows the grads: this step must be skipped
        out.append((x.to(device), y.to(device)))
    return out


def assert_same_training_state(a, b, tol=1e-6):
    (m1, o1, s1), (m2, o2, s2) = a, b
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert rel_err(p2, p1) <= tol
        for k in ("step", "eta", "mu", "ax"):
            assert rel_err(o2.state[p2][k], o1.state[p1][k]) <= tol, k
    assert s1.get_scale() == s2.get_scale()
    assert s1._get_growth_tracker() == s2._get_growth_tracker()
    assert s1.num_skipped_steps() == s2.num_skipped_steps()


class CountingBackend:
    """Counts how many graphs Dynamo hands to the backend (1 = no recompile,
    no graph break)."""

    def __init__(self, backend="inductor"):
        self.backend = backend
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx
            return compile_fx(gm, example_inputs)
        return gm.forward


@pytest.fixture
def trace_autograd_ops():
    # Without it Dynamo breaks the graph at Tensor.backward() (torch 2.13/2.14).
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        torch._dynamo.reset()
        yield
    torch._dynamo.reset()


def run_compiled_vs_eager(backend, steps=22):
    """Eager and compiled torchext train steps, side by side, with a tensor
    lr changed every step by an LR scheduler and an overflow at step 6."""
    eager = make()
    compiled = make()
    eager_step = make_train_step(*eager)
    counter = CountingBackend(backend)
    compiled_step = torch.compile(make_train_step(*compiled), fullgraph=True, backend=counter)
    sched_e = torch.optim.lr_scheduler.ExponentialLR(eager[1], gamma=0.97)
    sched_c = torch.optim.lr_scheduler.ExponentialLR(compiled[1], gamma=0.97)
    w0 = [p.detach().clone() for p in compiled[0].parameters()]
    losses, scales = [], []
    for i, (x, y) in enumerate(batches(steps)):
        losses.append((eager_step(x, y), compiled_step(x, y)))
        with warnings.catch_warnings():  # each saw its step (_compile_compat.py (1b))
            warnings.filterwarnings("error", r"Detected call of `lr_scheduler.step\(\)`")
            sched_e.step()
            sched_c.step()
        scales.append((eager[2].get_scale(), compiled[2].get_scale()))
    moved = max((p - w).abs().max().item() for p, w in zip(compiled[0].parameters(), w0))
    return eager, compiled, counter.graphs, losses, scales, moved


@needs_torch(COMPILED_STEP)
def test_compiling_after_eager_steps_whose_plan_packed_the_state(trace_autograd_ops):
    # Eager steps first: the group's C++ plan packs step/eta/mu into views of
    # one tensor each. The compiled step then takes those views (aliased
    # inputs it mutates) and must still match eager, without recompiling.
    eager, compiled = make(), make()
    eager_step, warm_step = make_train_step(*eager), make_train_step(*compiled)
    data = batches(10, inf_at=(7,))
    for x, y in data[:3]:
        eager_step(x, y)
        warm_step(x, y)
    st = compiled[1].state[next(compiled[0].parameters())]
    assert st["step"]._base is not None, "the eager plan packed the state"
    counter = CountingBackend("aot_eager")
    compiled_step = torch.compile(make_train_step(*compiled), fullgraph=True, backend=counter)
    for x, y in data[3:]:  # (batch 7 overflows: both losses are inf/NaN, the step skipped)
        torch.testing.assert_close(compiled_step(x, y), eager_step(x, y), rtol=0, atol=0,
                                   equal_nan=True)
    assert counter.graphs == 1
    assert_same_training_state(eager, compiled)


@needs_torch(COMPILED_STEP)
def test_fullgraph_train_step_with_fused_clip_matches_eager(trace_autograd_ops):
    """scaler.clip_grad_norm_ inside the whole-step graph: one graph after the
    first call, the same numbers as eager (with clipping active and an
    overflow), and error_if_nonfinite refused at trace time."""
    eager, compiled = make(), make()
    eager_step = make_train_step(*eager, clip=0.05)
    counter = CountingBackend("aot_eager")
    compiled_step = torch.compile(make_train_step(*compiled, clip=0.05), fullgraph=True,
                                  backend=counter)
    for x, y in batches(8, inf_at=(4,)):
        torch.testing.assert_close(compiled_step(x, y), eager_step(x, y), rtol=0, atol=0,
                                   equal_nan=True)
    assert counter.graphs == 2
    assert compiled[2].num_skipped_steps() == 1
    assert_same_training_state(eager, compiled)
    m, o, sc = make()
    sc.scale(m(torch.ones(1, 8)).sum()).backward()
    refused = torch.compile(lambda: sc.clip_grad_norm_(o, 1.0, error_if_nonfinite=True),
                            fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="error_if_nonfinite=True reads the total norm"):
        refused()


@needs_torch(COMPILED_STEP)
def test_fullgraph_train_step_matches_eager_without_recompiles(trace_autograd_ops):
    # aot_eager: Dynamo + AOTAutograd + functionalization of the whole step,
    # with eager kernels, so the numbers must match eager exactly.
    eager, compiled, graphs, losses, scales, moved = run_compiled_vs_eager("aot_eager")
    # The first call also creates the optimizer state (traced into the
    # graph); the steady state then compiles once more, and never again,
    # whatever the scheduler does to the tensor lr or the scaler to the scale.
    assert graphs == 2
    for i, (l_e, l_c) in enumerate(losses):
        if i == 6:
            assert not l_e.isfinite() and not l_c.isfinite()
        else:
            assert torch.equal(l_e, l_c)
    assert [a for a, _ in scales] == [b for _, b in scales]
    assert compiled[2].num_skipped_steps() == 1  # the overflow, skipped on device
    seq = [a for a, _ in scales]
    assert any(b > a for a, b in zip(seq, seq[1:]))  # the scale grew
    assert any(b < a for a, b in zip(seq, seq[1:]))  # and backed off
    assert moved > 1e-3  # the compiled step really updates (no silent no-op)
    assert_same_training_state(eager, compiled)
    # Dynamo must not have rewritten the user's settings.
    assert eager[1].state_dict()["param_groups"] == compiled[1].state_dict()["param_groups"]
    assert compiled[1].param_groups[0]["capturable"] is False


@needs_torch(COMPILED_STEP)
def test_fullgraph_train_step_inductor(trace_autograd_ops):
    # inductor fuses the bf16 autocast forward differently from eager, so
    # losses and grads differ at bf16 rounding level; everything the
    # optimizer and scaler decide must still agree.
    eager, compiled, graphs, losses, scales, moved = run_compiled_vs_eager("inductor", 12)
    assert graphs == 2
    for i, (l_e, l_c) in enumerate(losses):
        assert l_c.isfinite().item() == l_e.isfinite().item() == (i != 6)
        if i != 6:
            assert abs(l_c.item() - l_e.item()) <= 1e-3 * abs(l_e.item())
    assert [a for a, _ in scales] == [b for _, b in scales]
    assert moved > 1e-3
    assert_same_training_state(eager, compiled, tol=1e-3)


@needs_torch(COMPILED_STEP)
def test_zero_grad_keep_buffers_in_compiled_step(trace_autograd_ops):
    eager, compiled = make(), make()

    def step_fn(model, opt, scaler):
        def f(x, y):
            opt.zero_grad(set_to_none=False)
            scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
            scaler.step(opt)
            scaler.update()
        return f

    e, c = step_fn(*eager), torch.compile(step_fn(*compiled), fullgraph=True, backend="aot_eager")
    for x, y in batches(8, inf_at=(3,)):
        e(x, y)
        c(x, y)
    assert_same_training_state(eager, compiled)


@needs_torch(COMPILED_STEP)
def test_optimizer_step_alone_compiles_without_copies():
    """The compiled step mutates the parameters in place. Method: run the
    compiled opt.step() through inductor and read its generated wrapper code:
    the fused op must be called on the graph inputs themselves, with no
    buffer allocated (empty_strided) and nothing cloned or copied — the
    reinplace pass undid auto-functionalization, so the memory traffic is the
    eager op's."""
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    model, opt, _ = make()
    x, y = batches(1, inf_at=())[0]
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()  # state exists: what is measured is the steady state
    ref = copy.deepcopy((model, opt))
    for p, q in zip(model.parameters(), ref[0].parameters()):
        q.grad = p.grad.clone()  # deepcopy leaves .grad behind

    @torch.compile(fullgraph=True)
    def step():
        opt.step()

    _, codes = run_and_get_code(step)
    ref[1].step()
    call_body = codes[-1].split("def call(")[1].split("\ndef ")[0]
    assert call_body.count("torch.ops.torchext.asgd_") == 1
    for forbidden in ("empty_strided", "clone", ".copy_(", "copy_misaligned"):
        assert forbidden not in call_body, forbidden
    for p1, p2 in zip(ref[0].parameters(), model.parameters()):
        assert torch.equal(p1, p2)


@needs_torch(COMPILED_STEP)
def test_float_lr_guards_and_recompiles_tensor_lr_does_not():
    """Documented behaviour: a Python-float lr is a constant of the first
    graph, so its first change recompiles, after which Dynamo makes it an
    input of the graph (automatic dynamic) and later changes do not; a
    tensor lr is read on the device and never recompiles."""
    torch._dynamo.reset()
    results = {}
    for kind in ("float", "tensor"):
        model, opt, _ = make(lr=None if kind == "float" else 0.01)
        backend = CountingBackend("eager")
        step = torch.compile(lambda: opt.step(), fullgraph=True, backend=backend)
        x, y = batches(1, inf_at=())[0]
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()  # state exists before compiling: only the lr can recompile
        for i in range(3):
            if kind == "float":
                opt.param_groups[0]["lr"] = 0.01 * (i + 1)
            else:
                opt.param_groups[0]["lr"].fill_(0.01 * (i + 1))
            step()
        results[kind] = backend.graphs
    assert results == {"float": 2, "tensor": 1}


class NoHostSync(TorchDispatchMode):
    """Fails on any read of a device value by the host: .item(), bool(),
    is_nonzero, and any copy from a non-CPU device to the CPU."""

    BANNED = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default,
              torch.ops.aten.is_nonzero.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.BANNED:
            raise AssertionError(f"host sync: {func}")
        out = func(*args, **kwargs)
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            src = args[1] if func is torch.ops.aten.copy_.default else args[0]
            dst = args[0] if func is torch.ops.aten.copy_.default else out
            if src.device.type != "cpu" and dst.device.type == "cpu":
                raise AssertionError(f"device->host copy: {func}")
        return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_capturable_path_has_no_host_sync(device):
    model, opt, scaler = make(device)
    opt.param_groups[0]["capturable"] = True
    for i, (x, y) in enumerate(batches(4, device, inf_at=(2,))):
        opt.zero_grad()
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        with NoHostSync():
            scaler.step(opt)
            scaler.update()
        if i != 2:
            with NoHostSync():
                opt.step()  # alone, too
    assert scaler.num_skipped_steps() == 1  # (reads the value: outside the mode)


@requires_cuda
@pytest.mark.parametrize("capturable", [True, False])
def test_cuda_sync_debug_mode(capturable):
    """capturable=True: scaler.step, scaler.update and opt.step never sync
    with the host. capturable=False (plain eager): exactly the one host read
    README.md documents, found_inf in scaler.step, as torch's scaler pays for
    every plain optimizer (frameworks read 'step() was not called'). The
    state is created by a first step (once, as torch's capturable ASGD needs)."""
    import warnings
    model, _, scaler = make("cuda")
    opt = torchext.optim.ASGD(model.parameters(), lr=torch.tensor(0.01, device="cuda"), t0=3,
                              weight_decay=1e-4, capturable=capturable)
    (x, y), (x2, y2) = batches(2, "cuda", inf_at=())
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    scaler.scale(torch.nn.functional.mse_loss(model(x2), y2)).backward()
    torch.cuda.synchronize()

    def syncs(fn):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            fn()
        return [str(w.message) for w in seen if "synchroniz" in str(w.message)]

    torch.cuda.set_sync_debug_mode("warn")
    try:
        in_step = syncs(lambda: scaler.step(opt))
        after = syncs(lambda: (scaler.update(), opt.step()))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(in_step) == (0 if capturable else 1), in_step
    assert after == []


@requires_cuda
@pytest.mark.parametrize("what", ["step_update", "whole_step", "whole_step_fused_clip"])
def test_cuda_graph_capture_and_replay_matches_eager(what):
    eager, captured = make("cuda"), make("cuda")
    data = batches(8, "cuda", inf_at=(4,))
    static_x, static_y = data[0][0].clone(), data[0][1].clone()
    model, opt, scaler = captured
    clip = 0.05 if what == "whole_step_fused_clip" else None
    e_step = make_train_step(*eager, device_type="cuda", dtype=torch.float16, clip=clip)

    def body():
        if what != "step_update":
            make_train_step(model, opt, scaler, "cuda", torch.float16, clip=clip)(static_x,
                                                                                  static_y)
        else:
            scaler.step(opt)
            scaler.update()

    # Warm up on a side stream (state, scale and autocast caches exist first).
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x, y = data[0]
        e_step(x, y)
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    if what == "step_update":
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(static_x), static_y)
        scaler.scale(loss).backward()
    with torch.cuda.graph(g):
        body()
    for x, y in data[1:]:
        e_step(x, y)
        static_x.copy_(x)
        static_y.copy_(y)
        if what == "step_update":
            opt.zero_grad(set_to_none=False)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(static_x), static_y)
            scaler.scale(loss).backward()
        g.replay()
    torch.cuda.synchronize()
    if what != "step_update":
        assert_same_training_state(eager, captured, tol=1e-3)


@requires_cuda
@needs_torch(COMPILED_STEP)
def test_reduce_overhead_train_step_matches_eager(trace_autograd_ops):
    eager, compiled = make("cuda"), make("cuda")
    e = make_train_step(*eager, device_type="cuda", dtype=torch.float16)
    c = torch.compile(make_train_step(*compiled, device_type="cuda", dtype=torch.float16),
                      mode="reduce-overhead", fullgraph=True)
    for x, y in batches(12, "cuda", inf_at=(5,)):
        e(x, y)
        c(x, y)
    assert_same_training_state(eager, compiled, tol=1e-3)


# ------------------------------------------------------------- export / AOTI

class ASGDStep(torch.nn.Module):
    """One functional ASGD step (what a deployment exports)."""

    def forward(self, p, g, ax, mu, eta, step, lr):
        p, ax, mu, eta, step = p.clone(), ax.clone(), mu.clone(), eta.clone(), step.clone()
        torchext.optim.functional.asgd([p], [g], [ax], [mu], [eta], [step], lr=lr, lambd=1e-4,
                                       alpha=0.75, t0=2.0, weight_decay=1e-3)
        return p, ax, mu, eta, step


class ScaledASGDStep(torch.nn.Module):
    """Scaler step + update: read-only check, fused ASGD that unscales and
    skips on device, then the scale update."""

    def forward(self, p, g, ax, mu, eta, step, scale, growth, hyst):
        p, ax, mu, eta, step = p.clone(), ax.clone(), mu.clone(), eta.clone(), step.clone()
        scale, growth, hyst = scale.clone(), growth.clone(), hyst.clone()
        found = torch.zeros((), device=p.device)
        torch.ops.torchext.check_finite_([g], found)
        torchext.optim.functional.asgd([p], [g], [ax], [mu], [eta], [step], lr=0.01, lambd=1e-4,
                                       alpha=0.75, t0=0.0, weight_decay=0.0, grad_scale=scale,
                                       found_inf=found)
        torch.ops.torchext.update_scale_(scale, growth, hyst, found, growth_factor=2.0,
                                         backoff_factor=0.5, growth_interval=2)
        return p, ax, mu, eta, step, scale, growth, hyst


def asgd_inputs(poison=False):
    g = torch.Generator().manual_seed(0)
    p = torch.randn(4, 5, generator=g)
    grad = torch.randn(4, 5, generator=g) * 1024
    if poison:
        grad[1, 1] = float("nan")
    return (p, grad, torch.zeros(4, 5), torch.tensor(1.0), torch.tensor(0.01), torch.tensor(0.0))


def test_export_contains_torchext_ops():
    ep = torch.export.export(ASGDStep(), (*asgd_inputs(), torch.tensor(0.01)))
    assert "torchext.asgd_.default" in str(ep.graph)
    scaled = (*asgd_inputs(), torch.tensor(1024.0), torch.tensor(0, dtype=torch.int32),
              torch.tensor(1, dtype=torch.int32))
    ep2 = torch.export.export(ScaledASGDStep(), scaled)
    graph = str(ep2.graph)
    for op in ("torchext.check_finite_", "torchext.asgd_", "torchext.update_scale_"):
        assert op in graph, op
    # The exported program runs and matches eager.
    for a, b in zip(ep2.module()(*scaled), ScaledASGDStep()(*scaled)):
        assert torch.equal(a, b)


def test_aot_inductor_package_runs_and_matches_eager(tmp_path):
    scaled = (*asgd_inputs(), torch.tensor(1024.0), torch.tensor(0, dtype=torch.int32),
              torch.tensor(1, dtype=torch.int32))
    ep = torch.export.export(ScaledASGDStep(), scaled)
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "step.pt2"))
    runner = torch._inductor.aoti_load_package(path)
    for poison in (False, True):
        args = (*asgd_inputs(poison), *scaled[6:])
        got = runner(*args)
        want = ScaledASGDStep()(*args)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        if poison:  # skipped on device: params unchanged, scale halved
            assert torch.equal(got[0], args[0]) and got[5].item() == 512.0
