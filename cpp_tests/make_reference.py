"""Writes the reference data the C++ tests (cpp_tests/) compare against.

    python cpp_tests/make_reference.py OUT_DIR [--no-aoti]

Everything is produced by PyTorch itself at test time (nothing is committed):
  asgd_ref.pt     torch.optim.ASGD trajectories (initial values, grads,
                  options per group, final params and state) for several
                  option combinations, 100 steps each.
  scaler_ref.pt   torch.amp.GradScaler("cpu") + torch.optim.ASGD / SGD with
                  injected overflows: scale trajectory and final params.
  train_step.pt   a TorchScript module (scripted here) whose method runs a
                  whole training step with the torchext ops; ts_ref.pt holds
                  its inputs and the params after the same steps run eagerly.
  asgd_step.pt2   an AOTInductor package of the functional ASGD step
                  (torch.export + aoti_compile_and_package); aoti_ref.pt holds
                  inputs and the result of the same steps run eagerly.
  ckpt_*.pt       Python-format checkpoints (checkpoint_reference) that the
                  C++ tests load with torchext::load_state_dict, and the
                  trajectories they must continue; resume_in_python.py checks
                  what C++ saved back. ckpt_t0pp_*: a run whose group got
                  t0_per_param from start_averaging.
  amp_protocol_ref.pt  torchext.amp.GradScaler + torchext.optim.ASGD with
                  overflows (plain, capturable, unscale_ first): which steps
                  called step(), the scales, the params and step counts.
  clip_ref.pt     the fused clips, each as two calls (clip_grad_norm_ then
                  step) and as one (clip_and_step): torchext.amp.GradScaler
                  (torchext ASGD, plain/capturable/unscale_ first/inf norm, and
                  torch's SGD), a disabled scaler, torchext ASGD without a
                  scaler; a small MLP through overflows with clipping active:
                  the total norms, scales, skipped steps, final params.
  unfused_ref.pt  torchext.optim.ASGD(fused=False) (reference_asgd and
                  _create_state) over options, tensor lr, grad_scale/found_inf,
                  capturable, complex: the C++ unfused step must match bit for bit.
  update_scale_ref.pt  update_scale_ and update_scale_.counted called from
                  Python by keyword, with settings that no swap leaves alone
                  (op/...), and torchext.amp.GradScaler + torch's SGD with the
                  same settings through overflows (scaler/...): the C++
                  call_update_scale and GradScaler::update must match bit for bit.
  split_ref.pt    ASGD's split of a group into op calls, one per device and
                  t0 (the slot groups Python builds), in Python's order: the
                  C++ split (index_by_device_and_t0) must give the same.
  lowp_ref.pt     torchext.optim.ASGD on bf16 and fp16 params (fused and
                  fused=False): a float32 ax (average_dtype default) in group 0,
                  the param's dtype (average_dtype=None) in group 1; the C++
                  replay must match bit for bit. lowp_py_bfloat16.pt: its bf16
                  run saved halfway (C++ continues it, resume_in_python.py
                  checks what C++ saved); lowp_py_optout_bfloat16.pt: the same
                  with average_dtype None in every group (ax narrows on load);
                  lowp_py_dtype_bfloat16.pt: average_dtype torch.float32
                  instead of "float32"; lowp_bad_{dtype,str}.pt: torch.float64
                  and "float64" there (refused);
                  lowp_torch_bfloat16.pt: torch.optim.ASGD's bf16
                  checkpoint (bf16 ax), which loads widened to float32.
  sr_ref.pt       torchext.optim.ASGD(stochastic_rounding=True) on bf16 and
                  fp16 params (two groups, own seeds, a group split by
                  t0_per_param, a param without a grad at some steps), the
                  same run rounded to nearest, and bf16 runs through
                  GradScaler.step / clip_and_step and ASGD.clip_and_step: the
                  C++ replay must match bit for bit. sr_py_{bfloat16,float16}.pt:
                  the runs saved halfway (C++ continues them and saves again,
                  resume_in_python.py finishes); sr_py_old_bfloat16.pt: without
                  the keys (the optimizer's defaults apply); sr_seed*_bfloat16.pt:
                  seeds across int64 (each pickled its own way); sr_bad_*.pt:
                  bad values of the keys, or the flag on the unfused path (refused).
  corrupt/        tests/checkpoint_corruptions.py's table: each corrupted
                  state dict (torch.save), the good ones, and index.txt.
Files are torch.save'd dicts of tensors; C++ reads them with torch::pickle_load.
"""
from __future__ import annotations

import copy
import glob
import os
import sys
import warnings
from typing import List, Tuple

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(HERE)
if glob.glob(os.path.join(_ROOT, "torchext", "_C*.so")):
    sys.path.insert(0, _ROOT)  # a source tree built in place: use it
sys.path.insert(0, os.path.join(_ROOT, "tests"))  # checkpoint_corruptions
import torchext  # noqa: E402,F401  (registers torch.ops.torchext.*)

STEPS = 100
SHAPES = [(5, 4), (4,), (3, 2, 2)]
# Each case: a list of groups, each (param indices, lr, lambd, alpha, t0, weight_decay, maximize).
CASES = [
    [((0, 1, 2), 1e-2, 1e-4, 0.75, 1e6, 0.0, False)],        # torch's defaults
    [((0, 1, 2), 2e-2, 1e-2, 0.75, 0.0, 0.1, False)],        # averaging from step 1
    [((0, 1, 2), 5e-2, 1e-3, 0.5, 5.0, 0.0, True)],          # t0=5, maximize
    [((0, 1, 2), 1e-1, 1e-1, 1.0, 1e6, 1e-2, True)],         # strong decay
    [((0, 1), 2e-2, 1e-4, 0.75, 5.0, 1e-2, False),           # several groups
     ((2,), 5e-3, 1e-3, 0.6, 0.0, 0.0, True)],
]


def asgd_reference(out):
    ref = {"num_cases": torch.tensor(len(CASES)), "steps": torch.tensor(STEPS)}
    gen = torch.Generator().manual_seed(1234)
    for c, groups in enumerate(CASES):
        init = [torch.randn(s, generator=gen) for s in SHAPES]
        grads = [torch.randn((STEPS,) + s, generator=gen) for s in SHAPES]
        params = [t.clone().requires_grad_() for t in init]
        opt = torch.optim.ASGD(
            [dict(params=[params[i] for i in idx], lr=lr, lambd=lambd, alpha=alpha, t0=t0,
                  weight_decay=wd, maximize=mx)
             for idx, lr, lambd, alpha, t0, wd, mx in groups],
            foreach=False)
        for s in range(STEPS):
            for p, g in zip(params, grads):
                p.grad = g[s].clone()
            opt.step()
        pre = f"case{c}/"
        ref[pre + "num_groups"] = torch.tensor(len(groups))
        for gi, (idx, lr, lambd, alpha, t0, wd, mx) in enumerate(groups):
            ref[pre + f"group{gi}/params"] = torch.tensor(idx, dtype=torch.int64)
            ref[pre + f"group{gi}/options"] = torch.tensor(
                [lr, lambd, alpha, t0, wd, float(mx)], dtype=torch.float64)
        for i, p in enumerate(params):
            st = opt.state[p]
            ref[pre + f"init{i}"] = init[i]
            ref[pre + f"grads{i}"] = grads[i]
            ref[pre + f"param{i}"] = p.detach().clone()
            for key in ("step", "eta", "mu", "ax"):
                ref[pre + f"{key}{i}"] = st[key].detach().clone()
    torch.save(ref, os.path.join(out, "asgd_ref.pt"))


