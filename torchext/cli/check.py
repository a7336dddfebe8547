"""``python -m torchext check``: every op on each device against a reference
(torch's own ASGD and GradScaler math, or float64), in seconds.

Tolerances (relative, at the tensor's scale: max|ours - ref| / max|ref|):

- float64: 1e-7. Both sides keep step/eta/mu in float32 (as torch does); a
  tensor lr's eta schedule is evaluated in float64 and rounded once here, in
  float32 tensor math by torch, so their float64 parameters agree to ~1e-8
  (docs/optimizer.md: "~1e-7 rather than 1e-12"); a float lr agrees to ~1e-15.
- float32, complex64: 1e-5, about 80 ulp after STEPS steps, each a few
  roundings, with FMA vs separate rounding; a missing term of the update
  (e.g. weight decay: lr * wd = 5e-4 relative) is 50x larger.
- float16, bfloat16 vs a float64 run of torch.optim.ASGD's math: STEPS x the
  dtype's epsilon. torchext computes in float32 and rounds once per step
  (half an ulp); the float64 reference never rounds.
- step/eta/mu (float32 state): 1e-6, a few float32 ulp.
- Everything else is exact: check_finite_ flags, unscale_ vs torch's own
  kernel, update_scale_ vs torch._amp_update_scale_, CUDA-graph replay vs
  eager, bad input leaving every tensor bit-identical.
"""
import dataclasses
import math
import random
import time
import traceback

import torch
from torch.optim.asgd import asgd as torch_asgd  # torch's functional ASGD (for-loop)

ops = torch.ops.torchext

STEPS = 3
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64)
TOL = {torch.float64: 1e-7, torch.float32: 1e-5, torch.complex64: 1e-5,
       torch.float16: STEPS * 2.0**-10, torch.bfloat16: STEPS * 2.0**-7}
STATE_TOL = 1e-6


def rel_err(actual, expected):
    """max |a - e| / max |e| in float64 (complex as real pairs)."""
    if actual.is_complex():
        actual, expected = torch.view_as_real(actual), torch.view_as_real(expected)
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    if a.numel() == 0:
        return 0.0
    return ((a - e).abs().max() / e.abs().max().clamp_min(1e-30)).item()


def bit_equal(a, b):
    a, b = a.detach().cpu(), b.detach().cpu()
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0)) and torch.equal(
        a.isnan(), b.isnan())


class Tally:
    """What one check saw: cases run, worst error / tolerance, failures."""

    def __init__(self):
        self.cases = 0
        self.worst = 0.0
        self.failures = []

    def case(self):
        self.cases += 1

    def close(self, what, actual, expected, tol):
        err = rel_err(actual, expected)
        self.worst = max(self.worst, err / tol)
        if not err <= tol:  # also catches NaN
            self.failures.append(f"{what}: relative error {err:.3g} > {tol:.3g}")

    def exact(self, what, actual, expected):
        if not bit_equal(actual, expected):
            self.failures.append(f"{what}: not bit-identical to the reference")

    def expect(self, cond, what):
        if not cond:
            self.failures.append(what)


@dataclasses.dataclass
class Outcome:
    check: str
    device: str
    cases: int
    worst: float          # worst error / tolerance (0 for exact-only checks)
    failures: list
    seconds: float
    skipped: str = ""     # why the check did not run

    @property
    def ok(self):
        return not self.failures


# ---------------------------------------------------------------- inputs

def _tensor(shape, dtype, device, gen, layout):
    """Random values; layout 'contiguous', 'transposed' or 'strided' (every
    other column)."""
    if layout == "transposed" and len(shape) == 2:
        t = torch.randn(shape[::-1], generator=gen, dtype=torch.float64).t()
    elif layout == "strided" and len(shape) == 2:
        t = torch.randn(shape[0], 2 * shape[1], generator=gen, dtype=torch.float64)[:, ::2]
    else:
        t = torch.randn(shape, generator=gen, dtype=torch.float64)
    if dtype.is_complex:
        t = torch.complex(t, torch.randn(t.shape, generator=gen, dtype=torch.float64))
    # .to(device) keeps the strides of a non-contiguous CPU tensor
    return t.to(dtype).to(device)


