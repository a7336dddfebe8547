"""Functional ASGD: the same update as ``torch.optim.ASGD``, on lists.

``asgd(...)`` mirrors ``torch.optim.asgd.asgd`` (same list arguments and
keywords) and adds ``fused``, ``grad_scale`` and ``found_inf``. The fused path
is one ``torch.ops.torchext.asgd_`` call per device; it is what
``torch.compile``/``torch.export`` see as a single op.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import _dtensor

__all__ = ["asgd", "fused_supported"]

_FUSED_DEVICES = ("cpu", "cuda", "meta")


def fused_supported(params: list[Tensor]) -> bool:
    """Whether every tensor is on a device the fused kernels serve."""
    return all(p.device.type in _FUSED_DEVICES for p in params)


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
    """One ASGD step over lists, in place.

    fused=None picks the fused op whenever ``differentiable`` is False and
    every tensor is on CPU/CUDA; otherwise a pure-torch path runs (the same
    math, op for op as torch.optim.ASGD's for-loop, so autograd can flow).
    ``grad_scale``/``found_inf`` follow torch's ``_step_supports_amp_scaling``
    contract: grads are unscaled on the fly, and nothing changes when
    ``found_inf`` is non-zero. ``t0`` may be one value per parameter (what
    ``ASGD.start_averaging`` records when a group's parameters took different
    numbers of steps): then one step runs per distinct value.
    """
    if not params:
        return
    if isinstance(t0, (list, tuple)):
        # One t0 per parameter (ASGD.start_averaging over parameters with
        # different step counts): one step per distinct value.
        by_t0: dict[float, list[int]] = {}
        for i, v in enumerate(t0):
            by_t0.setdefault(v, []).append(i)
        for v, idx in by_t0.items():
            def pick(xs):
                return [xs[i] for i in idx]
            asgd(pick(params), pick(grads), pick(axs), pick(mus), pick(etas), pick(state_steps),
                 foreach, maximize, differentiable, capturable, has_complex, lambd=lambd, lr=lr,
                 t0=v, alpha=alpha, weight_decay=weight_decay, fused=fused,
                 grad_scale=grad_scale, found_inf=found_inf)
        return
    # One pass over the devices decides both "fusable" and "one op call".
    device = params[0].device
    one_device = all(p.device == device for p in params)
    if fused is None:
        fused = not differentiable and (device.type in _FUSED_DEVICES if one_device
                                        else fused_supported(params))
    if fused:
        if differentiable:
            raise RuntimeError("`fused` does not support `differentiable`")
        # DTensor (FSDP2) params: the op runs on the local shards (see _dtensor.py).
        params, grads, axs, mus, etas, state_steps = _dtensor.to_local_lists(
            params, grads, axs, mus, etas, state_steps)
        _fused_asgd(params, grads, axs, mus, etas, state_steps, lr=lr, lambd=lambd,
                    alpha=alpha, t0=t0, weight_decay=weight_decay, maximize=maximize,
                    grad_scale=grad_scale, found_inf=found_inf, one_device=one_device)
    else:
        for g in grads:
            if g.is_sparse:
                raise RuntimeError("ASGD does not support sparse gradients")
        _reference_asgd(params, grads, axs, mus, etas, state_steps, lr=lr, lambd=lambd,
                        alpha=alpha, t0=t0, weight_decay=weight_decay, maximize=maximize,
                        capturable=capturable, grad_scale=grad_scale, found_inf=found_inf)


def _call_op(params, grads, axs, mus, etas, steps, *, lr, grad_scale, found_inf, **kw):
    if isinstance(lr, Tensor):
        torch.ops.torchext.asgd_.tensor_lr(params, grads, axs, mus, etas, steps, lr=lr,
                                           grad_scale=grad_scale, found_inf=found_inf, **kw)
    else:
        torch.ops.torchext.asgd_(params, grads, axs, mus, etas, steps, lr=float(lr),
                                 grad_scale=grad_scale, found_inf=found_inf, **kw)


def _fused_asgd(params, grads, axs, mus, etas, steps, *, lr, lambd, alpha, t0,
                weight_decay, maximize, grad_scale, found_inf, one_device):
    kw = dict(lambd=float(lambd), alpha=float(alpha), t0=float(t0),
              weight_decay=float(weight_decay), maximize=bool(maximize))
    if one_device:  # the common case: one op call
        _call_op(params, grads, axs, mus, etas, steps, lr=lr, grad_scale=grad_scale,
                 found_inf=found_inf, **kw)
        return
    # One call per device; the op itself groups by dtype.
    by_device: dict[torch.device, list[int]] = {}
    for i, p in enumerate(params):
        by_device.setdefault(p.device, []).append(i)
    for dev, idx in by_device.items():
        def pick(xs):
            return [xs[i] for i in idx]
        _call_op(pick(params), pick(grads), pick(axs), pick(mus), pick(etas), pick(steps),
                 lr=lr,
                 grad_scale=None if grad_scale is None else grad_scale.to(dev, non_blocking=True),
                 found_inf=None if found_inf is None else found_inf.to(dev, non_blocking=True),
                 **kw)


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
    if isinstance(lr, Tensor) and not capturable:
        lr = lr.item()
    for i, param in enumerate(params):
        grad, ax, mu, eta, step_t = grads[i], axs[i], mus[i], etas[i], steps[i]
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
