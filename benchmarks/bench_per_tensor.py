"""Per-tensor host cost of one step with thousands of small tensors, the
cases (e) 10000 x 100 and (f) 1000 x 1000 fp32 of `torchext bench`: a plain
``opt.step()`` and a GradScaler iteration (``scale``, ``step``, ``update``)
with torchext's classes, next to torch's fused SGD (momentum) timed in the
same rounds, so the ratio survives a noisy machine. Prints one JSON line.

    python benchmarks/bench_per_tensor.py [--rounds 60]

To compare two builds, run it alternately from each checkout (a process
loads one torchext library) and compare the ratios and medians.
"""
import argparse
import json
import statistics
import time

import torch

import torchext

CASES = {"e": (10_000, 100), "f": (1000, 1000)}


def params(n, size):
    g = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(size, generator=g)) for _ in range(n)]
    for p in ps:
        p.grad = torch.randn(size, generator=g) * 1e-3
    return ps


def setups(n, size):
    out = {}
    opt = torchext.optim.ASGD(params(n, size), lr=1e-3, t0=0)
    out["step"] = opt.step
    opt_a = torchext.optim.ASGD(params(n, size), lr=1e-3, t0=0)
    scaler = torchext.amp.GradScaler(init_scale=1.0, growth_interval=10**9)
    loss = torch.ones(())

    def amp_step():
        scaler.scale(loss)
        scaler.step(opt_a)
        scaler.update()
    out["amp"] = amp_step
    sgd = torch.optim.SGD(params(n, size), lr=1e-3, momentum=0.9, fused=True)
    out["fused SGD"] = sgd.step
    for fn in out.values():
        fn()  # state exists before timing
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args()
    result = {"torchext": torchext.__file__, "torch": torch.__version__,
              "threads": torch.get_num_threads()}
    for case, (n, size) in CASES.items():
        fns = setups(n, size)
        samples = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                samples[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in samples.items()}
        best = {k: min(v) for k, v in samples.items()}
        result[case] = {
            "us_per_tensor_median": {k: round(v * 1e6 / n, 3) for k, v in med.items()},
            "us_per_tensor_min": {k: round(v * 1e6 / n, 3) for k, v in best.items()},
            "speedup_vs_fused_sgd": {k: round(med["fused SGD"] / med[k], 2)
                                     for k in ("step", "amp")},
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