def _random_shapes(rng, n):
    shapes = []
    for _ in range(n):
        kind = rng.choice(["1d", "2d", "2d", "big", "empty"])
        if kind == "1d":
            shapes.append((rng.randint(1, 300),))
        elif kind == "2d":
            shapes.append((rng.randint(1, 40), rng.randint(1, 40)))
        elif kind == "big":
            shapes.append((rng.randint(3000, 70000),))
        else:
            shapes.append((0,))
    return shapes


def _asgd_lists(dtype, device, gen, rng, n=4):
    layouts = ["contiguous", "transposed", "strided"]
    shapes = _random_shapes(rng, n)
    lay = [rng.choice(layouts) for _ in shapes]
    params = [_tensor(s, dtype, device, gen, la) for s, la in zip(shapes, lay)]
    axs = [torch.zeros_like(p) for p in params]
    f32 = dict(dtype=torch.float32, device=device)
    mus = [torch.ones((), **f32) for _ in params]
    etas = [torch.full((), 0.0, **f32) for _ in params]  # set to lr by the caller
    steps = [torch.zeros((), **f32) for _ in params]
    return params, axs, mus, etas, steps, shapes, lay


# ---------------------------------------------------------------- checks

def _asgd_vs_torch(device, gen, rng, tally, tensor_lr, dtype, grad_scale=None, packed=False,
                   clip_coef=None):
    params, axs, mus, etas, steps, shapes, lay = _asgd_lists(dtype, device, gen, rng)
    lr = rng.choice([0.01, 0.05])
    kw = dict(lambd=1e-4, alpha=0.75, t0=1.0, weight_decay=rng.choice([0.0, 0.01]),
              maximize=rng.random() < 0.5)
    for e in etas:
        e.fill_(lr)
    low = dtype in (torch.float16, torch.bfloat16)
    ref_dtype = torch.float64 if low else dtype
    ref = ([[t.to(ref_dtype, copy=True) for t in lst] for lst in (params, axs)] +
           [[t.clone() for t in lst] for lst in (mus, etas, steps)])
    extra = {}
    inv = None
    if grad_scale is not None:
        extra["grad_scale"] = torch.tensor(grad_scale, device=device)
        inv = torch.tensor(1.0 / grad_scale, dtype=torch.float32, device=device)
    coef = None
    if clip_coef is not None:
        coef = extra["clip_coef"] = torch.tensor(clip_coef, device=device)
    if packed:  # one 1-D tensor each; the 0-d entries become views of its elements
        bufs = [torch.stack(lst) for lst in (mus, etas, steps)]
        mus, etas, steps = (list(b.unbind(0)) for b in bufs)
    for _ in range(STEPS):
        grads = [_tensor(s, dtype, device, gen, la) for s, la in zip(shapes, lay)]
        ref_grads = [g.to(ref_dtype) for g in grads]
        if inv is not None:  # GradScaler.unscale_'s math: multiply by the float32 inverse
            ref_grads = [g * inv for g in grads]
        if coef is not None:  # then clip_grad_norm_'s multiply by its coefficient
            ref_grads = [g * coef for g in ref_grads]
        torch_asgd(ref[0], ref_grads, *ref[1:], foreach=False, lr=lr, **kw)
        # The op's lr: a float32 tensor on the device (read there), or a
        # float64 CPU tensor (what a float lr becomes: read on the host).
        lr_t = (torch.tensor(lr, device=device) if tensor_lr
                else torch.tensor(lr, dtype=torch.float64))
        if packed:
            ops.asgd_.packed(params, grads, axs, *bufs, lr=lr_t, **kw, **extra)
        else:
            ops.asgd_(params, grads, axs, mus, etas, steps, lr=lr_t, **kw, **extra)
    tally.case()
    what = f"{dtype} {shapes} {lay} {kw}"
    for name, ours, theirs in (("param", params, ref[0]), ("ax", axs, ref[1])):
        for i, (o, t) in enumerate(zip(ours, theirs)):
            tally.close(f"{name}[{i}] {what}", o, t, TOL[dtype])
    for name, ours, theirs in (("mu", mus, ref[2]), ("eta", etas, ref[3]),
                               ("step", steps, ref[4])):
        for i, (o, t) in enumerate(zip(ours, theirs)):
            tally.close(f"{name}[{i}] {what}", o, t, STATE_TOL)