SCALER_STEPS = 24
OVERFLOW_AT = (3, 7, 8, 15)  # inf in the data at these steps
SCALER_OPTS = dict(init_scale=2.0 ** 10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)


def scaler_data(steps=SCALER_STEPS, overflow_at=OVERFLOW_AT, seed=99):
    gen = torch.Generator().manual_seed(seed)
    w0 = torch.randn(8, generator=gen)
    xs = torch.randn(steps, 8, generator=gen)
    for s in overflow_at:
        xs[s, s % 8] = float("inf") if s % 2 else float("nan")
    return w0, xs


def scaler_run(make_opt, w0, xs):
    w = w0.clone().requires_grad_()
    opt = make_opt([w])
    scaler = torch.amp.GradScaler("cpu", **SCALER_OPTS)
    scales = []
    for s in range(SCALER_STEPS):
        opt.zero_grad()
        loss = 0.5 * (w * xs[s]).pow(2).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return w.detach().clone(), torch.tensor(scales, dtype=torch.float64)


def scaler_reference(out):
    w0, xs = scaler_data()
    w_asgd, s_asgd = scaler_run(
        lambda p: torch.optim.ASGD(p, lr=0.05, lambd=1e-3, t0=4, foreach=False), w0, xs)
    w_sgd, s_sgd = scaler_run(lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), w0, xs)
    ref = {"w0": w0, "xs": xs, "asgd_param": w_asgd, "asgd_scales": s_asgd,
           "sgd_param": w_sgd, "sgd_scales": s_sgd,
           "options": torch.tensor([SCALER_OPTS["init_scale"], SCALER_OPTS["growth_factor"],
                                    SCALER_OPTS["backoff_factor"],
                                    SCALER_OPTS["growth_interval"]], dtype=torch.float64)}
    torch.save(ref, os.path.join(out, "scaler_ref.pt"))


# ---- TorchScript: a whole training step in one scripted method ------------

