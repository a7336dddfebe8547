"""GradScaler step + update: torchext (read-only check + one fused ASGD pass
that unscales on the fly) vs torch.amp.GradScaler + torch.optim.ASGD, and vs
torch's own sync-free path (torch.amp.GradScaler + fused SGD with momentum),
all in one process, plus the bandwidth bound (24 B per fp32 element: a 4 B
read for the check, then 20 B for the update).

The scale is 1.0 (with a huge growth interval) so that unscaling in place
leaves torch's gradients unchanged from one repetition to the next; the
memory traffic is the same as with any other scale."""
import torch

import torchext

from .common import Result, make_params, ratio_rows, table

NAME = "amp"
SIZE = 50_000


def _time_iteration(env, opt_factory, scaler_factory, n):
    params = make_params(n, SIZE, torch.float32, env.device)
    opt = opt_factory(params)
    scaler = scaler_factory()
    loss = torch.ones((), device=env.device)

    def iteration():
        scaler.scale(loss)
        scaler.step(opt)
        scaler.update()

    iteration()  # state and scale exist before timing
    return env.time(iteration)


def cases(env):
    return [f"{20 if env.quick else 200} x {SIZE // 1000}k fp32"]


def run_case(env, name):
    n = int(name.split()[0])
    device = env.device
    skw = dict(init_scale=1.0, growth_interval=10**9)
    akw = dict(lr=1e-3, t0=0)
    setups = {
        "torchext GradScaler + ASGD (fused)": (lambda p: torchext.optim.ASGD(p, **akw),
                                               lambda: torchext.amp.GradScaler(**skw)),
        "torch GradScaler + ASGD (foreach)": (lambda p: torch.optim.ASGD(p, **akw),
                                              lambda: torch.amp.GradScaler(device, **skw)),
        "torch GradScaler + ASGD (for-loop)": (
            lambda p: torch.optim.ASGD(p, foreach=False, **akw),
            lambda: torch.amp.GradScaler(device, **skw)),
        "torch GradScaler + SGD(momentum, fused)": (
            lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, fused=True),
            lambda: torch.amp.GradScaler(device, **skw)),
    }
    seconds = {k: _time_iteration(env, o, s, n) for k, (o, s) in setups.items()}
    return Result.from_seconds(NAME, name, seconds, bytes_moved=24 * n * SIZE, env=env)


def report(env, results):
    lines = [env.header()]
    for r in results:
        rows = ratio_rows(r)
        lines += [f"scale + step + update, {r.case}",
                  table(["setup", "ms", "torchext speed-up", "of bandwidth bound"], rows)]
    return "\n".join(lines)
