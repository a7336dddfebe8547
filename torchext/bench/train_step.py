"""A whole training step of a small MLP (autocast: bf16 on CPU, fp16 on CUDA):
torchext compiled with torch.compile(fullgraph=True) vs torchext eager, and
vs torch's best compiled setup (compiled model, torch.optim.ASGD.step compiled
without fullgraph, torch.amp.GradScaler in eager). All in one process, as
ratios. Compiling dominates a --quick run (tens of seconds on 2 cores)."""
import copy

import torch

import torchext

from .common import Result, table

NAME = "compile"
CASE = "MLP 128-512-512-10, batch 64"


def cases(env):
    return [CASE]


def _autocast(device):
    dtype = torch.bfloat16 if device.type == "cpu" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def run_case(env, name):
    device = torch.device(env.device)
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 10)).to(device)
    x = torch.randn(64, 128, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def make_step(model, opt, scaler):
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            with _autocast(device):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return loss.detach()
        return step

    def torchext_step():
        model = copy.deepcopy(base)
        opt = torchext.optim.ASGD(model.parameters(), lr=torch.tensor(0.01, device=device),
                                  t0=10)
        return make_step(model, opt, torchext.amp.GradScaler(init_scale=2.0**10))

    def torch_compiled_step():
        model = torch.compile(copy.deepcopy(base))
        opt = torch.optim.ASGD(model.parameters(), lr=torch.tensor(0.01, device=device), t0=10)
        eager_opt_step = opt.step

        @torch.compile  # torch's recipe for its optimizers: not fullgraph
        def compiled_opt_step():
            eager_opt_step()

        # GradScaler.step(opt) calls opt.step(): route it to the compiled one.
        opt.step = lambda *args, **kwargs: compiled_opt_step()
        return make_step(model, opt, torch.amp.GradScaler(device.type, init_scale=2.0**10))

    warm = dict(warmup=2 if env.quick else 5, repeat=10 if env.quick else 50)
    # torch's setup first: trace_autograd_ops (needed for torchext's in-graph
    # backward) makes Dynamo fail on torch.optim.ASGD.step.
    torch_best = torch_compiled_step()
    t_torch = env.time(lambda: torch_best(x, y), **warm)
    old = torch._dynamo.config.trace_autograd_ops
    torch._dynamo.config.trace_autograd_ops = True  # backward inside the graph
    try:
        eager = torchext_step()
        compiled = torch.compile(torchext_step(), fullgraph=True)
        t_eager = env.time(lambda: eager(x, y), **warm)
        t_comp = env.time(lambda: compiled(x, y), **warm)
    finally:
        torch._dynamo.config.trace_autograd_ops = old
    t_torch = min(t_torch, env.time(lambda: torch_best(x, y), **{**warm, "warmup": 2}))
    return Result.from_seconds(NAME, name, {
        "torchext, torch.compile(fullgraph=True)": t_comp,
        "torchext, eager": t_eager,
        "torch: compiled model + compiled opt.step, eager scaler": t_torch,
    })


def report(env, results):
    lines = []
    for r in results:
        (ours, ours_ms), *others = r.ms.items()
        rows = [[ours, f"{ours_ms:.2f}", "1.00x"]]
        rows += [[k, f"{ms:.2f}", f"{r.speedup[k]:.2f}x"] for k, ms in others]
        lines += [f"{r.case}, {env.device}, {torch.get_num_threads()} threads, "
                  f"torch {torch.__version__}",
                  table(["setup", "ms / step", "compiled torchext speed-up"], rows)]
    return "\n".join(lines)