class TrainStep(torch.nn.Module):
    """Linear regression trained by ASGD under a dynamic loss scale, with all
    optimizer and scaler state held as buffers, driven by torch.ops.torchext."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        for name, p in self.lin.named_parameters():
            self.register_buffer(f"ax_{name}", torch.zeros_like(p))
            self.register_buffer(f"mu_{name}", torch.ones(()))
            self.register_buffer(f"eta_{name}", torch.full((), 0.05))
            self.register_buffer(f"step_{name}", torch.zeros(()))
        self.register_buffer("scale", torch.full((), 2.0 ** 8))
        self.register_buffer("growth_tracker", torch.zeros((), dtype=torch.int32))
        self.register_buffer("hysteresis_tracker", torch.ones((), dtype=torch.int32))
        self.register_buffer("found_inf", torch.zeros(()))
        self.register_buffer("lr", torch.tensor(0.05, dtype=torch.float64))  # the op takes a tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)

    @torch.jit.export
    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        # Returns the loss and the list of updated parameters.
        loss = (self.forward(x) - y).pow(2).mean()
        params = [self.lin.weight, self.lin.bias]
        grads = torch.autograd.grad([loss * self.scale], params)
        gs: List[torch.Tensor] = []
        for g in grads:
            assert g is not None
            gs.append(g)
        with torch.no_grad():
            self.found_inf.zero_()
            torch.ops.torchext.check_finite_(gs, self.found_inf)
            torch.ops.torchext.asgd_(
                params, gs, [self.ax_weight, self.ax_bias], [self.mu_weight, self.mu_bias],
                [self.eta_weight, self.eta_bias], [self.step_weight, self.step_bias],
                lr=self.lr, lambd=1e-4, alpha=0.75, t0=3.0, weight_decay=1e-3, maximize=False,
                grad_scale=self.scale, found_inf=self.found_inf)
            torch.ops.torchext.update_scale_(
                self.scale, self.growth_tracker, self.hysteresis_tracker, self.found_inf,
                growth_factor=2.0, backoff_factor=0.5, growth_interval=4, hysteresis=1)
        return loss.detach(), params


TS_STEPS = 30


def torchscript_reference(out):
    torch.manual_seed(7)
    module = TrainStep()
    with warnings.catch_warnings():  # TorchScript is deprecated upstream
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(copy.deepcopy(module))
        scripted.save(os.path.join(out, "train_step.pt"))
    gen = torch.Generator().manual_seed(3)
    xs = torch.randn(TS_STEPS, 16, 4, generator=gen)
    ys = torch.randn(TS_STEPS, 16, 3, generator=gen)
    xs[10, 0, 0] = float("inf")  # an overflow: that step is skipped, the scale backs off
    losses = [module.train_step(xs[s], ys[s])[0] for s in range(TS_STEPS)]
    # The scripted module run in Python must agree with eager too.
    for s in range(TS_STEPS):
        scripted.train_step(xs[s], ys[s])
    scripted_state = scripted.state_dict()
    for name, t in module.state_dict().items():
        torch.testing.assert_close(scripted_state[name], t, rtol=1e-6, atol=1e-7,
                                   msg=lambda m: f"scripted vs eager, {name}: {m}")
    ref = {"xs": xs, "ys": ys, "losses": torch.stack(losses)}
    for name, t in module.state_dict().items():
        ref["final/" + name] = t.detach().clone()
    torch.save(ref, os.path.join(out, "ts_ref.pt"))


# ---- AOTInductor: the functional ASGD step ---------------------------------

AOTI_STEPS = 20
AOTI_LR = 0.05
AOTI_KW = dict(lambd=1e-3, alpha=0.75, t0=5.0, weight_decay=1e-2, maximize=False)


def aoti_lr():
    # The op's lr is a 1-element tensor (a CPU one is read on the host).
    return torch.tensor(AOTI_LR, dtype=torch.float64)


class ASGDStep(torch.nn.Module):
    """One functional ASGD step: takes the state, returns the new state."""

    def forward(self, p, g, ax, mu, eta, step):
        p, ax, mu, eta, step = p.clone(), ax.clone(), mu.clone(), eta.clone(), step.clone()
        torch.ops.torchext.asgd_([p], [g], [ax], [mu], [eta], [step], lr=aoti_lr(), **AOTI_KW)
        return p, ax, mu, eta, step


def aoti_reference(out):
    gen = torch.Generator().manual_seed(11)
    p0 = torch.randn(64, 8, generator=gen)
    grads = torch.randn(AOTI_STEPS, 64, 8, generator=gen)
    state0 = (torch.zeros(64, 8), torch.ones(()), torch.full((), AOTI_LR), torch.zeros(()))
    # Eager reference: the same op, in place.
    p, (ax, mu, eta, step) = p0.clone(), [t.clone() for t in state0]
    for s in range(AOTI_STEPS):
        torch.ops.torchext.asgd_([p], [grads[s]], [ax], [mu], [eta], [step], lr=aoti_lr(),
                                 **AOTI_KW)
    ref = {"p0": p0, "grads": grads, "ax0": state0[0], "mu0": state0[1], "eta0": state0[2],
           "step0": state0[3], "p": p, "ax": ax, "mu": mu, "eta": eta, "step": step}
    torch.save(ref, os.path.join(out, "aoti_ref.pt"))
    example = (p0, grads[0], *state0)
    ep = torch.export.export(ASGDStep(), example)
    path = os.path.join(out, "asgd_step.pt2")
    if os.path.exists(path):
        os.remove(path)
    torch._inductor.aoti_compile_and_package(ep, package_path=path)
    # And it runs in Python too.
    loaded = torch._inductor.aoti_load_package(path)
    got = loaded(*example)
    want = ASGDStep()(*example)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---- Python-format checkpoints: Python -> C++ -> Python --------------------
# Steps [0, PY_STEPS) run in Python, [PY_STEPS, PY_STEPS + CPP_STEPS) in C++,
# the rest in Python again (resume_in_python.py); the whole run in Python is
# the reference.
PY_STEPS, CPP_STEPS, PY2_STEPS = 6, 5, 4
CKPT_STEPS = PY_STEPS + CPP_STEPS + PY2_STEPS
CKPT_SHAPES = [(4, 3), (3,), (2, 2)]
# Two groups with different options (the C++ side builds other options: they
# must come from the file).
CKPT_GROUPS = [dict(idx=(0, 1), lr=0.03, lambd=1e-3, alpha=0.75, t0=3.0, weight_decay=1e-2),
               dict(idx=(2,), lr=0.01, lambd=1e-2, alpha=0.6, t0=0.0, weight_decay=0.0,
                    maximize=True)]


def ckpt_problem(dtype, seed=21):
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in CKPT_SHAPES]
    grads = [torch.randn((CKPT_STEPS,) + s, generator=gen, dtype=torch.float64).to(dtype)
             for s in CKPT_SHAPES]
    return init, grads


def make_asgd(cls, params, lr=None, **kw):
    groups = []
    for g in CKPT_GROUPS:
        opts = {k: v for k, v in g.items() if k != "idx"}
        if lr is not None:
            opts["lr"] = lr
        groups.append(dict(params=[params[i] for i in g["idx"]], **opts))
    return cls(groups, **kw)


def run_steps(opt, params, grads, start, stop, on_step=None):
    for s in range(start, stop):
        for p, g in zip(params, grads):
            p.grad = g[s].clone()
        opt.step()
        if on_step is not None:
            on_step()


def flat_state(opt, params, prefix):
    out = {}
    for i, p in enumerate(params):
        out[f"{prefix}param{i}"] = p.detach().clone()
        for key in ("step", "eta", "mu", "ax"):
            out[f"{prefix}{key}{i}"] = opt.state[p][key].detach().clone()
    return out


def checkpoint_reference(out):
    from torchext.optim import ASGD as TorchextASGD
    for dtype in (torch.float32, torch.float64):
        name = str(dtype).split(".")[-1]
        init, grads = ckpt_problem(dtype)
        params = [t.clone().requires_grad_() for t in init]
        opt = make_asgd(TorchextASGD, params)
        ref = {f"init{i}": t for i, t in enumerate(init)}
        ref.update({f"grads{i}": g for i, g in enumerate(grads)})
        ref.update({"py_steps": torch.tensor(PY_STEPS), "cpp_steps": torch.tensor(CPP_STEPS)})
        run_steps(opt, params, grads, 0, PY_STEPS)
        torch.save(opt.state_dict(), os.path.join(out, f"ckpt_py_{name}.pt"))
        ref.update({f"py_param{i}": p.detach().clone() for i, p in enumerate(params)})
        run_steps(opt, params, grads, PY_STEPS, PY_STEPS + CPP_STEPS)
        ref.update(flat_state(opt, params, "mid_"))
        run_steps(opt, params, grads, PY_STEPS + CPP_STEPS, CKPT_STEPS)
        ref.update(flat_state(opt, params, "end_"))
        torch.save(ref, os.path.join(out, f"ckpt_ref_{name}.pt"))

    # torch.optim.ASGD's own checkpoint (named parameters: param_names), and
    # an old-style one with float step/eta/mu.
    init, grads = ckpt_problem(torch.float32, seed=22)
    params = [t.clone().requires_grad_() for t in init]
    opt = make_asgd(torch.optim.ASGD, params, foreach=False)
    for gi, g in enumerate(opt.param_groups):
        g["param_names"] = [f"g{gi}.p{k}" for k in range(len(g["params"]))]
    run_steps(opt, params, grads, 0, PY_STEPS)
    sd = opt.state_dict()
    torch.save(sd, os.path.join(out, "ckpt_torch.pt"))
    legacy = copy.deepcopy(sd)
    for st in legacy["state"].values():
        for key in ("step", "eta", "mu"):
            st[key] = float(st[key])
    torch.save(legacy, os.path.join(out, "ckpt_torch_legacy.pt"))
    ref = {f"init{i}": t for i, t in enumerate(init)}
    ref.update({f"grads{i}": g for i, g in enumerate(grads)})
    ref.update({f"py_param{i}": p.detach().clone() for i, p in enumerate(params)})
    run_steps(opt, params, grads, PY_STEPS, PY_STEPS + CPP_STEPS)
    ref.update(flat_state(opt, params, "mid_"))
    torch.save(ref, os.path.join(out, "ckpt_torch_ref.pt"))

    # Not an ASGD checkpoint, and one for other shapes.
    w = torch.zeros(4, 3, requires_grad=True)
    sgd = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    w.grad = torch.ones_like(w)
    sgd.step()
    torch.save(sgd.state_dict(), os.path.join(out, "ckpt_sgd.pt"))
    others = [torch.zeros(s, requires_grad=True) for s in [(3, 4), (3,), (2, 2)]]
    other = make_asgd(TorchextASGD, others)
    for p in others:
        p.grad = torch.ones_like(p)
    other.step()
    torch.save(other.state_dict(), os.path.join(out, "ckpt_wrong_shape.pt"))

    # A tensor lr under a schedule (changed in place after every step).
    init, grads = ckpt_problem(torch.float32, seed=23)
    params = [t.clone().requires_grad_() for t in init]
    lr = torch.tensor(0.05)
    opt = make_asgd(TorchextASGD, params, lr=lr)
    run_steps(opt, params, grads, 0, CKPT_STEPS, on_step=lambda: lr.mul_(0.9))
    ref = {f"init{i}": t for i, t in enumerate(init)}
    ref.update({f"grads{i}": g for i, g in enumerate(grads)})
    ref.update(flat_state(opt, params, "end_"))
    ref["lr"] = lr.clone()
    torch.save(ref, os.path.join(out, "tensor_lr_ref.pt"))

    t0_per_param_reference(out)
    scaler_checkpoint_reference(out)


# start_averaging() with the params of a group at different step counts:
# param 1 has no grad at NO_GRAD_STEPS, averaging restarts after
# AVERAGE_AT steps, so group 0 gets t0_per_param. Python runs [0, PY_STEPS)
# and saves; C++ continues (and also runs the whole thing itself, its own
# start_averaging included); resume_in_python.py finishes.
NO_GRAD_STEPS = (0, 2)
AVERAGE_AT = 4


def t0pp_steps(opt, params, grads, start, stop):
    for s in range(start, stop):
        for i, (p, g) in enumerate(zip(params, grads)):
            p.grad = None if (i == 1 and s in NO_GRAD_STEPS) else g[s].clone()
        opt.step()
        if s + 1 == AVERAGE_AT:
            opt.start_averaging()


def t0_per_param_reference(out):
    from torchext.optim import ASGD as TorchextASGD
    init, grads = ckpt_problem(torch.float32, seed=24)
    params = [t.clone().requires_grad_() for t in init]
    opt = make_asgd(TorchextASGD, params)
    ref = {f"init{i}": t for i, t in enumerate(init)}
    ref.update({f"grads{i}": g for i, g in enumerate(grads)})
    ref.update({"py_steps": torch.tensor(PY_STEPS), "cpp_steps": torch.tensor(CPP_STEPS),
                "average_at": torch.tensor(AVERAGE_AT),
                "no_grad_steps": torch.tensor(NO_GRAD_STEPS)})
    t0pp_steps(opt, params, grads, 0, PY_STEPS)
    t0s = opt.param_groups[0].get("t0_per_param")
    assert t0s is not None and len(set(t0s)) > 1, t0s  # what this reference is about
    assert "t0_per_param" not in opt.param_groups[1]
    ref["t0_per_param0"] = torch.tensor(t0s, dtype=torch.float64)
    ref["t0"] = torch.tensor([g["t0"] for g in opt.param_groups], dtype=torch.float64)
    torch.save(opt.state_dict(), os.path.join(out, "ckpt_t0pp_py.pt"))
    ref.update({f"py_param{i}": p.detach().clone() for i, p in enumerate(params)})
    t0pp_steps(opt, params, grads, PY_STEPS, PY_STEPS + CPP_STEPS)
    ref.update(flat_state(opt, params, "mid_"))
    t0pp_steps(opt, params, grads, PY_STEPS + CPP_STEPS, CKPT_STEPS)
    ref.update(flat_state(opt, params, "end_"))
    torch.save(ref, os.path.join(out, "ckpt_t0pp_ref.pt"))


# The scaler: torchext.amp.GradScaler + torchext ASGD, with overflows in the
# Python part and in the C++ part.
SC_OVERFLOW_AT = (2, 3, 7, 8, 12)
SC_OPTS = dict(init_scale=2.0 ** 12, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)


def scaler_train(scaler, opt, w, xs, start, stop):
    for s in range(start, stop):
        opt.zero_grad()
        loss = 0.5 * (w * xs[s]).pow(2).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


def scaler_checkpoint_reference(out):
    from torchext.amp import GradScaler
    from torchext.optim import ASGD as TorchextASGD
    w0, xs = scaler_data(CKPT_STEPS, SC_OVERFLOW_AT, seed=31)
    w = w0.clone().requires_grad_()
    opt = TorchextASGD([w], lr=0.05, lambd=1e-3, t0=4)
    scaler = GradScaler("cpu", **SC_OPTS)
    ref = {"w0": w0, "xs": xs}
    scaler_train(scaler, opt, w, xs, 0, PY_STEPS)
    torch.save(scaler.state_dict(), os.path.join(out, "ckpt_scaler_py.pt"))
    torch.save(opt.state_dict(), os.path.join(out, "ckpt_scaler_opt_py.pt"))
    ref["py_w"] = w.detach().clone()
    for tag, stop in (("mid_", PY_STEPS + CPP_STEPS), ("end_", CKPT_STEPS)):
        scaler_train(scaler, opt, w, xs, PY_STEPS if tag == "mid_" else PY_STEPS + CPP_STEPS, stop)
        ref[tag + "w"] = w.detach().clone()
        ref[tag + "scale"] = torch.tensor(scaler.get_scale(), dtype=torch.float64)
        ref[tag + "growth_tracker"] = torch.tensor(scaler._get_growth_tracker())
        ref[tag + "skipped"] = torch.tensor(scaler.num_skipped_steps())
    torch.save(ref, os.path.join(out, "ckpt_scaler_ref.pt"))


# ---- update_scale_'s settings: Python's keyword calls vs C++ (test_update_scale_args.cpp,
# test_grad_scaler.cpp) ----------------------------------------------------------
# Every two settings differ (a swap of two changes the result or is refused).
UPDATE_SCALE_SETTINGS = dict(growth_factor=4.0, backoff_factor=0.25, growth_interval=3,
                             hysteresis=2, min_scale=2.0 ** 4, max_scale=2.0 ** 14)
UPDATE_SCALE_STEPS = 40
UPDATE_SCALE_OVERFLOW_AT = (2, 3, 4, 9, 10, 11, 12, 13, 14, 20, 31)


def update_scale_reference(out):
    """The op through Python's keyword call (names bound by the schema), and
    torchext's GradScaler with the same settings as options."""
    from torchext.amp import GradScaler
    ops = torch.ops.torchext
    found = torch.zeros(UPDATE_SCALE_STEPS)
    found[list(UPDATE_SCALE_OVERFLOW_AT)] = 1.0
    found[UPDATE_SCALE_OVERFLOW_AT[-1]] = 2.0  # found_inf counts overflows
    ref = {"op/found": found}
    for key, value in UPDATE_SCALE_SETTINGS.items():
        ref[key] = torch.tensor(value, dtype=torch.float64)
    scale, growth = torch.tensor(2.0 ** 10), torch.tensor(0, dtype=torch.int32)
    hyst = torch.tensor(UPDATE_SCALE_SETTINGS["hysteresis"], dtype=torch.int32)
    skipped, count = torch.tensor(False), torch.tensor(0, dtype=torch.int64)
    plain = [scale.clone(), growth.clone(), hyst.clone()]
    rows = {k: [] for k in ("scale", "growth_tracker", "hysteresis_tracker", "last_step_skipped",
                            "skipped_steps", "plain_scale", "plain_growth_tracker",
                            "plain_hysteresis_tracker")}
    ref["op/init_scale"] = scale.clone()
    for f in found:
        ops.update_scale_.counted(scale=scale, growth_tracker=growth, hysteresis_tracker=hyst,
                                  found_inf=f.clone(), last_step_skipped=skipped,
                                  skipped_steps=count, **UPDATE_SCALE_SETTINGS)
        ops.update_scale_(*plain, f.clone(), **UPDATE_SCALE_SETTINGS)
        for key, t in (("scale", scale), ("growth_tracker", growth), ("hysteresis_tracker", hyst),
                       ("last_step_skipped", skipped), ("skipped_steps", count),
                       ("plain_scale", plain[0]), ("plain_growth_tracker", plain[1]),
                       ("plain_hysteresis_tracker", plain[2])):
            rows[key].append(t.clone())
    for key, ts in rows.items():
        ref["op/" + key] = torch.stack(ts)
    # The scaler: inf in the data at the overflow steps (torch's SGD: the
    # scale depends on the overflows only).
    w0, xs = scaler_data(UPDATE_SCALE_STEPS, UPDATE_SCALE_OVERFLOW_AT, seed=5)
    w = w0.clone().requires_grad_()
    opt = torch.optim.SGD([w], lr=0.05)
    scaler = GradScaler("cpu", init_scale=2.0 ** 10, **UPDATE_SCALE_SETTINGS)
    scales, skips = [], []
    for s in range(UPDATE_SCALE_STEPS):
        opt.zero_grad()
        scaler.scale(0.5 * (w * xs[s]).pow(2).sum()).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        skips.append(scaler.was_step_skipped())
    ref.update({"scaler/w0": w0, "scaler/xs": xs,
                "scaler/scales": torch.tensor(scales, dtype=torch.float64),
                "scaler/skipped": torch.tensor(skips),
                "scaler/num_skipped": torch.tensor(scaler.num_skipped_steps())})
    torch.save(ref, os.path.join(out, "update_scale_ref.pt"))