def check_asgd_float_lr(device, gen, rng, tally):
    """asgd_ with a float lr (a CPU float64 tensor, read on the host) vs
    torch.optim.ASGD's for-loop math."""
    for dtype in DTYPES:
        _asgd_vs_torch(device, gen, rng, tally, False, dtype)


def check_asgd_tensor_lr(device, gen, rng, tally):
    """asgd_ with a tensor lr on the device vs torch.optim.ASGD's for-loop math."""
    for dtype in DTYPES:
        _asgd_vs_torch(device, gen, rng, tally, True, dtype)


def check_asgd_packed(device, gen, rng, tally):
    """asgd_.packed (step/eta/mu as one 1-D tensor each, what the optimizer
    keeps) vs torch.optim.ASGD's for-loop math, host and device lr."""
    for dtype in DTYPES:
        _asgd_vs_torch(device, gen, rng, tally, rng.random() < 0.5, dtype, packed=True)


def check_asgd_grad_scale(device, gen, rng, tally):
    """asgd_ with grad_scale (unscaled on the fly) and clip_coef (then
    clipped) vs torch's recipe (unscale_, clip's multiply, step), at the
    largest scale torch's scaler reaches (2**127, where scale / coef
    overflows float32), and found_inf=1 leaving every tensor bit-identical."""
    for dtype in (torch.float32, torch.float64, torch.complex64):
        _asgd_vs_torch(device, gen, rng, tally, rng.random() < 0.5, dtype, grad_scale=3.0)
        _asgd_vs_torch(device, gen, rng, tally, rng.random() < 0.5, dtype,
                       grad_scale=2.0 ** 127, clip_coef=rng.choice([0.25, 1e-3, 2e-38]))
    params, axs, mus, etas, steps, shapes, lay = _asgd_lists(torch.float32, device, gen, rng)
    grads = [_tensor(s, torch.float32, device, gen, la) for s, la in zip(shapes, lay)]
    lists = [params, axs, mus, etas, steps]
    before = [[t.clone() for t in lst] for lst in lists]
    ops.asgd_(params, grads, axs, mus, etas, steps, lr=torch.tensor(0.1, dtype=torch.float64),
              lambd=1e-4, alpha=0.75, t0=0.0,
              weight_decay=0.01, maximize=False, grad_scale=torch.tensor(2.0, device=device),
              found_inf=torch.ones((), device=device))
    tally.case()
    for lst, old in zip(lists, before):
        for t, o in zip(lst, old):
            tally.exact("found_inf=1 changed a tensor", t, o)


def _amp_grads(device, gen, rng):
    dtypes = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
    shapes = _random_shapes(rng, 5)
    return [_tensor(s, rng.choice(dtypes), device, gen,
                    rng.choice(["contiguous", "transposed", "strided"])) for s in shapes]


def _poison(grads, rng):
    """Puts an inf or NaN in one random non-empty gradient; returns whether it did."""
    full = [g for g in grads if g.numel()]
    if not full:
        return False
    g = rng.choice(full)
    idx = tuple(rng.randrange(s) for s in g.shape)
    g[idx] = rng.choice([float("inf"), float("-inf"), float("nan")])
    return True


def check_check_finite(device, gen, rng, tally):
    """check_finite_ flags inf/NaN (vs torch.isfinite) and changes no gradient."""
    for trial in range(6):
        grads = _amp_grads(device, gen, rng)
        poisoned = trial % 2 == 1 and _poison(grads, rng)
        before = [g.clone() for g in grads]
        found = torch.zeros((), device=device)
        ops.check_finite_(grads, found)
        expected = any(not torch.isfinite(g).all() for g in grads)
        tally.case()
        tally.expect(expected == poisoned and found.item() == float(expected),
                     f"found_inf={found.item()} but inf/NaN present: {expected}")
        for g, b in zip(grads, before):
            tally.exact("check_finite_ changed a gradient", g, b)


