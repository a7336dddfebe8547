"""Functional ASGD: the same update as ``torch.optim.ASGD``, on lists.

``asgd(...)`` mirrors ``torch.optim.asgd.asgd`` (same list arguments and
keywords) and adds ``fused``, ``grad_scale`` and ``found_inf``. The fused path
is one ``torch.ops.torchext.asgd_`` call per device; it is what
``torch.compile``/``torch.export`` see as a single op.

The reference path (``reference_asgd``) is torch.optim.ASGD's for-loop
update, op for op: it is torchext's unfused rule, used for
``differentiable=True``, ``fused=False`` and devices without kernels.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _devices
from . import _dtensor, _op

__all__ = ["asgd", "fused_supported", "use_fused", "reference_asgd"]

_FUSED_DEVICES = ("cpu", "cuda", "meta")


def fused_supported(params: list[Tensor]) -> bool:
    """Whether every tensor is on a device the fused kernels serve."""
    return all(p.device.type in _FUSED_DEVICES for p in params)


def use_fused(params: list[Tensor], fused: bool | None, differentiable: bool) -> bool:
    """fused=None picks the fused op when ``differentiable`` is False and
    every tensor is on a device with torchext kernels."""
    if fused and differentiable:
        raise RuntimeError("`fused` does not support `differentiable`")
    if fused is None:
        return not differentiable and fused_supported(params)
    return bool(fused)


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
    lists = [params, grads, axs, mus, etas, state_steps]
    hyper = dict(lambd=lambd, alpha=alpha, weight_decay=weight_decay, maximize=maximize)
    if not use_fused(params, fused, differentiable):
        if isinstance(t0, (list, tuple)) or not torch.compiler.is_compiling():
            # The reference writes tensor by tensor: check everything first.
            for idx, t in _calls(lists, t0):
                sub = [_devices.pick(xs, idx) for xs in lists]
                _op.validate(list(_dtensor.to_local_lists(*sub)), lr, _op.hyper_of(hyper, t0=t),
                             _moved(grad_scale, sub[0]), _moved(found_inf, sub[0]))
        reference_asgd(*lists, lr=lr, t0=t0, capturable=capturable, grad_scale=grad_scale,
                       found_inf=found_inf, **hyper)
        return
    calls = []
    for idx, t in _calls(lists, t0):
        sub = list(_dtensor.to_local_lists(*[_devices.pick(xs, idx) for xs in lists]))
        calls.append((sub, _op.hyper_of(hyper, t0=t), _moved(grad_scale, sub[0]),
                      _moved(found_inf, sub[0])))
    if len(calls) > 1:  # a single op call validates everything before it writes
        for sub, h, gs, fi in calls:
            _op.validate(sub, lr, h, gs, fi)
    for sub, h, gs, fi in calls:
        _op.call(sub, lr, h, gs, fi)


def _calls(lists, t0):
    """(indices, t0) of each op call: one per device and distinct t0."""
    per_param = isinstance(t0, (list, tuple))
    out = []
    for idx in _devices.indices_by_device(
            _dtensor.to_local(p) for p in lists[0]).values():
        by_t0: dict[float, list[int]] = {}
        for i in idx:
            by_t0.setdefault(float(t0[i]) if per_param else float(t0), []).append(i)
        out.extend((sub, t) for t, sub in by_t0.items())
    return out


def _moved(t: Tensor | None, params: list[Tensor]) -> Tensor | None:
    # grad_scale/found_inf on the device of this call's params.
    if t is None or not params:
        return t
    device = _dtensor.to_local(params[0]).device
    return t if t.device == device else t.to(device, non_blocking=True)


def reference_asgd(params, grads, axs, mus, etas, steps, *, lr, lambd, alpha, t0,
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
