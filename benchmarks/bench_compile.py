"""A whole training step of a small MLP on CPU (bf16 autocast): torchext
compiled with torch.compile(fullgraph=True) vs torchext eager, and vs torch's
best compiled setup (compiled model, torch.optim.ASGD.step compiled without
fullgraph, torch.amp.GradScaler in eager). All in one process, as ratios.

    python benchmarks/bench_compile.py
"""
import copy

import torch

import torchext
from common import table, timeit


def main():
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 10))
    x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def torchext_step_fn():
        model = copy.deepcopy(base)
        opt = torchext.optim.ASGD(model.parameters(), lr=torch.tensor(0.01), t0=10)
        scaler = torchext.amp.GradScaler(init_scale=2.0**10)

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return loss.detach()
        return step

    def torch_compiled_step_fn():
        model = torch.compile(copy.deepcopy(base))
        opt = torch.optim.ASGD(model.parameters(), lr=torch.tensor(0.01), t0=10)

        eager_opt_step = opt.step

        @torch.compile  # torch's recipe for its optimizers: not fullgraph
        def compiled_opt_step():
            eager_opt_step()

        # GradScaler.step(opt) calls opt.step(): route it to the compiled one.
        opt.step = lambda *args, **kwargs: compiled_opt_step()
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return loss.detach()
        return step

    # torch's setup first: trace_autograd_ops (needed for torchext's
    # in-graph backward) makes Dynamo fail on torch.optim.ASGD.step.
    torch_best = torch_compiled_step_fn()
    t_torch = timeit(lambda: torch_best(x, y), warmup=5, repeat=50)
    torch._dynamo.config.trace_autograd_ops = True  # backward inside the graph
    eager = torchext_step_fn()
    compiled = torch.compile(torchext_step_fn(), fullgraph=True)
    t_eager = timeit(lambda: eager(x, y), warmup=5, repeat=50)
    t_comp = timeit(lambda: compiled(x, y), warmup=5, repeat=50)
    t_torch = min(t_torch, timeit(lambda: torch_best(x, y), warmup=2, repeat=50))
    print(f"MLP 128-512-512-10, batch 64, CPU, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}")
    print(table(["setup", "ms / step", "compiled torchext speed-up"], [
        ["torchext, torch.compile(fullgraph=True)", f"{t_comp * 1e3:.2f}", "1.00x"],
        ["torchext, eager", f"{t_eager * 1e3:.2f}", f"{t_eager / t_comp:.2f}x"],
        ["torch: compiled model + compiled opt.step, eager scaler", f"{t_torch * 1e3:.2f}",
         f"{t_torch / t_comp:.2f}x"],
    ]))


if __name__ == "__main__":
    main()