def check_unscale(device, gen, rng, tally):
    """unscale_ vs torch._amp_foreach_non_finite_check_and_unscale_ (GradScaler's
    kernel), and with clip_coef vs that kernel then clip_grad_norm_'s multiply
    (each rounded to the gradient's dtype, as torch's recipe stores them)."""
    for trial in range(6):
        grads = _amp_grads(device, gen, rng)
        if trial % 2:
            _poison(grads, rng)
        ref = [g.clone() for g in grads]
        inv = torch.tensor(1.0 / rng.choice([3.0, 1024.0, 65536.0, 2.0 ** 127]), device=device)
        coef = None
        if trial >= 2:
            coef = torch.tensor(rng.choice([0.3, 1e-3, 2e-38]), device=device,
                                dtype=rng.choice([torch.float32, torch.float64]))
        found, ref_found = torch.zeros((), device=device), torch.zeros((), device=device)
        ops.unscale_(grads, found, inv, coef)
        by_dtype = {}
        for r in ref:  # torch's kernel wants one dtype per call
            by_dtype.setdefault(r.dtype, []).append(r)
        for dtype, group in by_dtype.items():
            try:
                torch._amp_foreach_non_finite_check_and_unscale_(group, ref_found, inv)
            except (NotImplementedError, RuntimeError):
                # Older torch has no bfloat16 CUDA kernel for it (2.11): the
                # same float32 multiply, rounded once to the dtype on store.
                up = [r.float() for r in group]
                torch._amp_foreach_non_finite_check_and_unscale_(up, ref_found, inv)
                for r, u in zip(group, up):
                    r.copy_(u)
            if coef is not None:
                torch._foreach_mul_(group, coef)
        tally.case()
        tally.exact("found_inf", found, ref_found)
        for i, (g, r) in enumerate(zip(grads, ref)):
            tally.exact(f"grad[{i}] {g.dtype} {tuple(g.shape)}", g, r)


def check_tensor_norms(device, gen, rng, tally):
    """tensor_norms vs a float64 torch._foreach_norm, every order the clip
    takes, with inv_scale/found_inf as the fused clip calls it (the norms of
    the unscaled grads, unscale_'s check); the grads unchanged."""
    for trial, order in enumerate((2.0, 1.0, float("inf"), float("-inf"), 0.0, 3.0, -1.0)):
        grads = [g for g in _amp_grads(device, gen, rng) if g.numel() or 0 <= order < math.inf]
        poisoned = trial % 3 == 2 and _poison(grads, rng)
        before = [g.clone() for g in grads]
        inv = torch.tensor(1.0 / rng.choice([1.0, 1024.0]), device=device)
        found = torch.zeros((), device=device)
        norms = ops.tensor_norms(grads, order, inv, found)
        # The norms of the unscaled grads as unscale_ stores them, in float64.
        ref = [(g.double() * inv.double()).to(g.dtype).double() for g in grads]
        expected = torch.stack(torch._foreach_norm(ref, order)) if ref else norms.double()
        tally.case()
        tally.expect(found.item() == float(poisoned), f"found_inf={found.item()}")
        # Each norm is rounded once to its grad's dtype: half an ulp of the widest.
        tol = max([TOL[g.dtype] / STEPS for g in grads] + [1e-7])
        fin = expected.isfinite()
        tally.expect(torch.equal(norms.double().isnan(), expected.isnan()), "NaN norms")
        if fin.any():
            tally.close(f"norms (ord {order})", norms.double()[fin], expected[fin], tol)
        for g, b in zip(grads, before):
            tally.exact("tensor_norms changed a gradient", g, b)


def check_update_scale(device, gen, rng, tally):
    """update_scale_ vs torch._amp_update_scale_ over random overflow sequences."""
    for growth_interval in (1, 3, 7):
        s = torch.tensor(2.0**16, device=device)
        t = torch.zeros((), dtype=torch.int32, device=device)
        h = torch.ones((), dtype=torch.int32, device=device)
        rs, rt = s.clone(), t.clone()
        for _ in range(60):
            f = torch.tensor(float(rng.random() < 0.15), device=device)
            ops.update_scale_(s, t, h, f, growth_factor=2.0, backoff_factor=0.5,
                              growth_interval=growth_interval)
            torch._amp_update_scale_(rs, rt, f, 2.0, 0.5, growth_interval)
        tally.case()
        tally.exact(f"scale (growth_interval={growth_interval})", s, rs)
        tally.exact(f"growth tracker (growth_interval={growth_interval})", t, rt)


