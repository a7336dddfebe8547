"""Loads the stable-ABI prototype under the running torch, checks it, and
times it next to torchext's own ops (same process, side by side).

  python prototypes/stable_abi/bench.py [--quick] [--json out.json]

Needs torchext importable (the in-place build or a wheel) and
prototypes/stable_abi/build/torchext_stable.so (build.sh)."""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(HERE, "build", "torchext_stable.so")


def load():
    torch.ops.load_library(LIB)
    return torch.ops.torchext_stable


def reference_asgd(p, g, ax, eta, mu, lambd, wd):
    """torch.optim.ASGD's single-tensor math for float32, with torch's own kernels."""
    g = g.add(p, alpha=wd) if wd else g
    p.mul_(1 - lambd * eta)
    p.add_(g, alpha=-eta)
    if mu != 1:
        ax.add_(p.sub(ax).mul_(mu))
    else:
        ax.copy_(p)


def bit_exact(ops):
    """The prototype's plain loops against torch's kernels, on this process's ISA."""
    torch.manual_seed(0)
    worst = 0
    for n in (17, 1000, 65536 + 13, 1_000_003):
        for mu, wd in ((1.0, 0.0), (0.37, 0.0), (0.37, 1e-2), (1.0, 1e-2)):
            p, g, ax = torch.randn(n), torch.randn(n), torch.randn(n)
            rp, rax = p.clone(), ax.clone()
            reference_asgd(rp, g, rax, 0.0123, mu, 1e-4, wd)
            ops.asgd_fp32_([p], [g], [ax], 0.0123, mu, 1e-4, wd)
            worst = max(worst, int((p != rp).sum()), int((ax != rax).sum()))
    return worst


