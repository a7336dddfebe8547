"""Gradient clipping by norm: the machinery shared by the drop-ins
(``torchext.nn.utils``), ``GradScaler.clip_grad_norm_`` /
``clip_and_step`` and ``ASGD.clip_grad_norm_`` / ``clip_and_step``.

A clip is two halves, one function each:

* :func:`measure`: one fused read of an optimizer's gradients
  (``tensor_norms``: the per-tensor norms, of the unscaled gradients with
  the inf/NaN check in the same read when a scaler asks), then torch's own
  arithmetic on the small tensor of norms (:func:`total_norm_of`,
  :func:`reduce_sharded`), so the total norm, its dtype and its device are
  torch's;
* :func:`apply_`: one fused pass that writes ``grad * inv_scale * coef``,
  rounded after each factor as torch's ``unscale_`` then clip store them.

Note [Clip: applied when called, folded only inside one call]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Between two of the user's calls nothing is pending. The two-call clip
(``scaler.clip_grad_norm_(opt, ...)`` or ``opt.clip_grad_norm_(...)``, then
``step``) measures and applies at once, and leaves what torch's recipe
(``unscale_``, ``torch.nn.utils.clip_grad_norm_``) leaves: the gradients
unscaled and clipped, the scaler's record UNSCALED with its inf check.
Whatever user code does next (replace ``.grad``, write through ``.data``,
step pre-hooks, ``add_param_group``, a compiled step) the step uses what the
gradients hold, as in torch. No check could see every such write, so there
is no window to guard.

The fold (the coefficient handed to the fused step instead of a pass that
rewrites the gradients: DeepSpeed's ``engine.step()``) happens only inside
one call, ``clip_and_step``, where no user code runs between the measure
and the step: torchext's ASGD gets two factors (``grad_scale`` then
``clip_coef``, multiplied one after the other in registers, torch's two
roundings at every scale up to 2**127); torch's fused Adam/AdamW/SGD get
``grad_scale = scale / coef`` where that float32 is finite (read on the
host; the pass first otherwise, and always under torch.compile or CUDA-graph
capture); plain optimizers, and any optimizer with step pre-hooks (user code
that would run between the halves), get the pass first. The C++ front end
states the same rule (``csrc/api/clip_grad.h``, under the same title).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.nn.utils import clip_grad as _torch_clip_grad
from torch.optim import optimizer as _torch_optimizer
from torch.utils._foreach_utils import _device_has_foreach_support

from . import _devices
from ._compile_compat import param_groups
from .amp import protocol
from ._grads import GradsByDevice

__all__ = ["torchext_serves", "check_nonfinite", "total_norm_of", "clip_coef",
           "reduce_sharded", "norms_of", "device_norms", "multiply_", "total_norm",
           "clip_with_norm_", "clip_", "TORCH_CLIP_GRAD_NORM_", "TORCH_GET_TOTAL_NORM",
           "TORCH_CLIP_GRADS_WITH_NORM_", "ClipAndStep", "Measured", "measure", "apply_",
           "one_factor", "has_step_pre_hooks"]


def _torch_own(*names: str):
    # torch's function under the first of `names` its clip_grad module has,
    # never one of ours (were they installed there before this import).
    for name in names:
        fn = getattr(_torch_clip_grad, name, None)
        if fn is not None and not getattr(fn, "__module__", "").startswith("torchext"):
            return fn
    raise ImportError(f"torch.nn.utils.clip_grad has none of {names}")


#: torch's own functions, bound when torchext is imported: what the
#: drop-ins fall back to (DTensor or sparse gradients, devices without
#: kernels), so that installed in torch's place they never call themselves.
TORCH_CLIP_GRAD_NORM_ = _torch_own("clip_grad_norm_")
TORCH_GET_TOTAL_NORM = _torch_own("_get_total_norm", "get_total_norm")
TORCH_CLIP_GRADS_WITH_NORM_ = _torch_own("_clip_grads_with_norm_", "clip_grads_with_norm_")


def torchext_serves(tensors: list[Tensor]) -> bool:
    """Whether every tensor is a plain strided tensor on a device with
    torchext kernels (else torch's own function does the work)."""
    return all(type(t) in (Tensor, torch.nn.Parameter) and t.layout is torch.strided
               and _devices.has_kernels(t.device) for t in tensors)


def check_host_read(error_if_nonfinite: bool) -> None:
    """``error_if_nonfinite`` reads the total norm on the host: refused
    where no host read may happen (torch.compile, CUDA-graph capture)."""
    if error_if_nonfinite and (torch.compiler.is_compiling() or (
            torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())):
        raise RuntimeError(
            "error_if_nonfinite=True reads the total norm on the host, which cannot happen "
            "inside torch.compile or a CUDA-graph capture; pass error_if_nonfinite=False "
            "there (a non-finite norm then clips with a coefficient of 0 or NaN, as in torch)")


def check_nonfinite(total_norm: Tensor, norm_type: float, error_if_nonfinite: bool) -> None:
    """torch's ``error_if_nonfinite``: a host read of the total norm (refused
    where none may happen: :func:`check_host_read`)."""
    if not error_if_nonfinite:
        return
    check_host_read(error_if_nonfinite)
    if torch.logical_or(total_norm.isnan(), total_norm.isinf()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from "
            "`parameters` is non-finite, so it cannot be clipped. To disable "
            "this error and scale the gradients by the non-finite norm anyway, "
            "set `error_if_nonfinite=False`")


def total_norm_of(norms: list[Tensor], norm_type: float, device: torch.device) -> Tensor:
    """The norm of the per-tensor norms (one tensor per device), on
    ``device``: torch's ``vector_norm(stack(norms))``."""
    if len(norms) == 1 and norms[0].device == device:  # (one device: no cat, no copy)
        return torch.linalg.vector_norm(norms[0], norm_type)
    return torch.linalg.vector_norm(torch.cat([n.to(device) for n in norms]), norm_type)


def clip_coef(total_norm: Tensor, max_norm: float) -> Tensor | None:
    """torch's clamped clip coefficient ``min(max_norm / (total + 1e-6), 1)``,
    on the device and in the dtype of ``total_norm``; None for
    ``max_norm=inf``, which never clips (torch's arithmetic gives inf/inf =
    NaN there when the norm overflowed, and every gradient would become NaN)."""
    max_norm = float(max_norm)
    if max_norm == math.inf:
        return None
    return torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)


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


