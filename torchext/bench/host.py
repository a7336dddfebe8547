"""The host cost of one whole step (issue 37): what the CPU spends around
the arithmetic, measured on tiny CPU tensors (4 elements) with 1 thread, so
that nearly all of a step's time is Python, the dispatcher, the kernels'
argument checks and plans, and allocations (the same work a CUDA step does
on the host before its launches).

Two pairs, each pair's setups timed in turns in one process (one call of
each per round, medians; see ``timeit_interleaved``):

* ``opt.step()``: torchext's ASGD against torch's ``SGD(momentum=0.9,
  fused=True)`` (torch's cheapest fused step on the host);
* ``scale -> step -> update``: ``scaler.scale(loss)``, ``scaler.step(opt)``,
  ``scaler.update()`` of torchext's GradScaler + ASGD against
  ``torch.amp.GradScaler`` + the same fused SGD.

At 1 tensor a case is the fixed cost of a step; the per-tensor cost is the
slope from 1 tensor to N. Targets (issue 37), at 1 and 200 tensors:
``opt.step()`` at most 0.5x torch's time, ``scale -> step -> update`` at most
0.4x. The scale is 1.0 with a huge growth interval, so every iteration is the
same. Runs on the CPU only (``--device cpu``, or the CPU run of ``all``)."""
import torch

import torchext

from .common import Result, make_params, table

NAME = "host"
NUMEL = 4
TENSORS = (1, 200, 1000, 10000)
KINDS = ("opt.step()", "scale -> step -> update")
#: Upper bounds of torchext's time / torch's, at these tensor counts.
TARGETS = {"opt.step()": 0.5, "scale -> step -> update": 0.4}
TARGET_TENSORS = (1, 200)


def _tensors(env, n):
    return n if n == 1 or not env.quick else n // 10


def cases(env):
    if torch.device(env.device).type != "cpu":
        return []
    return [f"{kind} x {n}" for kind in KINDS for n in TENSORS]


def _asgd(params):
    return torchext.optim.ASGD(params, lr=1e-3, t0=0)


def _sgd(params):
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, fused=True)


def _scaler_iteration(opt, scaler):
    loss = torch.ones(())

    def iteration():
        scaler.scale(loss)
        scaler.step(opt)
        scaler.update()

    return iteration


def setups(kind, n):
    """{setup: callable}, torchext's first, each called once already (state
    and scale created outside the timing)."""
    skw = dict(init_scale=1.0, growth_interval=10**9)
    if kind == "opt.step()":
        fns = {"torchext ASGD": _asgd(make_params(n, NUMEL, torch.float32, "cpu")).step,
               "torch fused SGD": _sgd(make_params(n, NUMEL, torch.float32, "cpu")).step}
    else:
        fns = {"torchext GradScaler + ASGD": _scaler_iteration(
                   _asgd(make_params(n, NUMEL, torch.float32, "cpu")),
                   torchext.amp.GradScaler(**skw)),
               "torch GradScaler + fused SGD": _scaler_iteration(
                   _sgd(make_params(n, NUMEL, torch.float32, "cpu")),
                   torch.amp.GradScaler("cpu", **skw))}
    for fn in fns.values():
        fn()
    return fns


def run_case(env, name):
    kind, n = name.rsplit(" x ", 1)
    n = _tensors(env, int(n))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fns = setups(kind, n)
        rounds = max(10, 200 // n) if env.quick else max(100, 4000 // n)
        seconds = env.time_interleaved(fns, repeat=rounds, min_time=0)
    finally:
        torch.set_num_threads(threads)
    return Result.from_seconds(NAME, name, seconds,
                               extra={"kind": kind, "tensors": n, "numel": NUMEL})


def report(env, results):
    fixed = {r.extra["kind"]: r for r in results if r.extra["tensors"] == 1}
    rows = []
    for r in results:
        (ours, ours_ms), (theirs, their_ms) = r.ms.items()
        n = r.extra["tensors"]
        ratio = ours_ms / their_ms
        target = TARGETS[r.extra["kind"]]
        base = fixed.get(r.extra["kind"])
        per_tensor = ("" if n == 1 or base is None else
                      " / ".join(f"{(r.ms[k] - base.ms[k]) * 1e3 / (n - 1):.3f}"
                                 for k in (ours, theirs)))
        met = ("" if n not in TARGET_TENSORS else
               f"<= {target}x: {'met' if ratio <= target else 'NOT met'}")
        rows.append([r.extra["kind"], n, f"{ours_ms * 1e3:.1f}", f"{their_ms * 1e3:.1f}",
                     f"{ratio:.2f}x", per_tensor, met])
    names = {k: list(r.ms) for r in results for k in [r.extra["kind"]]}
    legend = "; ".join(f"{kind}: {a} vs {b}" for kind, (a, b) in names.items())
    return "\n".join([
        f"host cost of one step: tiny CPU tensors ({NUMEL} elements), 1 thread, torch "
        f"{torch.__version__}, setups timed in turns (medians)",
        table(["step", "tensors", "torchext us", "torch us", "torchext / torch",
               "us per extra tensor (torchext / torch)", "target"], rows),
        legend,
    ])


def ranges(repeat=3, quick=False):
    """Every case measured ``repeat`` times in this process (the runs one
    after another): {case: (list of torchext us, list of torch us)}."""
    from .common import Env
    env = Env("cpu", quick)
    out = {}
    for _ in range(repeat):
        for name in cases(env):
            (a, b) = run_case(env, name).ms.values()
            us = out.setdefault(name, ([], []))
            us[0].append(a * 1e3)
            us[1].append(b * 1e3)
    return out


def main(argv=None):
    """``python -m torchext.bench.host [--repeat 3]``: the table of
    docs/benchmarks.md, as ranges (min-max) over repeated runs."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m torchext.bench.host")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for name, (ours, theirs) in ranges(args.repeat, args.quick).items():
        ratios = [a / b for a, b in zip(ours, theirs)]
        rows.append([name, f"{min(ours):.1f}-{max(ours):.1f}", f"{min(theirs):.1f}-{max(theirs):.1f}",
                     f"{min(ratios):.2f}-{max(ratios):.2f}x"])
    print(f"{args.repeat} runs, torch {torch.__version__}, 1 thread, {NUMEL}-element tensors")
    print(table(["case", "torchext us", "torch us", "torchext / torch"], rows))


if __name__ == "__main__":
    main()