def timeit_all(cases, reps, warm=2):
    """Best time of each case over `reps` rounds; every round runs every case
    once, in turn, so drift on a shared machine shifts them alike."""
    for fn in cases.values():
        for _ in range(warm):
            fn()
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(reps):
        for k, fn in cases.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--isa-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    ops = load()
    isa = bytes(ops.isa_probe(torch.empty(0)).tolist()).decode()
    if args.isa_only:  # subprocess of the bit-exactness table
        print(json.dumps({"isa": isa, "aten": torch.backends.cpu.get_cpu_capability(),
                          "mismatches": bit_exact(ops)}))
        return
    try:
        import torchext  # noqa: F401  (the current ops, for the side-by-side timings)
        have_torchext = True
    except ImportError as e:
        print(f"(no torchext here, prototype rows only: {str(e)[:120]})", file=sys.stderr)
        have_torchext = False
    res = {"torch": torch.__version__, "threads": torch.get_num_threads(),
           "library built against": "torch 2.13.0 headers, TORCH_TARGET_VERSION 2.13"}

    # 1. opcheck (schema, fake tensor, aliasing) of both prototype ops
    p, g, ax = [torch.randn(5) for _ in range(3)], [torch.randn(5) for _ in range(3)], \
        [torch.randn(5) for _ in range(3)]
    for name, a in (("asgd_fp32_", (p, g, ax, 0.01, 0.5, 1e-4, 0.0)),
                    ("check_finite_", ([torch.randn(4), torch.randn(3)], torch.zeros(1)))):
        r = torch.library.opcheck(getattr(ops, name).default, a)
        res[f"opcheck {name}"] = "pass" if all(v == "SUCCESS" for v in r.values()) else r
    # 2. version bumps: torch's autograd fallback vs torchext's Autograd kernel
    t = torch.randn(10)
    v = t._version
    with torch.no_grad():
        ops.asgd_fp32_([t], [torch.randn(10)], [torch.randn(10)], 0.01, 0.5, 1e-4, 0.0)
    res["version bump (prototype, torch's autograd fallback)"] = t._version - v
    # 3. bit-exact on every ISA this CPU runs (subprocesses: ATEN_CPU_CAPABILITY)
    res["bit_exact"] = {}
    for cap in ("default", "avx2", "avx512"):
        out = subprocess.run([sys.executable, __file__, "--isa-only"], capture_output=True,
                             text=True, env={**os.environ, "ATEN_CPU_CAPABILITY": cap})
        res["bit_exact"][cap] = json.loads(out.stdout) if out.returncode == 0 else out.stderr[-300:]

    reps = 5 if args.quick else 30
    # 4. per-tensor cost: 10000 tensors of 100 float32
    n, size = 10000, 100
    params = [torch.randn(size) for _ in range(n)]
    grads = [torch.randn(size) * 1e-3 for _ in range(n)]
    axs = [p.clone() for p in params]
    found = torch.zeros(1)
    mus, etas, steps = torch.ones(n), torch.full((n,), 0.01), torch.zeros(n)
    x = torch.ops.torchext
    with torch.no_grad():
        cases = {
            "check_finite_ (torchext, c10::List boxed kernel + Autograd kernel)":
                lambda: x.check_finite_(grads, found),
            "check_finite_ (stable ABI prototype)": lambda: ops.check_finite_(grads, found),
            "asgd_.packed (torchext, incl. step/eta/mu schedule)":
                lambda: x.asgd_.packed(params, grads, axs, mus, etas, steps, lr=0.01,
                                       lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0,
                                       maximize=False),
            "asgd_fp32_ (stable ABI prototype, fixed eta/mu)":
                lambda: ops.asgd_fp32_(params, grads, axs, 0.01, 1.0, 1e-4, 0.0),
            "torch.autograd.graph.increment_version(params + axs)":
                lambda: torch.autograd.graph.increment_version(params + axs),
        }
        below = torch._C._AutoDispatchBelowAutograd

        def without_autograd_key(fn):
            def run():
                with below():
                    fn()
            return run
        # The Autograd key's share: torchext's own Autograd kernel vs torch's
        # fallback (stable op), each against the same call dispatched below it.
        cases["check_finite_ (torchext) below Autograd"] = without_autograd_key(
            cases["check_finite_ (torchext, c10::List boxed kernel + Autograd kernel)"])
        cases["check_finite_ (stable) below Autograd"] = without_autograd_key(
            cases["check_finite_ (stable ABI prototype)"])
        cases["asgd_.packed (torchext) below Autograd"] = without_autograd_key(
            cases["asgd_.packed (torchext, incl. step/eta/mu schedule)"])
        cases["asgd_fp32_ (stable) below Autograd"] = without_autograd_key(
            cases["asgd_fp32_ (stable ABI prototype, fixed eta/mu)"])
        cases = {k: f for k, f in cases.items() if have_torchext or "torchext" not in k}
        res["per_tensor_ns (10000 x 100 fp32)"] = {
            k: round(t / n * 1e9, 1) for k, t in timeit_all(cases, reps).items()}
        # 5. bandwidth: one 16M-element float32 tensor, 20 bytes/element moved
        big = 1 << 24
        P, G, A = torch.randn(big), torch.randn(big) * 1e-3, torch.randn(big)
        ms, es, ss = torch.ones(1), torch.full((1,), 0.01), torch.zeros(1)
        src, dst = torch.randn(big * 5 // 2), torch.empty(big * 5 // 2)
        bw = {
            "copy_ (reference, 20 B/elt)": lambda: dst.copy_(src),
            "asgd_.packed (torchext, Vectorized per ISA)":
                lambda: x.asgd_.packed([P], [G], [A], ms, es, ss, lr=0.01, lambd=1e-4,
                                       alpha=0.75, t0=1e6, weight_decay=0.0, maximize=False),
            "asgd_fp32_ (stable prototype, plain loop per ISA)":
                lambda: ops.asgd_fp32_([P], [G], [A], 0.01, 0.5, 1e-4, 0.0),
        }
        bw = {k: f for k, f in bw.items() if have_torchext or "torchext" not in k}
        res["GB/s (16M fp32, 20 B/elt)"] = {
            k: round(20 * big / t / 1e9, 2) for k, t in timeit_all(bw, reps).items()}
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