def _factor(t: Tensor, device: torch.device) -> Tensor:
    # What unscale_ takes as clip_coef: float32 or float64 (a bf16/fp16 total
    # norm's coefficient is exact in float32), on the tensors' device.
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    return t.to(device, non_blocking=True)


def multiply_(tensors: list[Tensor], inv_scale: Tensor | None, coef: Tensor | None) -> None:
    """tensors = (tensors * inv_scale) * coef in place (either factor may be
    None), rounded to each tensor's dtype after each factor, as torch's
    ``unscale_`` then clip store them: one ``unscale_`` pass per device (its
    inf/NaN check goes to a flag nobody reads), every device's list checked
    before the first is written. No sync."""
    if not tensors or (inv_scale is None and coef is None):
        return
    calls = []
    for device, idx in _devices.indices_by_device(tensors).items():
        inv = (torch.ones((), device=device) if inv_scale is None
               else inv_scale.to(device, non_blocking=True))
        calls.append((_devices.pick(tensors, idx), torch.zeros((), device=device), inv,
                      None if coef is None else _factor(coef, device)))
    unscale = torch.ops.torchext.unscale_
    if len(calls) > 1 and not torch.compiler.is_compiling():
        for ts, found, inv, c in calls[1:]:  # (each call checks its own list in full)
            unscale.default.redispatch(_META, ts, found, inv, c)
    for ts, found, inv, c in calls:
        unscale(ts, found, inv, c)


_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def _refuse_foreach(tensors: list[Tensor], foreach: bool | None) -> None:
    # torch's own error for foreach=True on a device without foreach kernels.
    if foreach:
        for device in _devices.indices_by_device(tensors):
            if not _device_has_foreach_support(device):
                raise RuntimeError(f"foreach=True was passed, but can't use the foreach API on "
                                   f"{device.type} tensors")


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


def _one_call_multiply_(grads: list[Tensor], factor: Tensor, foreach: bool | None) -> bool:
    """grads *= factor in one ``unscale_`` call when the op takes the whole
    list (it checks every tensor before it writes any); False, having
    written nothing, when it does not."""
    if torch.compiler.is_compiling() or type(factor) is not Tensor:
        return False
    device = grads[0].device
    try:
        torch.ops.torchext.unscale_(grads, torch.zeros((), device=device),
                                    torch.ones((), device=device), _factor(factor, device))
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False
    _refuse_foreach(grads[:1], foreach)
    return True


