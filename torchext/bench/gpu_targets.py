"""The GPU step against the memory-bandwidth bound, at the sizes and with the
targets of issue 29 (CUDA only; nothing runs elsewhere): the eager
``opt.step()`` at 200 x 50k fp32 (target 60% of the bound) and 100 x 4M fp32
(90%), and the same 200 x 50k step with ``capturable=True`` captured in a
CUDA graph and replayed (85%).

Unlike the interleaved cases of ``asgd`` (one synchronized call at a time,
beside torch's setups), each case here runs many steps back to back with one
synchronization at the end, as a training loop does: the host's work for a
step overlaps the device's work for the one before, so what is measured is
whichever of the two is the bottleneck."""
import time

import torch

import torchext

from .common import Result, make_params, table

NAME = "gpu_targets"

#: name -> (tensors, elements per tensor, captured in a CUDA graph, target
#: fraction of the bandwidth bound).
CASES = {
    "eager 200 x 50k fp32": (200, 50_000, False, 0.60),
    "CUDA graph 200 x 50k fp32 (capturable)": (200, 50_000, True, 0.85),
    "eager 100 x 4M fp32": (100, 4_000_000, False, 0.90),
}


def _per_step(fn, steps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def run_case(env, name):
    n, size, captured, target = CASES[name]
    if env.quick:
        n = max(n // 10, 1)
    params = make_params(n, size, torch.float32, env.device)
    if captured:
        opt = torchext.optim.ASGD(params, lr=torch.tensor(1e-3, device=env.device), t0=0,
                                  capturable=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # state created before the capture
            for _ in range(3):
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            opt.step()
        fn = graph.replay
    else:
        opt = torchext.optim.ASGD(params, lr=1e-3, t0=0)
        opt.step()
        fn = opt.step
    seconds = _per_step(fn, 20 if env.quick else 200)
    moved = 5 * 4 * n * size  # read p, g, ax; write p, ax
    return Result.from_seconds(NAME, name, {"torchext": seconds}, bytes_moved=moved, env=env,
                               extra={"tensors": n, "numel": size, "target": target})


def cases(env):
    return list(CASES) if str(env.device).startswith("cuda") else []


def report(env, results):
    rows = [[r.case, f"{r.ms['torchext']:.3f}",
             f"{r.ms['torchext'] * 1e3 / r.extra['tensors']:.2f}",
             f"{r.bandwidth_fraction * 100:.0f}%", f"{r.extra['target'] * 100:.0f}%",
             "yes" if r.bandwidth_fraction >= r.extra["target"] else "no"]
            for r in results]
    return "\n".join([
        env.header(),
        table(["case", "ms/step", "us/tensor", "of bandwidth bound", "target", "met"], rows),
        "steps back to back, one synchronization at the end (as in training). Bandwidth: "
        "20 bytes per fp32 element per step.",
    ])
