"""Timing and reporting helpers for torchext's ratio benchmarks: everything is
timed in one process, side by side, and reported as ratios (absolute times on
shared machines drift; ratios measured together do not)."""
import dataclasses
import statistics
import time

import torch

# Timing settings: full runs take a stable median; --quick only smoke-tests.
FULL = dict(warmup=3, repeat=15, min_time=0.2)
QUICK = dict(warmup=1, repeat=5, min_time=0.02)


def timing(quick):
    return QUICK if quick else FULL


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timeit(fn, warmup=3, repeat=15, min_time=0.2, device="cpu"):
    """Median seconds per call of fn() (synchronizing the device around each)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    samples = []
    start = time.perf_counter()
    while len(samples) < repeat or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - t0)
        if len(samples) >= 200:
            break
    return statistics.median(samples)


def timeit_interleaved(fns, warmup=3, repeat=15, min_time=0.2, device="cpu"):
    """{name: median seconds per call} of several callables timed in turns
    (one call of each per round), so that a machine getting slower or faster
    during the run shifts every setup alike and their ratios stay fair."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    _sync(device)
    samples = {k: [] for k in fns}
    start = time.perf_counter()
    rounds = 0
    while rounds < repeat or (time.perf_counter() - start < min_time * len(fns) and rounds < 200):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            _sync(device)
            samples[k].append(time.perf_counter() - t0)
        rounds += 1
    return {k: statistics.median(v) for k, v in samples.items()}


def copy_bandwidth(device="cpu", nbytes=512 * 2**20, quick=False):
    """Bytes per second of a large copy_ (it reads and writes nbytes each)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = timeit(lambda: dst.copy_(src), **{**timing(quick), "repeat": 10}, device=device)
    return 2 * nbytes / t


def inplace_bandwidth(device="cpu", nbytes=512 * 2**20, quick=False):
    """Bytes per second of a large in-place a.add_(b) (reads a and b, writes
    a). An optimizer step writes only lines it has just read, like this; a
    copy_ into fresh memory also pays a read-for-ownership of the destination
    on CPUs, which its byte count does not see."""
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    b = torch.empty_like(a).uniform_()
    t = timeit(lambda: a.add_(b), **{**timing(quick), "repeat": 10}, device=device)
    return 3 * nbytes / t


def bandwidth(device="cpu", quick=False):
    """The memory-bandwidth bound: (best, copy_, in-place add_) in bytes/s.
    --quick uses 64 MiB arrays instead of 512 MiB (faster, less exact)."""
    nbytes = (64 if quick else 512) * 2**20
    c = copy_bandwidth(device, nbytes, quick)
    i = inplace_bandwidth(device, nbytes, quick)
    return max(c, i), c, i


@dataclasses.dataclass
class Env:
    """What every case of one run shares: the device and its measured bound."""
    device: str
    quick: bool
    bandwidth: float = 0.0       # bytes/s, the bound
    copy_bandwidth: float = 0.0
    add_bandwidth: float = 0.0
    array_mib: int = 512

    def time(self, fn, **overrides):
        return timeit(fn, **{**timing(self.quick), **overrides}, device=self.device)

    def time_interleaved(self, fns, **overrides):
        return timeit_interleaved(fns, **{**timing(self.quick), **overrides}, device=self.device)

    def header(self):
        return (f"device: {self.device}, threads: {torch.get_num_threads()}, torch "
                f"{torch.__version__}, bandwidth bound {self.bandwidth / 1e9:.1f} GB/s (copy_ "
                f"{self.copy_bandwidth / 1e9:.1f}, in-place add_ {self.add_bandwidth / 1e9:.1f}; "
                f"{self.array_mib} MiB arrays)")


@dataclasses.dataclass
class Result:
    """One benchmark case: milliseconds per setup (torchext's first), the
    speed-up of torchext over each other setup (their time / torchext's), and
    the fraction of the bandwidth bound torchext reached (None when a case is
    not bandwidth-bound by design)."""
    benchmark: str
    case: str
    ms: dict
    speedup: dict
    bandwidth_fraction: float = None
    extra: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_seconds(cls, benchmark, case, seconds, bytes_moved=None, env=None, extra=None):
        """seconds: {setup: seconds}, torchext's setup first."""
        ours = next(iter(seconds.values()))
        names = list(seconds)
        return cls(benchmark, case,
                   ms={k: v * 1e3 for k, v in seconds.items()},
                   speedup={k: seconds[k] / ours for k in names[1:]},
                   bandwidth_fraction=(bytes_moved / ours / env.bandwidth
                                       if bytes_moved is not None else None),
                   extra=extra or {})


def make_params(n, size, dtype, device):
    """n parameters of `size` elements with small random gradients."""
    g = torch.Generator(device="cpu").manual_seed(0)
    params = []
    for _ in range(n):
        p = torch.nn.Parameter(torch.randn(size, generator=g).to(device=device, dtype=dtype))
        p.grad = torch.randn(size, generator=g).to(device=device, dtype=dtype) * 1e-3
        params.append(p)
    return params


def table(headers, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(str(h).ljust(w) for h, w in zip(headers, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    out = [line, sep]
    for r in rows:
        out.append("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")
    return "\n".join(out)


def ratio_rows(result):
    """A Result's table rows: torchext's setup first (its fraction of the
    bandwidth bound), then every other setup's time and its ratio to ours."""
    (ours, ours_ms), *others = result.ms.items()
    rows = [[ours, f"{ours_ms:.2f}", "1.00x", f"{result.bandwidth_fraction * 100:.0f}%"]]
    rows += [[k, f"{ms:.2f}", f"{result.speedup[k]:.2f}x", ""] for k, ms in others]
    return rows