def has_swap():
    return hasattr(ops, "swap_")


def check_swap(device, gen, rng, tally):
    """swap_ exchanges the values of two lists, bit for bit, in place."""
    for dtype in DTYPES:
        shapes = _random_shapes(rng, 4)
        a = [_tensor(s, dtype, device, gen, rng.choice(["contiguous", "transposed"]))
             for s in shapes]
        b = [_tensor(s, dtype, device, gen, "contiguous") for s in shapes]
        a0, b0 = [x.clone() for x in a], [y.clone() for y in b]
        ptrs = [x.data_ptr() for x in a + b]
        ops.swap_(a, b)
        tally.case()
        for x, y, x0, y0 in zip(a, b, a0, b0):
            tally.exact(f"swap_ {dtype} {tuple(x.shape)}", x, y0)
            tally.exact(f"swap_ {dtype} {tuple(x.shape)}", y, x0)
        tally.expect(ptrs == [x.data_ptr() for x in a + b], "swap_ moved storage")


def _bad_inputs(device):
    """(description, call, tensors it must leave unchanged)."""
    dev = dict(device=device)

    def asgd_lists():
        p = [torch.randn(5, 3, **dev), torch.randn(7, **dev)]
        return [p, [torch.randn_like(x) for x in p], [torch.zeros_like(x) for x in p],
                [torch.ones((), **dev) for _ in p], [torch.full((), 0.1, **dev) for _ in p],
                [torch.zeros((), **dev) for _ in p]]

    kw = dict(lr=torch.tensor(0.1, dtype=torch.float64), lambd=1e-4, alpha=0.75, t0=0.0,
              weight_decay=0.0, maximize=False)
    cases = []

    def asgd_case(what, mutate, **over):
        a = asgd_lists()
        mutate(a)
        cases.append((what, lambda: ops.asgd_(*a, **{**kw, **over}), [t for x in a for t in x]))

    asgd_case("asgd_: lists of different lengths", lambda a: a[1].pop())
    asgd_case("asgd_: grad of another shape", lambda a: a[1].__setitem__(1, torch.randn(6, **dev)))
    asgd_case("asgd_: grad of another dtype",
              lambda a: a[1].__setitem__(1, a[1][1].double()))
    asgd_case("asgd_: integer parameter",
              lambda a: [a[i].__setitem__(1, a[i][1].int()) for i in range(3)])
    asgd_case("asgd_: negative lr", lambda a: None, lr=torch.tensor(-1.0, dtype=torch.float64))
    asgd_case("asgd_: float64 grad_scale", lambda a: None,
              grad_scale=torch.ones((), dtype=torch.float64, **dev))
    asgd_case("asgd_: ax aliasing its param", lambda a: a[2].__setitem__(0, a[0][0]))
    if device != "cpu":
        asgd_case("asgd_: grad on another device",
                  lambda a: a[1].__setitem__(1, a[1][1].cpu()))
    g = [torch.randn(4, **dev), torch.ones(3, dtype=torch.int64, **dev)]
    found = torch.zeros((), **dev)
    cases.append(("unscale_: integer tensor after a valid one",
                  lambda: ops.unscale_(g, found, torch.full((), 0.5, **dev)), g + [found]))
    found2 = torch.zeros(2, **dev)
    cases.append(("check_finite_: found_inf with 2 elements",
                  lambda: ops.check_finite_(g[:1], found2), g[:1] + [found2]))
    sc = [torch.full((), 1024.0, dtype=torch.float64, **dev),
          torch.zeros((), dtype=torch.int32, **dev), torch.ones((), dtype=torch.int32, **dev),
          torch.ones((), **dev)]
    cases.append(("update_scale_: float64 scale",
                  lambda: ops.update_scale_(*sc, growth_factor=2.0, backoff_factor=0.5,
                                            growth_interval=1), sc))
    return cases


