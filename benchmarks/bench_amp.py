"""GradScaler step + update: torchext (read-only check + one fused ASGD pass
that unscales on the fly) vs torch.amp.GradScaler + torch.optim.ASGD, and vs
torch's own sync-free path (torch.amp.GradScaler + fused SGD with momentum),
all in one process, plus the bandwidth bound (24 B per fp32 element: a 4 B
read for the check, then 20 B for the update).

    python benchmarks/bench_amp.py [--device cpu|cuda] [--quick]

The scale is 1.0 (with a huge growth interval) so that unscaling in place
leaves torch's gradients unchanged from one repetition to the next; the
memory traffic is the same as with any other scale.
"""
import argparse

import torch

import torchext
from bench_asgd import make_params
from common import bandwidth, table, timeit


def bench(opt_factory, scaler_factory, n, size, dtype, device):
    params = make_params(n, size, dtype, device)
    opt = opt_factory(params)
    scaler = scaler_factory()
    loss = torch.ones((), device=device)

    def iteration():
        scaler.scale(loss)
        scaler.step(opt)
        scaler.update()

    iteration()  # state and scale exist before timing
    return timeit(iteration)


def run(device, quick):
    bw, bw_copy, bw_add = bandwidth(device)
    n, size = (20 if quick else 200), 50_000
    skw = dict(init_scale=1.0, growth_interval=10**9)
    akw = dict(lr=1e-3, t0=0)
    t_ours = bench(lambda p: torchext.optim.ASGD(p, **akw),
                   lambda: torchext.amp.GradScaler(**skw), n, size, torch.float32, device)
    t_torch = bench(lambda p: torch.optim.ASGD(p, **akw),
                    lambda: torch.amp.GradScaler(device, **skw), n, size, torch.float32, device)
    t_torch_loop = bench(lambda p: torch.optim.ASGD(p, foreach=False, **akw),
                         lambda: torch.amp.GradScaler(device, **skw), n, size, torch.float32,
                         device)
    t_sgd = bench(lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, fused=True),
                  lambda: torch.amp.GradScaler(device, **skw), n, size, torch.float32, device)
    moved = 24 * n * size
    print(f"device: {device}, threads: {torch.get_num_threads()}, torch {torch.__version__}, "
          f"bandwidth bound {bw / 1e9:.1f} GB/s (copy_ {bw_copy / 1e9:.1f}, in-place add_ "
          f"{bw_add / 1e9:.1f}; 512 MiB arrays)")
    rows = [
        ["torchext GradScaler + ASGD (fused)", f"{t_ours * 1e3:.2f}", "1.00x",
         f"{moved / t_ours / bw * 100:.0f}%"],
        ["torch GradScaler + ASGD (foreach)", f"{t_torch * 1e3:.2f}",
         f"{t_torch / t_ours:.2f}x", ""],
        ["torch GradScaler + ASGD (for-loop)", f"{t_torch_loop * 1e3:.2f}",
         f"{t_torch_loop / t_ours:.2f}x", ""],
        ["torch GradScaler + SGD(momentum, fused)", f"{t_sgd * 1e3:.2f}",
         f"{t_sgd / t_ours:.2f}x", ""],
    ]
    print(f"scale + step + update, {n} x {size // 1000}k fp32")
    print(table(["setup", "ms", "torchext speed-up", "of bandwidth bound"], rows))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    run(args.device, args.quick)
