"""Gradient clipping by norm: drop-ins for ``torch.nn.utils.clip_grad_norm_``,
``get_total_norm`` and ``clip_grads_with_norm_``, and the pieces the fused
clips of ``GradScaler.clip_grad_norm_`` and ``ASGD.clip_grad_norm_`` share.

torch computes every gradient's norm (``torch._foreach_norm``: on the CPU one
``linalg.vector_norm`` call per tensor), the norm of those norms, the
coefficient ``min(max_norm / (total + 1e-6), 1)``, then multiplies every
gradient by it. Here the per-tensor norms are one op call per device
(``tensor_norms``: one read of the gradients, chunks over all tensors and
threads) and the multiply is one more (``unscale_``, the in-place multiply by
a device scalar); everything between is torch's own arithmetic on the small
tensor of norms, so the total norm, its dtype and device are torch's. No host
sync, unless ``error_if_nonfinite`` asks for one, as in torch.

Inputs torchext has no kernel for (DTensor or sparse gradients, devices other
than CPU/CUDA) go to torch's own function, which gives torch's result.
"""
from __future__ import annotations

import math
import types
import warnings
from typing import Iterable

import torch
from torch import Tensor
from torch.utils._foreach_utils import _device_has_foreach_support

from ... import _devices

__all__ = ["clip_grad_norm_", "clip_grads_with_norm_", "get_total_norm"]

_TensorOrTensors = Tensor | Iterable[Tensor]


def _as_list(tensors: _TensorOrTensors) -> list[Tensor]:
    return [tensors] if isinstance(tensors, Tensor) else list(tensors)


def torchext_serves(tensors: list[Tensor]) -> bool:
    """Whether every tensor is a plain strided tensor on a device with
    torchext kernels (else torch's own function does the work)."""
    return all(type(t) in (Tensor, torch.nn.Parameter) and t.layout is torch.strided
               and _devices.has_kernels(t.device) for t in tensors)


def _refuse_foreach(tensors: list[Tensor], foreach: bool | None) -> None:
    # torch's own error for foreach=True on a device without foreach kernels.
    if foreach:
        for device in _devices.indices_by_device(tensors):
            if not _device_has_foreach_support(device):
                raise RuntimeError(f"foreach=True was passed, but can't use the foreach API on "
                                   f"{device.type} tensors")


def check_nonfinite(total_norm: Tensor, norm_type: float, error_if_nonfinite: bool) -> None:
    """torch's ``error_if_nonfinite``: a host read of the total norm. Refused
    where no host read may happen (torch.compile, CUDA-graph capture)."""
    if not error_if_nonfinite:
        return
    if torch.compiler.is_compiling() or (torch.cuda.is_initialized()
                                         and torch.cuda.is_current_stream_capturing()):
        raise RuntimeError(
            "error_if_nonfinite=True reads the total norm on the host, which cannot happen "
            "inside torch.compile or a CUDA-graph capture; pass error_if_nonfinite=False "
            "there (a non-finite norm then clips with a coefficient of 0 or NaN, as in torch)")
    if torch.logical_or(total_norm.isnan(), total_norm.isinf()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from "
            "`parameters` is non-finite, so it cannot be clipped. To disable "
            "this error and scale the gradients by the non-finite norm anyway, "
            "set `error_if_nonfinite=False`")


def total_norm_of(norms: list[Tensor], norm_type: float, device: torch.device) -> Tensor:
    """The norm of the per-tensor norms (one tensor per device), on
    ``device``: torch's ``vector_norm(stack(norms))``."""
    return torch.linalg.vector_norm(torch.cat([n.to(device) for n in norms]), norm_type)


def clip_coef(total_norm: Tensor, max_norm: float) -> Tensor:
    """torch's clamped clip coefficient, on the device of ``total_norm``."""
    return torch.clamp(float(max_norm) / (total_norm + 1e-6), max=1.0)


def reduce_sharded(total_norm: Tensor, norm_type: float, group) -> Tensor:
    """The global norm from each rank's norm of its local shards (FSDP2):
    all-reduce of sum |g|^p (MAX for inf, MIN for -inf, the count for 0), as
    torch's DTensor ``Partial`` placement reduces it. No host sync."""
    import torch.distributed as dist
    if norm_type == float("inf"):
        dist.all_reduce(total_norm, op=dist.ReduceOp.MAX, group=group)
        return total_norm
    if norm_type == float("-inf"):
        dist.all_reduce(total_norm, op=dist.ReduceOp.MIN, group=group)
        return total_norm
    if norm_type == 0.0:
        dist.all_reduce(total_norm, op=dist.ReduceOp.SUM, group=group)
        return total_norm
    partial = total_norm.double() ** norm_type
    dist.all_reduce(partial, op=dist.ReduceOp.SUM, group=group)
    return (partial ** (1.0 / norm_type)).to(total_norm.dtype)


def norms_of(tensors: list[Tensor], norm_type: float, device: torch.device,
             inv_scale: Tensor | None = None, found_inf: Tensor | None = None) -> Tensor:
    """One device's per-tensor norms (``tensor_norms``); for no tensors (a
    rank whose shards are all empty) the norm that adds nothing to a total:
    0, or inf for negative orders (inf ** p == 0)."""
    if not tensors:
        return torch.full((1,), math.inf if norm_type < 0 else 0.0, device=device)
    if inv_scale is not None:
        inv_scale = inv_scale.to(device, non_blocking=True)
    return torch.ops.torchext.tensor_norms(tensors, norm_type, inv_scale, found_inf)


