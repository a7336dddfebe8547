"""Gradient clipping by norm, with clipping active (the coefficient below 1):

* the drop-in ``torchext.nn.utils.clip_grad_norm_`` against
  ``torch.nn.utils.clip_grad_norm_(foreach=True)`` (both read the grads for
  the norm and rewrite them once: bound 12 B per fp32 element);
* the post-backward phase of the loop people write, with a GradScaler:
  torchext's two clips, the fold (``scaler.clip_and_step`` -> ``update``:
  one read for norm + inf check, one fused update) and the two-call clip
  (``scaler.clip_grad_norm_`` -> ``step`` -> ``update``: the read, a pass
  that writes the unscaled, clipped grads, the fused update), against
  torchext's own phase without clipping, and against torch's recipe
  (``unscale_`` -> ``clip_grad_norm_`` -> ``step`` -> ``update``) with
  torch's fused SGD, and the same with torch's ``AdamW(fused=True)``
  stepped by either scaler;
* the norm kernel alone: ``tensor_norms`` with inv_scale and found_inf (one
  read: the unscaled norms and the inf check; bound 4 B per fp32 element,
  reported in bytes/s against a copy's) against the composite kernel
  (ATen's ``_foreach_norm`` then ``check_finite_``: two reads, what CUDA ran
  before it had a kernel of its own) and ``torch._foreach_norm`` (no check).

The scale is 1.0 (huge growth interval), so that torch's in-place unscale
leaves the gradients as they were from one repetition to the next; the
memory traffic is the same as with any other scale. Every setup is timed in
turns in one process (``timeit_interleaved``)."""
import torch

import torchext

from .common import Result, make_params, ratio_rows, table

NAME = "clip"
MAX_NORM = 1e-3  # below every gradient norm here: clipping is active


#: (tensors, elements each): few large tensors, and many small ones (where
#: torch's cost is per tensor). --quick runs a tenth of the tensors.
SHAPES = [(200, 50_000), (10_000, 100)]


def cases(env):
    shapes = [f"{n // 10 if env.quick else n} x {size} fp32" for n, size in SHAPES]
    return ([f"drop-in, {s}" for s in shapes] + [f"phase, {s}" for s in shapes]
            + [f"norms, {s}" for s in shapes])


def _shape(name):
    n, _, size, _ = name.split(", ")[1].split()
    return int(n), int(size)


def _drop_in(env, name):
    n, size = _shape(name)
    p1 = make_params(n, size, torch.float32, env.device)
    p2 = make_params(n, size, torch.float32, env.device)
    seconds = env.time_interleaved({
        "torchext.nn.utils.clip_grad_norm_":
            lambda: torchext.nn.utils.clip_grad_norm_(p1, MAX_NORM),
        "torch.nn.utils.clip_grad_norm_ (foreach)":
            lambda: torch.nn.utils.clip_grad_norm_(p2, MAX_NORM, foreach=True),
    })
    return Result.from_seconds(NAME, name, seconds, bytes_moved=12 * n * size, env=env,
                               extra={"tensors": n, "numel": size})


def _phase(env, name):
    n, size = _shape(name)
    device = env.device
    skw = dict(init_scale=1.0, growth_interval=10**9)
    loss = torch.ones((), device=device)

    def asgd(p):
        return torchext.optim.ASGD(p, lr=1e-3, t0=0)

    def sgd(p):
        return torch.optim.SGD(p, lr=1e-3, momentum=0.9, fused=True)

    def adamw(p):
        return torch.optim.AdamW(p, lr=1e-3, fused=True)

    def ours(make_opt, clip):
        params = make_params(n, size, torch.float32, device)
        opt, scaler = make_opt(params), torchext.amp.GradScaler(**skw)

        def phase():
            scaler.scale(loss)
            if clip == "fold":
                scaler.clip_and_step(opt, MAX_NORM)
            else:
                if clip == "two calls":
                    scaler.clip_grad_norm_(opt, MAX_NORM)
                scaler.step(opt)
            scaler.update()
        return phase

    def torch_recipe(make_opt):
        params = make_params(n, size, torch.float32, device)
        opt, scaler = make_opt(params), torch.amp.GradScaler(device, **skw)

        def phase():
            scaler.scale(loss)
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=True)
            scaler.step(opt)
            scaler.update()
        return phase

    setups = {
        "torchext ASGD, clip_and_step": ours(asgd, "fold"),
        "torchext ASGD, two calls": ours(asgd, "two calls"),
        "torchext ASGD, no clip": ours(asgd, None),
        "torch recipe, SGD(momentum, fused)": torch_recipe(sgd),
        "torchext scaler + AdamW(fused), clip_and_step": ours(adamw, "fold"),
        "torchext scaler + AdamW(fused), two calls": ours(adamw, "two calls"),
        "torchext scaler + AdamW(fused), no clip": ours(adamw, None),
        "torch recipe, AdamW(fused)": torch_recipe(adamw),
    }
    for phase in setups.values():
        phase()  # state exists before timing
    seconds = env.time_interleaved(setups)
    # The folded ASGD phase moves 24 B per element: a 4 B read (norm + inf
    # check), then 20 B for the update (the two-call clip: 8 B more).
    return Result.from_seconds(NAME, name, seconds, bytes_moved=24 * n * size, env=env,
                               extra={"tensors": n, "numel": size})


_COMPOSITE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


def _norms(env, name):
    n, size = _shape(name)
    grads = [p.grad for p in make_params(n, size, torch.float32, env.device)]
    inv = torch.tensor(1.0, device=env.device)
    found = torch.zeros((), device=env.device)
    ops = torch.ops.torchext
    seconds = env.time_interleaved({
        "tensor_norms (one read: norms + inf check)":
            lambda: ops.tensor_norms(grads, 2.0, inv, found),
        "composite: _foreach_norm + check_finite_ (two reads)":
            lambda: ops.tensor_norms.default.redispatch(_COMPOSITE, grads, 2.0, inv, found),
        "torch._foreach_norm (no inf check)": lambda: torch._foreach_norm(grads, 2.0),
    })
    nbytes = 4 * n * size
    ours = next(iter(seconds.values()))
    return Result.from_seconds(NAME, name, seconds, bytes_moved=nbytes, env=env,
                               extra={"tensors": n, "numel": size,
                                      "bytes_per_s": nbytes / ours,
                                      "copy_bytes_per_s": env.copy_bandwidth})


def run_case(env, name):
    if name.startswith("drop-in"):
        return _drop_in(env, name)
    return _norms(env, name) if name.startswith("norms") else _phase(env, name)


def report(env, results):
    lines = [env.header()]
    for r in results:
        rows = ratio_rows(r)
        if r.case.startswith("norms"):
            x = r.extra
            lines += [f"tensor_norms alone, {r.case.split(', ')[1]}: "
                      f"{x['bytes_per_s'] / 1e9:.1f} GB/s read, "
                      f"{x['bytes_per_s'] / x['copy_bytes_per_s'] * 100:.0f}% of copy_'s "
                      f"{x['copy_bytes_per_s'] / 1e9:.1f} GB/s",
                      table(["setup", "ms", "time / torchext's", "of bandwidth bound"], rows)]
            continue
        title = ("clip_grad_norm_ alone" if r.case.startswith("drop-in")
                 else "scale -> clip -> step -> update")
        lines += [f"{title}, {r.case.split(', ')[1]} (clipping active)",
                  table(["setup", "ms", "time / torchext's", "of bandwidth bound"], rows)]
    return "\n".join(lines)