# ---- the scaler's fused-step protocol: torchext's scaler + torchext's ASGD ---

PROTOCOL_VARIANTS = ("plain", "capturable", "unscale_first")


def amp_protocol_reference(out):
    """torchext.amp.GradScaler stepping torchext.optim.ASGD through
    overflows: which steps called step() (capturable=True: all, skipped on
    the device), what scaler.step returned, the scales, params and state."""
    from torchext.amp import GradScaler
    from torchext.optim import ASGD as TorchextASGD
    w0, xs = scaler_data()
    ref = {"w0": w0, "xs": xs}
    for variant in PROTOCOL_VARIANTS:
        w = w0.clone().requires_grad_()
        opt = TorchextASGD([w], lr=0.05, lambd=1e-3, t0=4,
                           capturable=variant == "capturable")
        calls = []
        step = opt.step
        opt.step = lambda *a, **k: (calls.append(len(calls)), step(*a, **k))[1]
        scaler = GradScaler("cpu", **SCALER_OPTS)
        called, scales = [], []
        for s in range(SCALER_STEPS):
            opt.zero_grad()
            loss = 0.5 * (w * xs[s]).pow(2).sum()
            scaler.scale(loss).backward()
            if variant == "unscale_first":
                scaler.unscale_(opt)
            before = len(calls)
            assert scaler.step(opt) is None  # ASGD.step() returns None (no closure)
            called.append(len(calls) > before)
            scaler.update()
            scales.append(scaler.get_scale())
        pre = variant + "/"
        ref[pre + "called"] = torch.tensor(called)
        ref[pre + "scales"] = torch.tensor(scales, dtype=torch.float64)
        ref[pre + "w"] = w.detach().clone()
        for key in ("step", "eta", "mu", "ax"):
            ref[pre + key] = opt.state[w][key].detach().clone()
        ref[pre + "skipped"] = torch.tensor(scaler.num_skipped_steps())
    torch.save(ref, os.path.join(out, "amp_protocol_ref.pt"))