def check_bad_input(device, gen, rng, tally):
    """Bad input raises a clear error before anything is written."""
    for what, call, tensors in _bad_inputs(device):
        before = [t.clone() for t in tensors]
        tally.case()
        try:
            call()
        except (ValueError, TypeError, RuntimeError) as e:
            tally.expect(len(str(e)) > 10, f"{what}: error without a message")
        else:
            tally.failures.append(f"{what}: accepted")
        for t, b in zip(tensors, before):
            tally.exact(f"{what}: changed a tensor", t, b)


def check_cuda_graph(device, gen, rng, tally):
    """check_finite_ + asgd_ (tensor lr, grad_scale, found_inf) + update_scale_
    captured in a CUDA graph; replays (one with an inf) equal eager runs."""
    params, axs, mus, etas, steps, shapes, lay = _asgd_lists(torch.float32, device, gen, rng)
    for e in etas:
        e.fill_(0.05)
    grads = [torch.zeros_like(p) for p in params]
    scale = torch.full((), 1024.0, device=device)
    growth = torch.zeros((), dtype=torch.int32, device=device)
    hyst = torch.ones((), dtype=torch.int32, device=device)
    found = torch.zeros((), device=device)
    lr = torch.tensor(0.05, device=device)
    state = [params, axs, mus, etas, steps, [scale, growth, hyst, found]]

    def step(p, a, m, e, s, amp, g):
        scale_, growth_, hyst_, found_ = amp
        found_.zero_()
        ops.check_finite_(g, found_)
        ops.asgd_(p, g, a, m, e, s, lr=lr, lambd=1e-4, alpha=0.75, t0=1.0,
                  weight_decay=0.01, maximize=False, grad_scale=scale_, found_inf=found_)
        ops.update_scale_(scale_, growth_, hyst_, found_, growth_factor=2.0,
                          backoff_factor=0.5, growth_interval=2)

    eager = [[t.clone() for t in lst] for lst in state]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture, as torch asks
        step(*[[t.clone() for t in lst] for lst in state], [g.clone() for g in grads])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(*state, grads)
    for replay in range(4):
        new = [_tensor(s, torch.float32, device, gen, "contiguous") * 1024.0 for s in shapes]
        if replay == 2:
            _poison(new, rng)
        for g, n in zip(grads, new):
            g.copy_(n)
        graph.replay()
        step(*eager, new)
        torch.cuda.synchronize()
        tally.case()
        for lst, ref in zip(state, eager):
            for t, r in zip(lst, ref):
                tally.exact(f"replay {replay}", t, r)


def check_clip_calls(device, gen, rng, tally):
    """The scaler's two clips vs torch's recipe (``unscale_``,
    ``torch.nn.utils.clip_grad_norm_``, ``step``) with torchext's ASGD vs
    torch.optim.ASGD: the two-call clip (``clip_grad_norm_`` then ``step``,
    applied when called) and the fold (``clip_and_step``), at scales up to
    2**127 where ``scale / coef`` overflows float32, with an inf step."""
    from ..amp import GradScaler
    from ..optim import ASGD
    kw = dict(lr=0.05, lambd=1e-4, t0=1.0, weight_decay=0.01)
    for call in ("two calls", "clip_and_step"):
        for init_scale in (2.0 ** 16, 2.0 ** 127):
            seed = rng.randrange(1 << 30)
            models = []
            for _ in range(2):
                torch.manual_seed(seed)
                models.append(torch.nn.Sequential(
                    torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device))
            ours = (models[0], ASGD(models[0].parameters(), **kw),
                    GradScaler(device, init_scale=init_scale))
            theirs = (models[1], torch.optim.ASGD(models[1].parameters(), foreach=False, **kw),
                      torch.amp.GradScaler(device, init_scale=init_scale))
            for it in range(STEPS):
                x = torch.randn(16, 8, generator=gen).to(device)
                y = torch.randn(16, 4, generator=gen).to(device)
                max_norm = rng.choice([1e-3, 0.05, 1.0])
                for k, (m, opt, sc) in enumerate((ours, theirs)):
                    opt.zero_grad()
                    sc.scale(torch.nn.functional.mse_loss(m(x), y)).backward()
                    if it == 1:  # an overflow: the step is skipped in both
                        next(m.parameters()).grad.view(-1)[0] = float("inf")
                    if k == 1:
                        sc.unscale_(opt)
                        torch.nn.utils.clip_grad_norm_(list(m.parameters()), max_norm)
                        sc.step(opt)
                    elif call == "two calls":
                        sc.clip_grad_norm_(opt, max_norm)
                        sc.step(opt)
                    else:
                        sc.clip_and_step(opt, max_norm)
                    sc.update()
            tally.case()
            for i, (p, q) in enumerate(zip(models[0].parameters(), models[1].parameters())):
                tally.close(f"{call}, scale {init_scale:g}: param {i}", p.detach(), q.detach(),
                            CLIP_TOL)


