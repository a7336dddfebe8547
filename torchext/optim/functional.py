"""Functional ASGD: the same update as ``torch.optim.ASGD``, on lists.

``asgd(...)`` mirrors ``torch.optim.asgd.asgd`` (same list arguments and
keywords) and adds ``fused``, ``grad_scale``, ``found_inf`` and ``clip_coef``. The fused path
is one ``torch.ops.torchext.asgd_`` call per device and t0; each is what
``torch.compile``/``torch.export`` see as a single op.

The reference path (``reference_asgd``) is torch.optim.ASGD's for-loop
update, op for op: it is torchext's unfused rule, used for
``differentiable=True``, ``fused=False`` and devices without kernels.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _devices, _dtensor
from . import _op

__all__ = ["asgd", "fused_supported", "use_fused", "reference_asgd", "ListCall", "FusedCall",
           "ReferenceCall", "HolderCall", "list_call", "run_calls"]


def check_flags(fused: bool | None, differentiable: bool, foreach: bool | None = None) -> None:
    """torch's refusals for the route flags (constructor and functional)."""
    if fused and differentiable:
        raise RuntimeError("`fused` does not support `differentiable`")
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")


def fused_supported(params: list[Tensor]) -> bool:
    """Whether every tensor is on a device with torchext kernels."""
    return all(_devices.has_kernels(p.device) for p in params)


def use_fused(params: list[Tensor], fused: bool | None, differentiable: bool) -> bool:
    """fused=None picks the fused op when ``differentiable`` is False and
    every tensor is on a device with torchext kernels."""
    check_flags(fused, differentiable)
    if fused is None:
        return not differentiable and fused_supported(params)
    return bool(fused)


# ------------------------------------------------------------- the op calls
#
# A step is a list of calls, one per param group, device and t0; each call is
# one of the three routes below, with validate() (raises what run() would
# raise, writes nothing) and run(). run_calls() is the one place that makes a
# step all or nothing.


class ListCall:
    """What a call over lists [params, grads, axs, mus, etas, steps] holds:
    the lists, lr, the hyperparameters, grad_scale/found_inf/clip_coef and
    the op's rounding_* keywords ({}: round to nearest)."""
    __slots__ = ("lists", "lr", "hyper", "grad_scale", "found_inf", "clip_coef", "rounding")

    def __init__(self, lists, lr, hyper, grad_scale, found_inf, clip_coef=None,
                 rounding=None) -> None:
        self.lists, self.lr, self.hyper = lists, lr, hyper
        self.grad_scale, self.found_inf, self.clip_coef = grad_scale, found_inf, clip_coef
        self.rounding = rounding or {}


class FusedCall(ListCall):
    """One ``asgd_`` op call over the lists (step/eta/mu as 0-d tensors, or
    packed 1-D tensors); the op validates everything before it writes."""
    __slots__ = ()
    atomic = True

    def validate(self) -> None:
        _op.validate(self.lists, self.lr, self.hyper, self.grad_scale, self.found_inf,
                     self.clip_coef, self.rounding)

    def run(self) -> None:
        _op.call(self.lists, self.lr, self.hyper, self.grad_scale, self.found_inf,
                 self.clip_coef, self.rounding)


class ReferenceCall(ListCall):
    """torch.optim.ASGD's for-loop (``reference_asgd``): writes tensor by
    tensor, so it is validated first, by the op's own rules, even alone."""
    __slots__ = ("capturable",)
    atomic = False

    def __init__(self, lists, lr, hyper, grad_scale, found_inf, clip_coef,
                 capturable: bool) -> None:
        super().__init__(lists, lr, hyper, grad_scale, found_inf, clip_coef)
        self.capturable = capturable

    def validate(self) -> None:
        if torch.compiler.is_compiling():  # as _op.validate: the Meta kernels check
            return
        _op.validate(list(_dtensor.to_local_lists(*self.lists)), self.lr, self.hyper,
                     self.grad_scale, self.found_inf, self.clip_coef)

    def run(self) -> None:
        reference_asgd(*self.lists, lr=self.lr, capturable=self.capturable,
                       grad_scale=self.grad_scale, found_inf=self.found_inf,
                       clip_coef=self.clip_coef, **self.hyper)


