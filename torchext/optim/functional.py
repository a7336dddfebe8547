"""Functional ASGD: the same update as ``torch.optim.ASGD``, on lists.

``asgd(...)`` mirrors ``torch.optim.asgd.asgd`` (same list arguments and
keywords) and adds ``fused``, ``grad_scale`` and ``found_inf``. The fused path
is one ``torch.ops.torchext.asgd_`` call per device; it is what
``torch.compile``/``torch.export`` see as a single op.

A step is split in three so that ``ASGD.step`` can check every parameter
group before it writes anything: :func:`route` (fused or reference, one
device or several), :func:`check` (the op's own validation, run on its Meta
kernel, which writes nothing) and :func:`run`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .. import _devices
from . import _dtensor

__all__ = ["asgd", "fused_supported"]

_FUSED_DEVICES = ("cpu", "cuda", "meta")
_PLAIN = (torch.Tensor, torch.nn.Parameter)
# The op's Meta kernel is its validation alone: called with real tensors it
# checks them exactly as the CPU/CUDA kernels do, and touches no data.
_VALIDATE_ONLY = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def fused_supported(params: list[Tensor]) -> bool:
    """Whether every tensor is on a device the fused kernels serve."""
    return all(p.device.type in _FUSED_DEVICES for p in params)


class Route(NamedTuple):
    """How one list of parameters is stepped."""
    fused: bool
    # None: one device, one call. Else the positions of each device's tensors.
    by_device: dict[torch.device, list[int]] | None
    plain: bool  # no DTensor among the params

    @property
    def needs_check(self) -> bool:
        """Whether run() makes more than one write that could fail after
        another: several op calls, or the per-tensor reference loop. A
        single op call validates everything before it writes."""
        return self.by_device is not None or not self.fused


def route(params: list[Tensor], fused: bool | None, differentiable: bool) -> Route:
    """fused=None picks the fused op when ``differentiable`` is False and
    every tensor is on a device with torchext kernels."""
    device = _devices.one_device(params)
    if fused is None:
        fused = not differentiable and (device.type in _FUSED_DEVICES if device is not None
                                        else fused_supported(params))
    if fused and differentiable:
        raise RuntimeError("`fused` does not support `differentiable`")
    return Route(fused, None if device is not None else _devices.indices_by_device(params),
                 all(type(p) in _PLAIN for p in params))


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
) -> None:
    """One ASGD step over lists, in place; nothing changes when it raises.

    fused=None picks the fused op whenever ``differentiable`` is False and
    every tensor is on CPU/CUDA; otherwise a pure-torch path runs (the same
    math, op for op as torch.optim.ASGD's for-loop, so autograd can flow).
    ``grad_scale``/``found_inf`` follow torch's ``_step_supports_amp_scaling``
    contract: grads are unscaled on the fly, and nothing changes when
    ``found_inf`` is non-zero. ``t0`` may be one value per parameter (what
    ``ASGD.start_averaging`` records when a group's parameters took different
    numbers of steps): then one op call runs per distinct value.

    ``foreach`` and ``has_complex`` are accepted so that calls written for
    ``torch.optim.asgd.asgd`` run unchanged, and are ignored: the fused op
    is already one call per device, and both paths handle complex tensors
    per tensor.
    """
    if not params:
        return
    r = route(params, fused, differentiable)
    lists = prepare(r, [params, grads, axs, mus, etas, state_steps])
    hyper = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                 maximize=maximize, capturable=capturable, grad_scale=grad_scale,
                 found_inf=found_inf)
    if r.needs_check or isinstance(t0, (list, tuple)):
        check(r, lists, **hyper)
    run(r, lists, **hyper)


def prepare(r: Route, lists: list[list[Tensor]]) -> list[list[Tensor]]:
    """The lists the op is called with: DTensors replaced by their local
    shards on the fused path (see _dtensor.py)."""
    if r.fused and not r.plain:
        return list(_dtensor.to_local_lists(*lists))
    return lists


def check(r: Route, lists: list[list[Tensor]], **hyper) -> None:
    """Raises what run() would raise for bad input, and writes nothing.

    Skipped while torch.compile traces: then every op call is checked by
    its Meta kernel at trace time, before any of them runs."""
    if torch.compiler.is_compiling():
        return
    _each_op_call(r, lists, hyper, keyset=_VALIDATE_ONLY)


def run(r: Route, lists: list[list[Tensor]], *, lr, lambd, alpha, t0, weight_decay,
        maximize, capturable, grad_scale, found_inf) -> None:
    """The step itself (call check() first when ``r.needs_check``)."""
    hyper = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                 maximize=maximize, grad_scale=grad_scale, found_inf=found_inf)
    if r.fused:
        _each_op_call(r, lists, hyper)
    else:
        _reference_asgd(*lists, capturable=capturable, **hyper)


def _each_op_call(r: Route, lists, hyper, keyset=None) -> None:
    # One op call per device (the op itself groups by dtype), and per
    # distinct t0 when there is one per parameter.
    kw = dict(lambd=float(hyper["lambd"]), alpha=float(hyper["alpha"]),
              weight_decay=float(hyper["weight_decay"]), maximize=bool(hyper["maximize"]))
    lr, grad_scale, found_inf, t0 = hyper["lr"], hyper["grad_scale"], hyper["found_inf"], hyper["t0"]
    per_param_t0 = isinstance(t0, (list, tuple))
    if r.by_device is None and not per_param_t0:
        _call_op(lists, lr, grad_scale, found_inf, keyset, dict(kw, t0=float(t0)))
        return
    by_device = r.by_device or {lists[0][0].device: list(range(len(lists[0])))}
    for dev, idx in by_device.items():
        gs = None if grad_scale is None else grad_scale.to(dev, non_blocking=True)
        fi = None if found_inf is None else found_inf.to(dev, non_blocking=True)
        by_t0 = {float(t0): idx} if not per_param_t0 else {}
        if per_param_t0:
            for i in idx:
                by_t0.setdefault(float(t0[i]), []).append(i)
        for t, sub in by_t0.items():
            _call_op([_devices.pick(xs, sub) for xs in lists], lr, gs, fi, keyset,
                     dict(kw, t0=t))


def _call_op(lists, lr, grad_scale, found_inf, keyset, kw) -> None:
    if isinstance(lr, Tensor):
        op = torch.ops.torchext.asgd_.tensor_lr
    else:
        op, lr = torch.ops.torchext.asgd_.default, float(lr)
    if keyset is None:
        op(*lists, lr=lr, grad_scale=grad_scale, found_inf=found_inf, **kw)
    else:
        op.redispatch(keyset, *lists, lr=lr, grad_scale=grad_scale, found_inf=found_inf, **kw)


def _reference_asgd(params, grads, axs, mus, etas, steps, *, lr, lambd, alpha, t0,
                    weight_decay, maximize, capturable, grad_scale, found_inf):
    """torch.optim.ASGD's for-loop update, op for op, plus grad_scale/found_inf.

    Used for differentiable=True and devices the fused kernels do not serve.
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