#: Two float32 roundings of torch's recipe after a few steps (the norms are
#: summed in double, in another order; the fold multiplies by two factors
#: where torch's recipe stores the unscaled gradient in between).
CLIP_TOL = 1e-5


CHECKS = [
    ("asgd_ (float lr)", check_asgd_float_lr, None),
    ("asgd_ (tensor lr)", check_asgd_tensor_lr, None),
    ("asgd_ (packed state)", check_asgd_packed, None),
    ("asgd_ grad_scale/found_inf/clip_coef", check_asgd_grad_scale, None),
    ("check_finite_", check_check_finite, None),
    ("unscale_", check_unscale, None),
    ("tensor_norms", check_tensor_norms, None),
    ("clip: two calls and clip_and_step", check_clip_calls, None),
    ("update_scale_", check_update_scale, None),
    ("swap_", check_swap, lambda device: None if has_swap() else "op not in this build"),
    ("bad input refused", check_bad_input, None),
    ("CUDA graph capture/replay", check_cuda_graph,
     lambda device: None if device == "cuda" else "CUDA only"),
]


def run_checks(devices, checks=None, seed=0):
    """Runs each (name, fn, skip_reason) of checks (default CHECKS) on each
    device; a check that raises fails with the exception as its reason."""
    outcomes = []
    checks = CHECKS if checks is None else checks
    for device in devices:
        for name, fn, skip in checks:
            why = skip(device) if skip else None
            if why:
                outcomes.append(Outcome(name, device, 0, 0.0, [], 0.0, skipped=why))
                continue
            gen = torch.Generator().manual_seed(seed)
            rng = random.Random(seed)
            tally = Tally()
            start = time.perf_counter()
            try:
                fn(device, gen, rng, tally)
                if device == "cuda":
                    torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - reported as this check's failure
                tb = traceback.extract_tb(e.__traceback__)[-1]
                tally.failures.append(f"raised {type(e).__name__}: {e} "
                                      f"({tb.filename.rsplit('/', 1)[-1]}:{tb.lineno})")
            outcomes.append(Outcome(name, device, tally.cases, tally.worst, tally.failures,
                                    time.perf_counter() - start))
    return outcomes


def format_table(outcomes):
    from ..bench.common import table
    rows = []
    for o in outcomes:
        result = f"skipped ({o.skipped})" if o.skipped else ("PASS" if o.ok else "FAIL")
        rows.append([o.check, o.device, o.cases, f"{o.worst:.3f}" if o.cases else "",
                     f"{o.seconds:.2f}", result])
    lines = [table(["check", "device", "cases", "worst err/tol", "s", "result"], rows)]
    for o in outcomes:
        for f in o.failures[:5]:
            lines.append(f"FAIL {o.check} [{o.device}]: {f}")
        if len(o.failures) > 5:
            lines.append(f"     ... and {len(o.failures) - 5} more")
    failed = sum(not o.ok for o in outcomes)
    lines.append(f"{failed} of {len(outcomes)} checks failed" if failed
                 else f"all {sum(not o.skipped for o in outcomes)} checks passed"
                 " (worst err/tol: 1.0 is the tolerance; 0 for exact checks)")
    return "\n".join(lines)


def exit_code(outcomes):
    return 1 if any(not o.ok for o in outcomes) else 0