# ---- the fused clips: Python's torchext vs C++ (test_grad_scaler.cpp) ------------
# Each variant: (optimizer, scaler: "on"/"off"/None, unscale_ first, norm_type,
# one call: clip_and_step instead of clip_grad_norm_ then step). See Note [Clip:
# applied when called, folded only inside one call] (torchext/_clip.py).
CLIP_VARIANTS = {
    "asgd": ("asgd", "on", False, 2.0, False),
    "asgd_capturable": ("asgd_capturable", "on", False, 2.0, False),
    "asgd_unscale_first": ("asgd", "on", True, 2.0, False),
    "asgd_inf_norm": ("asgd", "on", False, float("inf"), False),
    "sgd": ("sgd", "on", False, 2.0, False),
    "sgd_unscale_first": ("sgd", "on", True, 2.0, False),
    "asgd_disabled": ("asgd", "off", False, 2.0, False),
    "sgd_disabled": ("sgd", "off", False, 2.0, False),
    "asgd_no_scaler": ("asgd", None, False, 2.0, False),
    "asgd_one_call": ("asgd", "on", False, 2.0, True),
    "asgd_capturable_one_call": ("asgd_capturable", "on", False, 2.0, True),
    "asgd_unscale_first_one_call": ("asgd", "on", True, 2.0, True),
    "asgd_inf_norm_one_call": ("asgd", "on", False, float("inf"), True),
    "sgd_one_call": ("sgd", "on", False, 2.0, True),
    "sgd_unscale_first_one_call": ("sgd", "on", True, 2.0, True),
    "asgd_disabled_one_call": ("asgd", "off", False, 2.0, True),
    "sgd_disabled_one_call": ("sgd", "off", False, 2.0, True),
    "asgd_no_scaler_one_call": ("asgd", None, False, 2.0, True),
}
CLIP_STEPS = 16
CLIP_MAX_NORM = 0.05
CLIP_BAD_GRAD = {3: float("inf"), 9: float("nan")}  # first param's grad[1], scaled runs only
CLIP_SCALER = dict(init_scale=2.0 ** 10, growth_interval=4)


def clip_reference(out):
    """A small MLP (Linear 6->16, tanh, Linear 16->3, MSE) trained with the
    clip of each CLIP_VARIANTS entry; the C++ test (GradScaler.ClipMatchesPython)
    builds the same model from the saved weights, makes the same calls, and
    must match every number bit for bit."""
    from torchext.amp import GradScaler
    from torchext.optim import ASGD as TorchextASGD
    gen = torch.Generator().manual_seed(5)
    init = [torch.randn(16, 6, generator=gen) * 0.5, torch.randn(16, generator=gen) * 0.1,
            torch.randn(3, 16, generator=gen) * 0.5, torch.randn(3, generator=gen) * 0.1]
    x, y = torch.randn(32, 6, generator=gen), torch.randn(32, 3, generator=gen)
    ref = {"x": x, "y": y, "steps": torch.tensor(CLIP_STEPS), "max_norm": torch.tensor(
        CLIP_MAX_NORM, dtype=torch.float64)}
    for i, t in enumerate(init):
        ref[f"init{i}"] = t
    for bad_step, value in CLIP_BAD_GRAD.items():
        ref[f"bad_at{bad_step}"] = torch.tensor(value)
    for name, (opt_kind, scaler_kind, unscale_first, norm_type, one_call) in (
            CLIP_VARIANTS.items()):
        params = [t.clone().requires_grad_() for t in init]
        if opt_kind == "sgd":
            opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
        else:
            opt = TorchextASGD(params, lr=0.05, t0=5, capturable=opt_kind == "asgd_capturable")
        scaler = None if scaler_kind is None else GradScaler(**CLIP_SCALER,
                                                             enabled=scaler_kind == "on")
        norms, scales = [], []
        for s in range(CLIP_STEPS):
            opt.zero_grad()
            h = torch.tanh(torch.nn.functional.linear(x, params[0], params[1]))
            loss = torch.nn.functional.mse_loss(torch.nn.functional.linear(h, params[2],
                                                                           params[3]), y)
            if scaler is None:
                loss.backward()
                if one_call:
                    norms.append(opt.clip_and_step(CLIP_MAX_NORM, norm_type).total_norm)
                else:
                    norms.append(opt.clip_grad_norm_(CLIP_MAX_NORM, norm_type))
                    opt.step()
                continue
            scaler.scale(loss).backward()
            if scaler_kind == "on" and s in CLIP_BAD_GRAD:
                params[0].grad.view(-1)[1] = CLIP_BAD_GRAD[s]
            if unscale_first:
                scaler.unscale_(opt)
            if one_call:
                norms.append(scaler.clip_and_step(opt, CLIP_MAX_NORM, norm_type).total_norm)
            else:
                norms.append(scaler.clip_grad_norm_(opt, CLIP_MAX_NORM, norm_type))
                scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        pre = name + "/"
        ref[pre + "norm_type"] = torch.tensor(norm_type, dtype=torch.float64)
        ref[pre + "norms"] = torch.stack(norms)
        ref[pre + "scales"] = torch.tensor(scales, dtype=torch.float64)
        ref[pre + "skipped"] = torch.tensor(0 if scaler is None else scaler.num_skipped_steps())
        for i, p in enumerate(params):
            ref[pre + f"param{i}"] = p.detach().clone()
    torch.save(ref, os.path.join(out, "clip_ref.pt"))