class HolderCall:
    """The fused op over a slot group's lists held in C++ (an eager-mode
    optimisation of ``FusedCall``: no list passes from Python; the holder
    reads each param's .grad). ``run`` is the holder's ``run`` method
    (``SlotGroup.native_run``), ``lr`` the op's lr tensor and ``hyper`` the
    hyperparameters as a list in schema order (``_op.lr_tensor``,
    ``_op.hyper_list``; the slot group keeps them between steps).
    ``make_state(indices)`` is called for params that have a grad but no
    state yet, before anything is validated or written."""
    __slots__ = ("holder_run", "args", "make_state")
    atomic = True

    def __init__(self, run, lr: Tensor, hyper: list[float], grad_scale, found_inf, clip_coef,
                 make_state) -> None:
        self.holder_run = run
        self.args = (lr, hyper, grad_scale, found_inf, clip_coef)
        self.make_state = make_state

    def _run(self, validate_only: bool) -> None:
        missing = self.holder_run(validate_only, *self.args)
        if missing:  # nothing was done: create their state, then the call
            self.make_state(missing)
            self.holder_run(validate_only, *self.args)

    def validate(self) -> None:
        self._run(True)

    def run(self) -> None:
        self._run(False)


def list_call(lists, fused: bool, lr, hyper, capturable: bool, grad_scale, found_inf,
              clip_coef=None, rounding=None):
    """The call for lists on one device with one t0: the fused op, or
    torch's for-loop. grad_scale/found_inf/clip_coef are moved to that device.
    ``rounding`` (the op's rounding_* keywords) needs the fused op."""
    device = _dtensor.to_local(lists[0][0]).device
    scale, inf = _devices.on_device(grad_scale, device), _devices.on_device(found_inf, device)
    coef = _devices.on_device(clip_coef, device)
    if fused:
        return FusedCall(lists, lr, hyper, scale, inf, coef, rounding)
    if rounding:
        check_rounding_route(False, False, device)
    return ReferenceCall(lists, lr, hyper, scale, inf, coef, capturable)


def check_rounding_route(fused: bool | None, differentiable: bool,
                         device: torch.device | None = None) -> None:
    """Stochastic rounding is the fused op's (its kernels draw the bits);
    torch's unfused path (fused=False, differentiable=True, devices without
    torchext kernels) rounds to nearest, so the flag is refused there rather
    than silently ignored."""
    if fused is False or differentiable or device is not None:
        why = ("fused=False" if fused is False else "differentiable=True" if differentiable
               else f"parameters on {device} (no torchext kernels: the unfused path)")
        raise ValueError(f"stochastic_rounding=True needs the fused op, but this step takes "
                         f"torch's unfused path ({why}), which rounds to nearest")


def run_calls(calls) -> None:
    """Runs a step's calls, all or nothing: unless the step is one call that
    validates before it writes, every call is validated before the first
    writes. (While torch.compile traces, validation is each op's Meta kernel
    at trace time, before any op runs.)"""
    if len(calls) > 1 or (calls and not calls[0].atomic):
        for c in calls:
            c.validate()
    for c in calls:
        c.run()


def asgd(
    params: list[Tensor],
    grads: list[Tensor],
    axs: list[Tensor],
    mus: list[Tensor],
    etas: list[Tensor],
    state_steps: list[Tensor],
    foreach: bool | None = None,
    maximize: bool = False,
    differentiable: bool = False,
    capturable: bool = False,
    has_complex: bool = False,
    *,
    lambd: float,
    lr: float | Tensor,
    t0: float | list[float],
    alpha: float,
    weight_decay: float,
    fused: bool | None = None,
    grad_scale: Tensor | None = None,
    found_inf: Tensor | None = None,
    clip_coef: Tensor | None = None,
    rounding_seed: int | None = None,
) -> None:
    """One ASGD step over lists, in place; nothing changes when it raises.

    fused=None picks the fused op whenever ``differentiable`` is False and
    every tensor is on a device with kernels (CPU, CUDA, meta); otherwise a
    pure-torch path runs (the same math, op for op as torch.optim.ASGD's
    for-loop, so autograd can flow). ``grad_scale``/``found_inf`` follow
    torch's ``_step_supports_amp_scaling`` contract: grads are unscaled on
    the fly, and nothing changes when ``found_inf`` is non-zero.
    ``clip_coef`` (a 0-d float32/float64 tensor, a gradient clip's
    coefficient) multiplies the unscaled grads on the fly, a second factor
    after ``1 / grad_scale`` (as torch's ``unscale_`` then ``clip_grad_norm_``
    leave them), never folded into ``grad_scale``. ``t0`` may
    be one value per parameter (what ``ASGD.start_averaging`` records when a
    group's parameters took different numbers of steps).

    One call runs per device and distinct t0 (``list_call``), all validated
    before the first writes (``run_calls``), exactly as ``ASGD.step`` runs.
    ``foreach`` and ``has_complex`` are accepted so that calls written for
    ``torch.optim.asgd.asgd`` run unchanged, and are ignored: the fused op
    is already one call per device and t0, and both paths handle complex tensors
    per tensor.

    ``rounding_seed`` (an int) rounds fp16/bf16 params stochastically (fused
    only): ``params[i]``'s random stream is keyed by the seed and ``i``, its
    position in ``params`` (``ASGD``'s key is its group and position there:
    see docs/optimizer.md).
    """
    if not params:
        return
    lists = [params, grads, axs, mus, etas, state_steps]
    hyper = dict(lambd=lambd, alpha=alpha, weight_decay=weight_decay, maximize=maximize)
    fused = use_fused(params, fused, differentiable)
    t0s = [float(t) for t in t0] if isinstance(t0, (list, tuple)) else None
    calls = []
    for (_, t), idx in _devices.indices_by_device_and_key(
            (_dtensor.to_local(p) for p in params), t0s).items():
        sub = [_devices.pick(xs, idx) for xs in lists]
        rounding = None
        if rounding_seed is not None:
            rounding = _op.rounding_args(rounding_seed, list(idx), offsets_of(sub[0]))
        if fused:
            sub = [list(x) for x in _dtensor.to_local_lists(*sub)]
        calls.append(list_call(sub, fused, lr, _op.hyper_of(hyper, t0=float(t0) if t is None else t),
                               capturable, grad_scale, found_inf, clip_coef, rounding))
    run_calls(calls)


