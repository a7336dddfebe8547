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


def scaler_data():
    gen = torch.Generator().manual_seed(99)
    w0 = torch.randn(8, generator=gen)
    xs = torch.randn(SCALER_STEPS, 8, generator=gen)
    for s in OVERFLOW_AT:
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)

    @torch.jit.export
    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        # Returns the loss and the list of updated parameters. The list must
        # stay live: TorchScript's alias analysis does not see the writes of
        # a `Tensor(a!)[]` op into the list's elements, so its dead-code
        # elimination drops torchext::asgd_ when none of its lists is used
        # afterwards (the step would silently do nothing).
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
                lr=0.05, lambd=1e-4, alpha=0.75, t0=3.0, weight_decay=1e-3, maximize=False,
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
AOTI_KW = dict(lr=0.05, lambd=1e-3, alpha=0.75, t0=5.0, weight_decay=1e-2, maximize=False)


class ASGDStep(torch.nn.Module):
    """One functional ASGD step: takes the state, returns the new state."""

    def forward(self, p, g, ax, mu, eta, step):
        p, ax, mu, eta, step = p.clone(), ax.clone(), mu.clone(), eta.clone(), step.clone()
        torch.ops.torchext.asgd_([p], [g], [ax], [mu], [eta], [step], **AOTI_KW)
        return p, ax, mu, eta, step


def aoti_reference(out):
    gen = torch.Generator().manual_seed(11)
    p0 = torch.randn(64, 8, generator=gen)
    grads = torch.randn(AOTI_STEPS, 64, 8, generator=gen)
    state0 = (torch.zeros(64, 8), torch.ones(()), torch.full((), AOTI_KW["lr"]), torch.zeros(()))
    # Eager reference: the same op, in place.
    p, (ax, mu, eta, step) = p0.clone(), [t.clone() for t in state0]
    for s in range(AOTI_STEPS):
        torch.ops.torchext.asgd_([p], [grads[s]], [ax], [mu], [eta], [step], **AOTI_KW)
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


def main(argv):
    out = argv[1] if len(argv) > 1 else os.path.join(os.getcwd(), "cpp_ref")
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    asgd_reference(out)
    scaler_reference(out)
    torchscript_reference(out)
    if "--no-aoti" not in argv:
        try:
            aoti_reference(out)
        except Exception as e:  # the C++ test reports this error as an expected failure
            with open(os.path.join(out, "aoti_error.txt"), "w") as f:
                f.write(f"{type(e).__name__}: {e}\n")
            print(f"make_reference: AOTInductor package failed: {type(e).__name__}: {e}",
                  file=sys.stderr)
    print(f"make_reference: wrote {out}")


if __name__ == "__main__":
    main(sys.argv)