# ---- the unfused step and state creation, Python vs C++ ---------------------
# Each case: torchext.optim.ASGD(fused=False) options, the params' dtype and
# whether grad_scale/found_inf are set (found_inf at UNFUSED_OVERFLOW steps:
# step 0 is one, so the state is created and the step skipped).
UNFUSED_STEPS = 60  # enough that rounding differences of a wrong op order show
UNFUSED_OVERFLOW = (0, 3, 17)
UNFUSED_CASES = [
    ("plain", dict(lr=0.05, lambd=1e-3, alpha=0.75, t0=2.0, weight_decay=0.0), torch.float32,
     False),
    ("capturable", dict(lr=0.05, lambd=1e-3, alpha=0.75, t0=2.0, capturable=True),
     torch.float32, False),
    ("tensor_lr", dict(lr="tensor", lambd=1e-2, alpha=0.6, t0=1.0), torch.float32, False),
    ("tensor_lr_capturable", dict(lr="tensor", lambd=1e-2, alpha=0.6, t0=1.0, capturable=True),
     torch.float32, False),
    ("amp", dict(lr=0.05, lambd=1e-3, t0=1.0, weight_decay=1e-2), torch.float32, True),
    ("amp_capturable", dict(lr=0.05, lambd=1e-3, t0=1.0, weight_decay=1e-2, capturable=True),
     torch.float32, True),
    ("maximize_weight_decay", dict(lr=0.1, lambd=1e-1, alpha=1.0, t0=0.0, weight_decay=0.1,
                                   maximize=True), torch.float32, False),
    ("complex", dict(lr=0.05, lambd=1e-3, t0=2.0, weight_decay=1e-2), torch.complex64, True),
    ("complex_capturable", dict(lr=0.05, lambd=1e-3, t0=2.0, maximize=True, capturable=True),
     torch.complex64, True),
    ("float64", dict(lr=0.05, lambd=1e-3, t0=2.0), torch.float64, True),
]
UNFUSED_SHAPES = [(3, 2), (4,)]


def unfused_reference(out):
    from torchext.optim import ASGD as TorchextASGD
    ref = {"num_cases": torch.tensor(len(UNFUSED_CASES)), "steps": torch.tensor(UNFUSED_STEPS),
           "overflow_at": torch.tensor(UNFUSED_OVERFLOW)}
    names = []
    gen = torch.Generator().manual_seed(41)
    for c, (name, opts, dtype, amp) in enumerate(UNFUSED_CASES):
        names.append(name)
        pre = f"case{c}/"
        init = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype)
                for s in UNFUSED_SHAPES]
        grads = [torch.randn((UNFUSED_STEPS,) + s, generator=gen, dtype=torch.float64).to(dtype)
                 for s in UNFUSED_SHAPES]
        opts = dict(opts)
        tensor_lr = opts["lr"] == "tensor"
        if tensor_lr:
            opts["lr"] = torch.tensor(0.05)  # float32, changed in place after each step
            ref[pre + "lr_tensor"] = opts["lr"].clone()
        ref[pre + "tensor_lr"] = torch.tensor(tensor_lr)
        ref[pre + "lr"] = torch.tensor(float(opts["lr"]), dtype=torch.float64)
        ref[pre + "options"] = torch.tensor(
            [opts.get("lambd", 1e-4), opts.get("alpha", 0.75), opts.get("t0", 1e6),
             opts.get("weight_decay", 0.0), float(opts.get("maximize", False)),
             float(opts.get("capturable", False))], dtype=torch.float64)
        ref[pre + "amp"] = torch.tensor(amp)
        params = [t.clone().requires_grad_() for t in init]
        opt = TorchextASGD(params, fused=False, **opts)
        grad_scale = torch.tensor(8.0)
        for s in range(UNFUSED_STEPS):
            for p, g in zip(params, grads):
                p.grad = (g[s] * 8.0 if amp else g[s]).clone()
            if amp:
                opt.grad_scale = grad_scale
                opt.found_inf = torch.tensor(1.0 if s in UNFUSED_OVERFLOW else 0.0)
            opt.step()
            if amp:
                del opt.grad_scale, opt.found_inf
            if tensor_lr:
                opts["lr"].mul_(0.9)  # an in-place schedule
            if s == 0:
                ref.update(flat_state(opt, params, pre + "after0_"))
        ref.update({pre + f"init{i}": t for i, t in enumerate(init)})
        ref.update({pre + f"grads{i}": g for i, g in enumerate(grads)})
        ref.update(flat_state(opt, params, pre + "final_"))
    torch.save(ref, os.path.join(out, "unfused_ref.pt"))
    with open(os.path.join(out, "unfused_cases.txt"), "w") as f:
        f.write("\n".join(names) + "\n")


# ---- a float32 average for fp16/bf16 parameters (issue 47) -----------------
LP_STEPS = 40  # the C++ side continues the saved run from LP_STEPS // 2
LP_SHAPES = [(5, 4), (4,), (3, 2, 2)]
# Group 0: the default average_dtype (float32 ax); group 1 opted out (ax in
# the param's dtype). test_low_precision.cpp builds the same options (lp_groups).
LP_GROUPS = [dict(idx=(0, 1), lr=0.05, lambd=1e-3, alpha=0.75, t0=3.0, weight_decay=1e-2),
             dict(idx=(2,), lr=0.02, lambd=1e-4, alpha=0.75, t0=0.0, weight_decay=0.0,
                  average_dtype=None)]


def lp_asgd(cls, params, **kw):
    return cls([dict(params=[params[i] for i in g["idx"]],
                     **{k: v for k, v in g.items() if k != "idx"}) for g in LP_GROUPS], **kw)