def total_norm(tensors: list[Tensor], norm_type: float, error_if_nonfinite: bool,
               foreach: bool | None) -> Tensor:
    """torch's ``get_total_norm``, one fused read per device (torch's own
    function for what torchext has no kernel for)."""
    norms = _one_call_norms(tensors, norm_type, foreach) if tensors else None
    if norms is not None:
        total = torch.linalg.vector_norm(norms, norm_type)
        check_nonfinite(total, norm_type, error_if_nonfinite)
        return total
    if not tensors or not torchext_serves(tensors):
        return TORCH_GET_TOTAL_NORM(tensors, norm_type, error_if_nonfinite, foreach)
    _refuse_foreach(tensors, foreach)
    norms = device_norms(tensors, norm_type)
    total = total_norm_of(list(norms.values()), norm_type, tensors[0].device)
    check_nonfinite(total, norm_type, error_if_nonfinite)
    return total


def clip_with_norm_(parameters: list[Tensor], max_norm: float, total: Tensor,
                    foreach: bool | None) -> None:
    """torch's ``clip_grads_with_norm_``: the parameters' gradients times the
    clip coefficient, in place, one fused pass per device."""
    grads = [g for p in parameters if (g := p.grad) is not None]  # (one .grad read each)
    coef = clip_coef(total, max_norm) if grads else None
    if coef is None or _one_call_multiply_(grads, coef, foreach):
        return
    if not torchext_serves(grads + [total]):
        TORCH_CLIP_GRADS_WITH_NORM_(parameters, max_norm, total, foreach)
        return
    _refuse_foreach(grads, foreach)
    multiply_(grads, None, coef)


def clip_(parameters: list[Tensor], max_norm: float, norm_type: float,
          error_if_nonfinite: bool, foreach: bool | None = None) -> Tensor:
    """torch's ``clip_grad_norm_`` over a list of parameters, in place: one
    fused read for the norms and one fused pass for the multiply per
    device; returns the total norm (before clipping)."""
    with torch.no_grad():
        grads = [g for p in parameters if (g := p.grad) is not None]  # (one .grad read each)
        total = total_norm(grads, float(norm_type), error_if_nonfinite, foreach)
        coef = clip_coef(total, max_norm) if grads else None
        if coef is not None and not _one_call_multiply_(grads, coef, foreach):
            clip_with_norm_(parameters, max_norm, total, foreach)
        return total




# ------------------------------------------------- the two halves of a clip
# (Note [Clip: applied when called, folded only inside one call] above)

class ClipAndStep(NamedTuple):
    """What ``clip_and_step`` returns: the total norm (before clipping, as
    ``clip_grad_norm_`` returns it) and what the optimizer's ``step()``
    returned (None when a scaler skipped it)."""
    total_norm: Tensor
    result: Any


class Measured(NamedTuple):
    """One read of one or more optimizers' gradients: the total norm over
    all of them (None when none has a gradient); per optimizer, the inf/NaN
    check of the read (found_inf per device; None where no scale was given)
    and its gradients (:class:`GradsByDevice`, for :func:`apply_`; None when
    read through torchext's C++ holders)."""
    total: Tensor | None
    found: list
    grads: list


