"""ASGD step: torchext (fused op) vs torch.optim.ASGD (foreach and for-loop),
vs torch's fused SGD with momentum (same 20 B/element traffic), and vs the
memory-bandwidth bound measured in the same run (the better of a large copy_
and a large in-place add_, see common.py). Also timed in the same rounds: a
torchext GradScaler iteration (``scale``, ``step``, ``update``) around the
same step, whose per-tensor cost cases (e) and (f) show."""
import torch

import torchext

from .common import Result, make_params, table

NAME = "asgd"

#: One entry per case: name -> (tensors, elements per tensor, dtype). A new
#: case is one more line here; --quick runs 10x fewer tensors of each.
CASES = {
    "(a) 200 x 50k fp32": (200, 50_000, torch.float32),
    "(b) 1000 x 1k fp32": (1000, 1_000, torch.float32),
    "(c) 10 x 5M fp32": (10, 5_000_000, torch.float32),
    "(d) 200 x 50k bf16": (200, 50_000, torch.bfloat16),
    # Many small tensors: the per-tensor host cost of the whole opt.step().
    "(e) 10000 x 100 fp32": (10_000, 100, torch.float32),
    "(f) 1000 x 1000 fp32": (1000, 1_000, torch.float32),
    "(g) 200 x 50k fp16": (200, 50_000, torch.float16),
}


def _stepper(env, factory, n, size, dtype):
    params = make_params(n, size, dtype, env.device)
    opt = factory(params)
    opt.step()  # state created outside the timing
    return opt.step


def _scaler_iteration(env, factory, n, size, dtype):
    # The scale is 1.0 with a huge growth interval: the same iteration every time.
    opt = factory(make_params(n, size, dtype, env.device))
    scaler = torchext.amp.GradScaler(init_scale=1.0, growth_interval=10**9)
    loss = torch.ones((), device=env.device)

    def iteration():
        scaler.scale(loss)
        scaler.step(opt)
        scaler.update()

    iteration()  # state and scale created outside the timing
    return iteration


def run_case(env, name):
    n, size, dtype = CASES[name]
    if env.quick:
        n = max(n // 10, 1)
    kw = dict(lr=1e-3, t0=0)  # averaging on: the full update runs
    factories = {
        "torchext": lambda p: torchext.optim.ASGD(p, **kw),
        "torch foreach": lambda p: torch.optim.ASGD(p, foreach=True, **kw),
        "torch for-loop": lambda p: torch.optim.ASGD(p, foreach=False, **kw),
        "fused SGD": lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, fused=True),
    }
    # Timed in turns, one step of each setup per round (see timeit_interleaved).
    low = dtype in (torch.float16, torch.bfloat16)
    if low:  # ax in the parameter's dtype: torch's layout, and torchext's before issue 47
        factories["torchext, ax in param dtype"] = lambda p: torchext.optim.ASGD(
            p, average_dtype=None, **kw)
        factories["torchext, stochastic rounding"] = lambda p: torchext.optim.ASGD(
            p, stochastic_rounding=True, **kw)
    fns = {k: _stepper(env, f, n, size, dtype) for k, f in factories.items()}
    fns["torchext + GradScaler"] = _scaler_iteration(env, factories["torchext"], n, size, dtype)
    seconds = env.time_interleaved(fns)
    elem_bytes = torch.empty((), dtype=dtype).element_size()
    ax_bytes = 4 if low else elem_bytes  # a float32 average for fp16/bf16 parameters
    moved = (3 * elem_bytes + 2 * ax_bytes) * n * size  # read p, g, ax; write p, ax
    return Result.from_seconds(NAME, name, seconds, bytes_moved=moved, env=env,
                               extra={"tensors": n, "numel": size, "dtype": str(dtype)})


def cases(env):
    return list(CASES)


def report(env, results):
    rows = [[r.case, f"{r.ms['torchext']:.2f}",
             f"{r.ms['torchext'] * 1e3 / r.extra['tensors']:.2f}",
             f"{r.ms['torchext + GradScaler'] * 1e3 / r.extra['tensors']:.2f}",
             f"{r.speedup['torch foreach']:.2f}x", f"{r.speedup['torch for-loop']:.2f}x",
             f"{r.ms['fused SGD']:.2f}", f"{r.speedup['fused SGD']:.2f}x",
             f"{r.bandwidth_fraction * 100:.0f}%"]
            for r in results]
    return "\n".join([
        env.header(),
        table(["shape", "torchext ms", "us/tensor", "us/tensor with GradScaler",
               "vs torch foreach", "vs torch for-loop", "fused SGD ms", "vs fused SGD",
               "of bandwidth bound"], rows),
        "ratios > 1x: torchext is faster; each time is a whole opt.step() (with GradScaler: "
        "scale + step + update). Bandwidth: read p, g, ax and write p, ax per element "
        "(ax float32 for fp16/bf16: 14 B/element for bf16).",
        *[f"{r.case}: ax in the param's dtype (average_dtype=None) "
          f"{r.ms['torchext, ax in param dtype']:.2f} ms, the float32 average "
          f"{r.ms['torchext'] / r.ms['torchext, ax in param dtype']:.2f}x its time"
          for r in results if "torchext, ax in param dtype" in r.ms],
        *[f"{r.case}: stochastic rounding "
          f"{r.ms['torchext, stochastic rounding']:.2f} ms, "
          f"{r.ms['torchext, stochastic rounding'] / r.ms['torchext']:.2f}x round to nearest"
          for r in results if "torchext, stochastic rounding" in r.ms],
    ])