def low_precision_reference(out):
    from torchext.optim import ASGD as TorchextASGD
    gen = torch.Generator().manual_seed(47)
    ref = {"steps": torch.tensor(LP_STEPS)}
    half = LP_STEPS // 2
    for dtype in (torch.bfloat16, torch.float16):
        name = str(dtype).split(".")[-1]
        init = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in LP_SHAPES]
        grads = [torch.randn((LP_STEPS,) + s, generator=gen, dtype=torch.float64).to(dtype)
                 for s in LP_SHAPES]
        ref.update({f"{name}/init{i}": t for i, t in enumerate(init)})
        ref.update({f"{name}/grads{i}": g for i, g in enumerate(grads)})
        for fused in (True, False):
            pre = f"{name}/{'fused' if fused else 'unfused'}/"
            params = [t.clone().requires_grad_() for t in init]
            opt = lp_asgd(TorchextASGD, params, fused=fused)
            run_steps(opt, params, grads, 0, half)
            if fused and dtype == torch.bfloat16:
                sd = opt.state_dict()
                torch.save(sd, os.path.join(out, f"lowp_py_{name}.pt"))
                # Opted out in the file, float32 ax saved: narrows to bf16 on load.
                optout = copy.deepcopy(sd)
                for g in optout["param_groups"]:
                    g["average_dtype"] = None
                torch.save(optout, os.path.join(out, f"lowp_py_optout_{name}.pt"))
                # As the first version of Python wrote it: torch.float32 (a
                # pickled global, which C++ rewrites before unpickling).
                as_dtype = copy.deepcopy(sd)
                for g in as_dtype["param_groups"]:
                    if g["average_dtype"] is not None:
                        g["average_dtype"] = torch.float32
                torch.save(as_dtype, os.path.join(out, f"lowp_py_dtype_{name}.pt"))
                # Refused (only "float32", torch.float32 or None): another
                # dtype, another string.
                for bad_name, bad in (("dtype", torch.float64), ("str", "float64")):
                    bad_sd = copy.deepcopy(sd)
                    bad_sd["param_groups"][1]["average_dtype"] = bad
                    torch.save(bad_sd, os.path.join(out, f"lowp_bad_{bad_name}.pt"))
                ref.update(flat_state(opt, params, f"{name}/half_"))
            run_steps(opt, params, grads, half, LP_STEPS)
            assert [opt.state[p]["ax"].dtype for p in params] == [torch.float32] * 2 + [dtype]
            ref.update(flat_state(opt, params, pre))
    # torch.optim.ASGD's bf16 checkpoint (ax in bf16), and torchext continuing it.
    name = "bfloat16"
    init = [ref[f"{name}/init{i}"] for i in range(3)]
    grads = [ref[f"{name}/grads{i}"] for i in range(3)]
    params = [t.clone().requires_grad_() for t in init]
    topt = torch.optim.ASGD([dict(params=[params[i] for i in g["idx"]],
                                  **{k: v for k, v in g.items()
                                     if k not in ("idx", "average_dtype")})
                             for g in LP_GROUPS], foreach=False)
    run_steps(topt, params, grads, 0, half)
    sd = topt.state_dict()
    assert all(st["ax"].dtype == torch.bfloat16 for st in sd["state"].values())
    torch.save(sd, os.path.join(out, f"lowp_torch_{name}.pt"))
    ref.update(flat_state(topt, params, "torch_half_"))
    opt = TorchextASGD([dict(params=[params[i] for i in g["idx"]]) for g in LP_GROUPS])
    opt.load_state_dict(copy.deepcopy(sd))  # no average_dtype in torch's: float32 for all
    assert all(opt.state[p]["ax"].dtype == torch.float32 for p in params)
    run_steps(opt, params, grads, half, LP_STEPS)
    ref.update(flat_state(opt, params, "torch_cont_"))
    torch.save(ref, os.path.join(out, "lowp_ref.pt"))


# ---- stochastic rounding of fp16/bf16 parameters (issue 47) ----------------
# torchext.optim.ASGD(stochastic_rounding=True): two groups with their own
# seeds (one negative, one past 32 bits); group 0 split into two op calls by
# t0_per_param and its param 1 without a grad at SR_NO_GRAD, so each param's
# id (group << 32 | index in the group) is its place in the group, not in an
# op call. Python runs [0, SR_HALF) and saves; C++ continues to SR_CPP_STOP
# and saves; resume_in_python.py finishes. The uninterrupted run is the
# reference (test_stochastic_rounding.cpp).
SR_STEPS, SR_HALF, SR_CPP_STOP = 24, 10, 17
SR_SHAPES = [(5, 4), (4,), (3, 2, 2), (7,)]
SR_NO_GRAD = (2, 3, 13)  # param 1 has no grad at these steps
SR_DEFAULT_SEED = 2**40 + 12345
# Seeds Python pickles each its own way (BININT, LONG1 of 5 to 8 bytes).
SR_SEEDS = [2**31 - 1, 2**31, -2**31 - 1, -2**47, 2**55, -2**63, 2**63 - 1]
SR_GROUPS = [dict(idx=(0, 1, 2), lr=0.05, lambd=1e-3, alpha=0.75, t0=3.0, weight_decay=1e-2,
                  t0_per_param=[3.0, 0.0, 3.0]),
             dict(idx=(3,), lr=0.02, lambd=1e-4, alpha=0.75, t0=0.0, weight_decay=0.0,
                  rounding_seed=-7)]
# The scaler's and the clips' paths (bf16, one group): GradScaler.step,
# GradScaler.clip_and_step, ASGD.clip_and_step.
SR_AMP_VARIANTS = ("scaler_step", "scaler_clip_and_step", "clip_and_step")
SR_AMP_STEPS = 12
SR_AMP_OVERFLOW = (2, 6)  # an inf in param 0's grad (scaled runs)
SR_AMP_MAX_NORM = 0.5
SR_AMP_SCALER = dict(init_scale=2.0 ** 4, growth_interval=3)


def sr_asgd(params, **kw):
    from torchext.optim import ASGD as TorchextASGD
    return TorchextASGD([dict(params=[params[i] for i in g["idx"]],
                              **{k: v for k, v in g.items() if k != "idx"}) for g in SR_GROUPS],
                        **kw)


def sr_steps(opt, params, grads, start, stop):
    for s in range(start, stop):
        for i, (p, g) in enumerate(zip(params, grads)):
            p.grad = None if i == 1 and s in SR_NO_GRAD else g[s].clone()
        opt.step()


def sr_amp_run(variant, init, grads):
    """SR_AMP_STEPS of one SR_AMP_VARIANTS entry: the grads set scaled by
    hand (grad * scale, exact), an inf at SR_AMP_OVERFLOW in scaled runs."""
    from torchext.amp import GradScaler
    from torchext.optim import ASGD as TorchextASGD
    params = [t.clone().requires_grad_() for t in init]
    opt = TorchextASGD(params, lr=0.05, t0=3, stochastic_rounding=True, rounding_seed=99)
    scaler = None if variant == "clip_and_step" else GradScaler(**SR_AMP_SCALER)
    for s in range(SR_AMP_STEPS):
        scale = 1.0 if scaler is None else scaler.scale(torch.ones(())).item()
        for p, g in zip(params, grads):
            p.grad = g[s] * scale
        if scaler is None:
            opt.clip_and_step(SR_AMP_MAX_NORM)
            continue
        if s in SR_AMP_OVERFLOW:
            params[0].grad.view(-1)[1] = float("inf")
        if variant == "scaler_step":
            scaler.step(opt)
        else:
            scaler.clip_and_step(opt, SR_AMP_MAX_NORM)
        scaler.update()
    return params, opt


