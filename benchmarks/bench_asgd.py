"""ASGD step: torchext (fused op) vs torch.optim.ASGD (foreach and for-loop),
vs torch's fused SGD with momentum (same 20 B/element traffic), and vs the
memory-bandwidth bound measured in the same run (the better of a large copy_
and a large in-place add_, see common.py).

    python benchmarks/bench_asgd.py [--device cpu|cuda] [--quick]

Cases (e) and (f) (run_per_tensor_cases) time the whole `opt.step()` on many
small tensors, where the per-tensor host cost dominates, and print it per
tensor.
"""
import argparse

import torch

import torchext
from common import bandwidth, table, timeit

SHAPES = {
    "(a) 200 x 50k fp32": (200, 50_000, torch.float32),
    "(b) 1000 x 1k fp32": (1000, 1_000, torch.float32),
    "(c) 10 x 5M fp32": (10, 5_000_000, torch.float32),
    "(d) 200 x 50k bf16": (200, 50_000, torch.bfloat16),
}


def make_params(n, size, dtype, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    params = []
    for _ in range(n):
        p = torch.nn.Parameter(torch.randn(size, generator=g).to(device=device, dtype=dtype))
        p.grad = torch.randn(size, generator=g).to(device=device, dtype=dtype) * 1e-3
        params.append(p)
    return params


def bench_opt(factory, n, size, dtype, device):
    params = make_params(n, size, dtype, device)
    opt = factory(params)
    opt.step()  # state created outside the timing
    return timeit(opt.step)


def run(device, quick):
    bw, bw_copy, bw_add = bandwidth(device)
    rows = []
    for name, (n, size, dtype) in SHAPES.items():
        if quick:
            n = max(n // 10, 1)
        kw = dict(lr=1e-3, t0=0)  # averaging on: the full update runs
        t_ours = bench_opt(lambda p: torchext.optim.ASGD(p, **kw), n, size, dtype, device)
        t_foreach = bench_opt(lambda p: torch.optim.ASGD(p, foreach=True, **kw), n, size, dtype,
                              device)
        t_loop = bench_opt(lambda p: torch.optim.ASGD(p, foreach=False, **kw), n, size, dtype,
                           device)
        t_sgd = bench_opt(lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, fused=True), n,
                          size, dtype, device)
        elem_bytes = torch.empty((), dtype=dtype).element_size()
        moved = 5 * elem_bytes * n * size  # read p, g, ax; write p, ax
        rows.append([
            name, f"{t_ours * 1e3:.2f}", f"{t_foreach / t_ours:.2f}x", f"{t_loop / t_ours:.2f}x",
            f"{t_sgd * 1e3:.2f}", f"{t_sgd / t_ours:.2f}x",
            f"{moved / t_ours / bw * 100:.0f}%",
        ])
    print(f"device: {device}, threads: {torch.get_num_threads()}, torch {torch.__version__}, "
          f"bandwidth bound {bw / 1e9:.1f} GB/s (copy_ {bw_copy / 1e9:.1f}, in-place add_ "
          f"{bw_add / 1e9:.1f}; 512 MiB arrays)")
    print(table(["shape", "torchext ms", "vs torch foreach", "vs torch for-loop",
                 "fused SGD ms", "vs fused SGD", "of bandwidth bound"], rows))
    print("ratios > 1x: torchext is faster. Bandwidth: 5 x element size x numel moved per step.")


# Many-tensor cases: the whole opt.step() against torch's fused SGD with
# momentum (the same 20 B/element traffic), per tensor.
PER_TENSOR_SHAPES = {
    "(e) 10000 x 100 fp32": (10_000, 100, torch.float32),
    "(f) 1000 x 1000 fp32": (1000, 1_000, torch.float32),
}


def run_per_tensor_cases(device, quick):
    rows = []
    for name, (n, size, dtype) in PER_TENSOR_SHAPES.items():
        if quick:
            n = max(n // 10, 1)
        t_ours = bench_opt(lambda p: torchext.optim.ASGD(p, lr=1e-3, t0=0), n, size, dtype, device)
        t_sgd = bench_opt(lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, fused=True), n,
                          size, dtype, device)
        rows.append([name, f"{t_ours * 1e6 / n:.2f}", f"{t_sgd * 1e6 / n:.2f}",
                     f"{t_sgd / t_ours:.2f}x"])
    print(table(["shape", "torchext us/tensor", "fused SGD us/tensor", "vs fused SGD"], rows))
    print("whole opt.step(), per parameter tensor; ratio > 1x: torchext is faster.")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="10x fewer tensors (smoke run)")
    args = ap.parse_args()
    run(args.device, args.quick)
    run_per_tensor_cases(args.device, args.quick)
