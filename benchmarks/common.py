"""Helpers for torchext's ratio benchmarks: everything is timed in one
process, side by side, and reported as ratios (absolute times on shared
machines drift; ratios measured together do not)."""
import statistics
import time

import torch


def timeit(fn, warmup=3, repeat=15, min_time=0.2):
    """Median seconds per call of fn() (synchronizing CUDA if used)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    start = time.perf_counter()
    while len(samples) < repeat or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
        if len(samples) >= 200:
            break
    return statistics.median(samples)


def copy_bandwidth(device="cpu", nbytes=512 * 2**20):
    """Bytes per second of a large copy_ (it reads and writes nbytes each)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = timeit(lambda: dst.copy_(src), warmup=2, repeat=10)
    return 2 * nbytes / t


def inplace_bandwidth(device="cpu", nbytes=512 * 2**20):
    """Bytes per second of a large in-place a.add_(b) (reads a and b, writes
    a). An optimizer step writes only lines it has just read, like this; a
    copy_ into fresh memory also pays a read-for-ownership of the destination
    on CPUs, which its byte count does not see."""
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    b = torch.empty_like(a).uniform_()
    t = timeit(lambda: a.add_(b), warmup=2, repeat=10)
    return 3 * nbytes / t


def bandwidth(device="cpu"):
    """The memory-bandwidth bound: the best of copy_ and in-place add_."""
    c, i = copy_bandwidth(device), inplace_bandwidth(device)
    return max(c, i), c, i


def table(headers, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(str(h).ljust(w) for h, w in zip(headers, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    out = [line, sep]
    for r in rows:
        out.append("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")
    return "\n".join(out)