def stochastic_rounding_reference(out):
    gen = torch.Generator().manual_seed(4747)
    ref = {"steps": torch.tensor(SR_STEPS), "half": torch.tensor(SR_HALF),
           "cpp_stop": torch.tensor(SR_CPP_STOP), "no_grad": torch.tensor(SR_NO_GRAD),
           "default_seed": torch.tensor(SR_DEFAULT_SEED), "amp_steps": torch.tensor(SR_AMP_STEPS),
           "amp_max_norm": torch.tensor(SR_AMP_MAX_NORM, dtype=torch.float64)}
    for dtype in (torch.bfloat16, torch.float16):
        name = str(dtype).split(".")[-1]
        init = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in SR_SHAPES]
        grads = [torch.randn((SR_STEPS,) + s, generator=gen, dtype=torch.float64).to(dtype)
                 for s in SR_SHAPES]
        ref.update({f"{name}/init{i}": t for i, t in enumerate(init)})
        ref.update({f"{name}/grads{i}": g for i, g in enumerate(grads)})
        params = [t.clone().requires_grad_() for t in init]
        opt = sr_asgd(params, stochastic_rounding=True, rounding_seed=SR_DEFAULT_SEED)
        assert [g["rounding_seed"] for g in opt.param_groups] == [SR_DEFAULT_SEED, -7]
        sr_steps(opt, params, grads, 0, SR_HALF)
        sd = opt.state_dict()
        torch.save(sd, os.path.join(out, f"sr_py_{name}.pt"))
        ref.update(flat_state(opt, params, f"{name}/half_"))
        sr_steps(opt, params, grads, SR_HALF, SR_STEPS)
        ref.update(flat_state(opt, params, f"{name}/final_"))
        if dtype == torch.bfloat16:
            # A file from before the keys: the loading optimizer's defaults apply.
            old = copy.deepcopy(sd)
            for g in old["param_groups"]:
                del g["stochastic_rounding"], g["rounding_seed"]
            torch.save(old, os.path.join(out, f"sr_py_old_{name}.pt"))
            # Refused whole (beyond the shared corruption table's cases).
            bad = {"sr_none": ("stochastic_rounding", None),
                   "sr_string": ("stochastic_rounding", "yes"),
                   "seed_bool": ("rounding_seed", True),
                   "seed_none": ("rounding_seed", None),
                   "seed_tensor": ("rounding_seed", torch.tensor(7)),
                   "sr_fused_false": ("fused", False),
                   "sr_differentiable": ("differentiable", True),
                   "seed_beyond_int64": ("rounding_seed", 2**63)}
            for bad_name, (key, value) in bad.items():
                bad_sd = copy.deepcopy(sd)
                bad_sd["param_groups"][1][key] = value
                torch.save(bad_sd, os.path.join(out, f"sr_bad_{bad_name}.pt"))
            for k, seed in enumerate(SR_SEEDS):
                seed_sd = copy.deepcopy(sd)
                seed_sd["param_groups"][1]["rounding_seed"] = seed
                # an unknown key whose string holds the bytes of a dtype
                # global and of a LONG1: left alone
                seed_sd["param_groups"][1]["note"] = "ctorch\nfloat32\n\x8a\x01\x07"
                torch.save(seed_sd, os.path.join(out, f"sr_seed{k}_{name}.pt"))
            ref["seeds"] = torch.tensor(SR_SEEDS)
            # Round to nearest (the flag off), the same run: other bits.
            params = [t.clone().requires_grad_() for t in init]
            off = sr_asgd(params)
            sr_steps(off, params, grads, 0, SR_STEPS)
            ref.update(flat_state(off, params, f"{name}/nearest_"))
    name = "bfloat16"
    init = [ref[f"{name}/init{i}"] for i in (0, 1)]
    grads = [ref[f"{name}/grads{i}"][:SR_AMP_STEPS] for i in (0, 1)]
    for variant in SR_AMP_VARIANTS:
        params, opt = sr_amp_run(variant, init, grads)
        assert opt.state[params[0]]["step"].item() == SR_AMP_STEPS - (
            0 if variant == "clip_and_step" else len(SR_AMP_OVERFLOW))
        ref.update(flat_state(opt, params, f"amp/{variant}/"))
    torch.save(ref, os.path.join(out, "sr_ref.pt"))


# ---- corrupted checkpoints (tests/checkpoint_corruptions.py) ---------------

def corrupt_reference(out):
    """Every case of the table as a torch.save'd file, the good checkpoints,
    and index.txt: one line per file, "kind<TAB>bad|allowed<TAB>name<TAB>names"
    (names: the substrings C++'s error must contain, separated by '|')."""
    import checkpoint_corruptions as cc
    d = os.path.join(out, "corrupt")
    os.makedirs(d, exist_ok=True)
    params, opt = cc.asgd_problem()
    cc.train_asgd(params, opt, 3)
    good = {"asgd": copy.deepcopy(opt.state_dict())}
    scaler = cc.scaler_problem()
    cc.train_scaler(scaler, 4)
    good["scaler"] = scaler.state_dict()
    lines = []
    for kind, cases, allowed in (("asgd", cc.ASGD_CASES, cc.ASGD_ALLOWED),
                                 ("scaler", cc.SCALER_CASES, cc.SCALER_ALLOWED)):
        torch.save(good[kind], os.path.join(d, f"{kind}_good.pt"))
        for tag, group in (("bad", cases), ("allowed", allowed)):
            for case in group:
                torch.save(case.apply(copy.deepcopy(good[kind])),
                           os.path.join(d, f"{kind}_{case.name}.pt"))
                names = case.names if case.cpp_names is None else case.cpp_names
                lines.append(f"{kind}\t{tag}\t{case.name}\t{'|'.join(names)}")
    with open(os.path.join(d, "index.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


#: (devices, t0 per param or None): cpu and meta, the devices every machine has.
SPLIT_CASES = [
    (["meta", "cpu", "meta", "cpu"], None),
    (["cpu", "meta", "cpu", "cpu", "meta"], [2.0, 2.0, 5.0, 2.0, 7.0]),
    (["cpu", "cpu", "cpu", "cpu"], [float("inf"), 0.0, float("inf"), 0.0]),
    (["meta", "meta", "cpu"], [3.0, 1.0, 3.0]),
]
SPLIT_DEVICES = ["cpu", "meta"]


def split_reference(out):
    from torchext.optim._state import ParamGroupSlots, StateMap, Generation
    ref = {"num_cases": torch.tensor(len(SPLIT_CASES))}
    for c, (devices, t0s) in enumerate(SPLIT_CASES):
        params = [torch.nn.Parameter(torch.zeros(1, device=d)) for d in devices]
        group = {"params": params, "fused": None, "differentiable": False, "t0": 1.0,
                 "t0_per_param": t0s}
        slots = ParamGroupSlots(group, StateMap(Generation()), 0)
        pre = f"case{c}/"
        ref[pre + "devices"] = torch.tensor([SPLIT_DEVICES.index(d) for d in devices])
        ref[pre + "t0s"] = torch.tensor([1.0] * len(devices) if t0s is None else t0s,
                                        dtype=torch.float64)
        ref[pre + "num_groups"] = torch.tensor(len(slots.slot_groups))
        for k, sg in enumerate(slots.slot_groups):
            ref[pre + f"group{k}/device"] = torch.tensor(SPLIT_DEVICES.index(sg.device.type))
            ref[pre + f"group{k}/t0"] = torch.tensor(1.0 if sg.t0 is None else sg.t0,
                                                     dtype=torch.float64)
            ref[pre + f"group{k}/idx"] = torch.tensor(
                [next(i for i, p in enumerate(params) if p is q) for q in sg.params])
    torch.save(ref, os.path.join(out, "split_ref.pt"))


def main(argv):
    out = argv[1] if len(argv) > 1 else os.path.join(os.getcwd(), "cpp_ref")
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    asgd_reference(out)
    scaler_reference(out)
    amp_protocol_reference(out)
    clip_reference(out)
    unfused_reference(out)
    low_precision_reference(out)
    stochastic_rounding_reference(out)
    split_reference(out)
    update_scale_reference(out)
    corrupt_reference(out)
    torchscript_reference(out)
    checkpoint_reference(out)
    if "--no-aoti" not in argv:
        # A failure here fails the whole run (and so ctest's AOTInductor test).
        aoti_reference(out)
    print(f"make_reference: wrote {out}")


if __name__ == "__main__":
    main(sys.argv)