def offsets_of(params) -> list[int] | None:
    """The rounding offsets of ``params`` (``_dtensor.flat_offset``), or None
    when all are 0."""
    offsets = [_dtensor.flat_offset(p) for p in params]
    return offsets if any(offsets) else None


def reference_asgd(params, grads, axs, mus, etas, steps, *, lr, lambd, alpha, t0,
                   weight_decay, maximize, capturable, grad_scale, found_inf, clip_coef=None):
    """torch.optim.ASGD's for-loop update, op for op, plus grad_scale/found_inf
    and clip_coef (torch's recipe: grads * inv_scale, then * clip_coef).

    Used for differentiable=True, fused=False and devices without kernels.
    It syncs (like torch's non-capturable path) unless capturable=True.
    """
    if found_inf is not None and not capturable and found_inf.item() != 0:
        return
    inv_scale = None if grad_scale is None else grad_scale.double().reciprocal().float()
    if capturable and found_inf is not None:
        # Decide the skip on the device: keep the old values where found_inf != 0.
        olds = [(t, t.detach().clone()) for t in (*params, *axs, *mus, *etas, *steps)]
    if isinstance(lr, Tensor) and lr.dim() != 0:
        lr = lr.squeeze()  # torch's _to_scalar: a tensor lr stays a tensor (and differentiable)
    t0s = t0 if isinstance(t0, (list, tuple)) else None  # one per param (start_averaging)
    for i, param in enumerate(params):
        grad, ax, mu, eta, step_t = grads[i], axs[i], mus[i], etas[i], steps[i]
        if t0s is not None:
            t0 = t0s[i]
        if inv_scale is not None:
            grad = grad * inv_scale.to(grad.device)
        if clip_coef is not None:
            grad = grad * clip_coef.to(grad.device)
        grad = grad if not maximize else -grad
        if torch.is_complex(param):
            grad = torch.view_as_real(grad)
            param = torch.view_as_real(param)
            ax = torch.view_as_real(ax)
        step_t += 1
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        if capturable:
            param.mul_(1 - lambd * eta)
            param.addcmul_(grad, eta, value=-1)
            ax.add_(param.sub(ax).mul_(mu))
            eta.copy_(lr / ((1 + lambd * lr * step_t) ** alpha))
            mu.copy_(1 / torch.maximum(step_t - t0, torch.ones_like(step_t)))
        else:
            eta_value = eta.item()
            param.mul_(1 - lambd * eta_value)
            param.add_(grad, alpha=-eta_value)
            if mu.item() != 1:
                ax.add_(param.sub(ax).mul_(mu))
            else:
                ax.copy_(param)
            step = step_t.item()
            eta.copy_(torch.as_tensor(lr / ((1 + lambd * lr * step) ** alpha)))
            mu.copy_(torch.as_tensor(1 / max(1, step - t0)))
    if capturable and found_inf is not None:
        skip = found_inf.to(params[0].device) != 0
        with torch.no_grad():
            for t, old in olds:
                t.copy_(torch.where(skip, old, t.detach()))