def device_norms(tensors: list[Tensor], norm_type: float) -> dict[torch.device, Tensor]:
    """Per device, the per-tensor norms of ``tensors`` (one op call each).
    They write nothing, so a list refused on a later device has changed
    nothing either."""
    return {d: norms_of(_devices.pick(tensors, idx), norm_type, d)
            for d, idx in _devices.indices_by_device(tensors).items()}


def _one_call_norms(tensors: list[Tensor], norm_type: float,
                    foreach: bool | None) -> Tensor | None:
    """The per-tensor norms in one op call, which checks the whole list in
    C++ (no Python pass over the tensors: at 10,000 small gradients each
    such pass costs as much as the norms); None when the op refuses the list
    as a whole (several devices, DTensor or sparse gradients, an empty one
    with an order that has no identity...): the grouped path then serves it,
    or raises the error torch raises. Not while torch.compile traces."""
    if torch.compiler.is_compiling():
        return None
    try:
        norms = torch.ops.torchext.tensor_norms(tensors, norm_type)
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return None
    _refuse_foreach(tensors[:1], foreach)
    return norms


def multiply_(tensors: list[Tensor], factor: Tensor) -> None:
    """tensors *= factor (a 0-d device tensor), one op call per device, no
    sync: ``unscale_`` is that multiply (its inf/NaN check goes to a flag
    nobody reads). A factor of exactly 1 leaves the tensors as they are. A
    float64 factor (float64 gradients) keeps its precision through torch's
    ``_foreach_mul_``, as torch's clip multiplies."""
    for device, idx in _devices.indices_by_device(tensors).items():
        ts = _devices.pick(tensors, idx)
        if factor.dtype == torch.float64:
            torch._foreach_mul_(ts, factor.to(device, non_blocking=True))
            continue
        f = factor.to(device=device, dtype=torch.float32, non_blocking=True)
        torch.ops.torchext.unscale_(ts, torch.zeros_like(f), f)


def _one_call_multiply_(grads: list[Tensor], factor: Tensor, foreach: bool | None) -> bool:
    """grads *= factor in one ``unscale_`` call when the op takes the whole
    list (it checks every tensor before it writes any); False, having
    written nothing, when it does not."""
    if (torch.compiler.is_compiling() or type(factor) is not Tensor
            or factor.dtype == torch.float64):
        return False
    f = factor.to(device=grads[0].device, dtype=torch.float32, non_blocking=True)
    try:
        torch.ops.torchext.unscale_(grads, torch.zeros_like(f), f)
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False
    _refuse_foreach(grads[:1], foreach)
    return True


@torch.no_grad()
def get_total_norm(tensors: _TensorOrTensors, norm_type: float = 2.0,
                   error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """``torch.nn.utils.get_total_norm``: the norm of the tensors' norms, as
    if they were concatenated into one vector; same dtype and device (the
    first tensor's) as torch's, one fused read per device."""
    tensors = _as_list(tensors)
    norm_type = float(norm_type)
    norms = _one_call_norms(tensors, norm_type, foreach) if tensors else None
    if norms is not None:
        total = torch.linalg.vector_norm(norms, norm_type)
        check_nonfinite(total, norm_type, error_if_nonfinite)
        return total
    if not tensors or not torchext_serves(tensors):
        return torch.nn.utils.get_total_norm(tensors, norm_type, error_if_nonfinite, foreach)
    _refuse_foreach(tensors, foreach)
    norms = device_norms(tensors, norm_type)
    total = total_norm_of(list(norms.values()), norm_type, tensors[0].device)
    check_nonfinite(total, norm_type, error_if_nonfinite)
    return total


@torch.no_grad()
def clip_grads_with_norm_(parameters: _TensorOrTensors, max_norm: float, total_norm: Tensor,
                          foreach: bool | None = None) -> None:
    """``torch.nn.utils.clip_grads_with_norm_``: every gradient multiplied by
    ``min(max_norm / (total_norm + 1e-6), 1)`` in place, one fused pass per
    device."""
    grads = [p.grad for p in _as_list(parameters) if p.grad is not None]
    if not grads:
        return
    if _one_call_multiply_(grads, clip_coef(total_norm, max_norm), foreach):
        return
    if not torchext_serves(grads + [total_norm]):
        torch.nn.utils.clip_grads_with_norm_(_as_list(parameters), max_norm, total_norm, foreach)
        return
    _refuse_foreach(grads, foreach)
    multiply_(grads, clip_coef(total_norm, max_norm))


@torch.no_grad()
def clip_grad_norm_(parameters: _TensorOrTensors, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_``: clips the gradients' total norm to
    ``max_norm`` in place and returns the total norm (before clipping), as
    torch does: one fused read for the norms and one fused pass for the
    multiply, per device; no host sync unless ``error_if_nonfinite``."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    else:
        is_generator = isinstance(parameters, types.GeneratorType)
        parameters = list(parameters)
        if is_generator and len(parameters) == 0:
            warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.",
                          stacklevel=3)
    grads = [p.grad for p in parameters if p.grad is not None]
    total_norm = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    if not grads or not _one_call_multiply_(grads, clip_coef(total_norm, max_norm), foreach):
        clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)
    return total_norm
