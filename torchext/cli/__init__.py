"""``python -m torchext`` (also the ``torchext`` console script):

    info                      what was built, and whether it covers this machine's GPU
    check [--device D]        every op against torch's math on each device (pass/fail table)
    bench [--device D] [--quick] [--only NAMES] [--plot out.png] [--json out.json]
"""
import argparse
import json
import sys

import torch


def _devices(choice):
    """The devices to run on, or (None, message) when the choice is impossible."""
    import torchext
    gpu = torch.cuda.is_available()
    if choice == "cpu":
        return ["cpu"], None
    if not gpu or not torchext.has_cuda_kernels():
        why = ("no CUDA GPU is visible to torch (torch.cuda.is_available() is False"
               + ("; torch is a CPU-only build" if torch.version.cuda is None else "") + ")"
               if not gpu else
               "torchext was built without CUDA kernels: rebuild with TORCHEXT_CUDA=1 "
               "pip install --no-build-isolation -e .")
        if choice == "cuda":
            return None, f"--device cuda: {why}"
        print(f"cuda: skipped, {why}")
        return ["cpu"], None
    return (["cuda"] if choice == "cuda" else ["cpu", "cuda"]), None


def cmd_info(args):
    from .info import info_text
    print(info_text())
    return 0


def cmd_check(args):
    from .check import exit_code, format_table, run_checks
    devices, error = _devices(args.device)
    if error:
        print(f"torchext check: {error}", file=sys.stderr)
        return 2
    outcomes = run_checks(devices, seed=args.seed)
    print(format_table(outcomes))
    return exit_code(outcomes)


def _progress_factory():
    """A tqdm bar factory, or None (said once) when tqdm is missing."""
    try:
        from tqdm import tqdm
    except ImportError:
        print("(no progress bar: tqdm is not installed; pip install torchext[bench])",
              file=sys.stderr)
        return None
    return lambda total: tqdm(total=total, unit="case", file=sys.stderr, leave=False,
                              dynamic_ncols=True)


def cmd_bench(args):
    from .. import bench
    names = args.only.split(",") if args.only else list(bench.BENCHMARKS)
    unknown = [n for n in names if n not in bench.BENCHMARKS]
    if unknown:
        print(f"torchext bench: unknown benchmark {', '.join(unknown)} "
              f"(choose from {', '.join(bench.BENCHMARKS)})", file=sys.stderr)
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("torchext bench: --plot needs matplotlib, which is not installed: "
                  "pip install torchext[bench] (or pip install matplotlib)", file=sys.stderr)
            return 2
    devices, error = _devices(args.device)
    if error:
        print(f"torchext bench: {error}", file=sys.stderr)
        return 2
    progress = _progress_factory()
    runs = []
    for device in devices:
        env, results = bench.run(device, names, args.quick, progress)
        runs.append((env, results))
        print(bench.reports(env, results), flush=True)
        print()
    doc = bench.to_json(runs, args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        from ..bench.plot import plot
        plot(doc, args.plot)
        print(f"wrote {args.plot}")
    return 0


def parser():
    ap = argparse.ArgumentParser(
        prog="python -m torchext",
        description="torchext's command line: build info, a correctness check of every op "
                    "on this machine, and the ratio benchmarks.")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="the build, the GPU it covers, library and CMake paths") \
        .set_defaults(fn=cmd_info)
    dev = dict(choices=["cpu", "cuda", "all"], default="all",
               help="where to run (default: all, i.e. CPU and the GPU if there is one)")
    p = sub.add_parser("check", help="run every op against torch's reference math")
    p.add_argument("--device", **dev)
    p.add_argument("--seed", type=int, default=0, help="random shapes and values (default 0)")
    p.set_defaults(fn=cmd_check)
    p = sub.add_parser("bench", help="ratio benchmarks (ASGD step, GradScaler, compiled step)")
    p.add_argument("--device", **dev)
    p.add_argument("--quick", action="store_true",
                   help="10x fewer tensors, 64 MiB bandwidth arrays, few repeats (smoke run)")
    p.add_argument("--only", metavar="NAMES",
                   help="comma-separated subset of: asgd, amp, compile, gpu_targets, host "
                        "(default: all)")
    p.add_argument("--plot", metavar="PNG", help="bar chart of speed-ups and bandwidth "
                   "fractions (needs matplotlib: pip install torchext[bench])")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON (schema: "
                   "torchext.bench module docstring, or docs/benchmarks.md)")
    p.set_defaults(fn=cmd_bench)
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    return args.fn(args)


def main_exit():
    """The `torchext` console script."""
    sys.exit(main())