def measure(reads: list[tuple[Any, Tensor | None]], norm_type: float, allow_fp16: bool,
            sharded_group=None) -> Measured:
    """The measuring half of a clip: ``reads`` is ``(optimizer, inv_scale)``
    pairs, ``inv_scale`` None for gradients already unscaled (no inf check
    then). One fused read per optimizer and device; refuses bad gradients
    (fp16 without ``allow_fp16``, with unscale_'s error) before anything is
    written. With sharded (DTensor) gradients the total is the global norm,
    all-reduced over ``sharded_group()`` (a callable, asked only then)."""
    norms: list[Tensor] = []
    found: list = []
    grads_of: list = []
    sharded = False
    first_device = None
    for optimizer, inv_scale in reads:
        own = protocol.fused_norms(optimizer, norm_type, inv_scale, allow_fp16)
        if own is not None:  # torchext's ASGD: through its C++ holders, no list
            own_norms, own_found = own
            norms.extend(own_norms)
            found.append(own_found)
            grads_of.append(None)
            if own_norms and first_device is None:
                first_device = own_norms[0].device
            continue
        grads = GradsByDevice(optimizer, allow_fp16)
        grads_of.append(grads)
        lists = grads.norm_lists
        if grads.sharded:  # an empty local shard adds nothing to the global norm
            sharded = True
            lists = {d: [t for t in ts if t.numel()] for d, ts in lists.items()}
        if lists and first_device is None:
            first_device = next(iter(lists))
        checked = grads.each_device(
            lambda device, ts, f: norms.append(norms_of(
                ts, norm_type, device, inv_scale, None if inv_scale is None else f)), lists)
        found.append(checked if inv_scale is not None else None)
    if first_device is None:
        return Measured(None, found, grads_of)
    with torch.no_grad():
        total = total_norm_of(norms, norm_type, first_device)
        if sharded:
            total = reduce_sharded(total, norm_type, sharded_group())
    return Measured(total, found, grads_of)


def apply_(optimizer, grads: GradsByDevice | None, inv_scale: Tensor | None,
           coef: Tensor | None) -> None:
    """The applying half: the optimizer's gradients (``grads``, or gathered
    now when the read went through the holders) times ``inv_scale`` then
    ``coef`` in place, one fused pass per device, rounded after each factor
    as torch's ``unscale_`` then clip store them. Either factor may be None."""
    if inv_scale is None and coef is None:
        return
    if grads is None:
        grads = GradsByDevice(optimizer, allow_fp16=True)
    for param, coalesced in grads.coalesced:
        param.grad = coalesced
    with torch.no_grad():
        multiply_(grads.all(), inv_scale, coef)


def one_factor(scale: Tensor | None, coef: Tensor, may_read_host: bool) -> Tensor | None:
    """The one ``grad_scale`` that carries an unscale and a clip into a
    one-factor fused step (torch's fused Adam/AdamW/SGD divide by it):
    ``scale / coef`` (``1 / coef`` for unscaled gradients) when that float32
    is finite, within two float32 roundings of torch's recipe. None when it
    is not (2**127 / 0.1 overflows, and the step would be a silent zero) or
    cannot be read on the host (torch.compile, CUDA-graph capture): the
    caller then applies the pass first."""
    if not may_read_host:
        return None
    coef32 = coef.float().to(scale.device if scale is not None else coef.device,
                             non_blocking=True)
    folded = coef32.reciprocal() if scale is None else scale / coef32
    return folded if bool(torch.isfinite(folded)) else None


def has_step_pre_hooks(optimizer) -> bool:
    """Whether user code would run between the two halves of a fold (torch's
    global or per-instance optimizer step pre-hooks): ``clip_and_step`` then
    applies the clip to the gradients first, so the hooks see torch's values."""
    return bool(_torch_optimizer._global_optimizer_pre_hooks
                or getattr(optimizer, "_optimizer_step_pre_hooks", None))


def clip_optimizers_(optimizers: list, max_norm: float, norm_type: float,
                     error_if_nonfinite: bool, foreach: bool | None) -> Tensor:
    """The clip of a disabled scaler (nothing is scaled): torchext's ASGD
    clips its own gradients (through its holders); anything else, or
    several optimizers at once, the drop-in over every parameter."""
    if len(optimizers) == 1 and getattr(optimizers[0], protocol.STEP, False) and hasattr(
            optimizers[0], "clip_grad_norm_"):
        return optimizers[0].clip_grad_norm_(max_norm, norm_type, error_if_nonfinite, foreach)
    params = [p for opt in optimizers for g in param_groups(opt) for p in g["params"]]
    return clip_(params, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_and_step_plain(optimizer, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                        step_kwargs: dict) -> ClipAndStep:
    """``clip_and_step`` with nothing scaled (a disabled scaler): torchext's
    ASGD's own, else the drop-in clip then the optimizer's step."""
    own = getattr(optimizer, "clip_and_step", None)
    if own is not None and getattr(optimizer, protocol.STEP, False):
        return own(max_norm, norm_type, error_if_nonfinite, **step_kwargs)
    total = clip_optimizers_([optimizer], max_norm, norm_type, error_if_nonfinite, None)
    return ClipAndStep(total, optimizer.step(**step_kwargs))
