"""Gradient clipping by norm: the machinery shared by the drop-ins
(``torchext.nn.utils``), ``GradScaler.clip_grad_norm_`` and
``ASGD.clip_grad_norm_``, and the one pending clip, :class:`PendingClip`.

torch's recipe (``scaler.unscale_(opt)``, ``clip_grad_norm_``, ``step``)
reads the gradients for the norm and rewrites them twice. torchext's reads
them once (``tensor_norms``: the per-tensor norms, with the inf/NaN check in
the same read) and leaves the multiplies to the step: the clip coefficient
waits in a :class:`PendingClip` until the next step consumes it, where a
fused step (torchext's ASGD, torch's fused Adam/AdamW/SGD) multiplies on
the fly and any other optimizer gets its gradients multiplied in one pass.
Everything between the read and the multiply is torch's own arithmetic on
the small tensor of norms, so the total norm, its dtype and its device are
torch's.

Where a clip is computed, where it waits and where it is applied:

* computed: :func:`total_norm_of` and :func:`clip_coef` on the norms of one
  read (``GradScaler.clip_grad_norm_``, ``ASGD.clip_grad_norm_``);
* waits: in one :class:`PendingClip` per optimizer, the scaler's record of
  that optimizer (``GradScaler._per_optimizer_states[id(opt)]["clip"]``) when
  the clip came through an enabled scaler, else the optimizer's own
  (``ASGD._pending_clip``);
* applied: by the next step (:func:`fold` says how each kind of optimizer
  takes it), or, where the gradients must be as torch's recipe leaves them
  first, by :meth:`PendingClip.apply_`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn.utils import clip_grad as _torch_clip_grad
from torch.utils._foreach_utils import _device_has_foreach_support

from . import _devices

__all__ = ["torchext_serves", "check_nonfinite", "total_norm_of", "clip_coef",
           "reduce_sharded", "norms_of", "device_norms", "multiply_", "total_norm",
           "clip_with_norm_", "clip_", "TORCH_CLIP_GRAD_NORM_", "TORCH_GET_TOTAL_NORM",
           "TORCH_CLIP_GRADS_WITH_NORM_", "PendingClip", "GradsChangedError", "SAME", "REPLACED",
           "WRITTEN", "ClipSlot", "fold", "Factors", "TWO_FACTORS", "ONE_FACTOR"]


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


# ------------------------------------------------------------ the pending clip

class GradsChangedError(RuntimeError):
    """A step was asked to apply a pending clip to gradients written in place
    since the clip measured them."""


#: What :meth:`PendingClip.status` says of the gradients it measured.
SAME, REPLACED, WRITTEN = 0, 1, 2


class PendingClip:
    """A clip (and, through a scaler, an unscale) whose multiplies wait for
    the next step: the one record of a pending clip, in one of two homes (the
    scaler's record of the optimizer when the clip came through an enabled
    GradScaler, else the optimizer's ``_pending_clip``).

    ``optimizer``: the optimizer whose gradients it measured. ``coef``: the
    clip coefficient (a 0-d device tensor, the total norm's dtype; None for
    ``max_norm=inf``, which never clips). ``scaled``: the gradients are
    still multiplied by the loss scale (the scaler's clip read them before
    any unscale). ``seen``: which gradients it measured
    (``torch.classes.torchext.GradsSeen``, one per holder for torchext's
    ASGD; None while torch.compile traces, where nothing can come between a
    clip and its step in the same graph).

    Its whole life, the rule being *a clip applies to the gradients it
    measured, or to nothing*:

    * made by a clip, after everything that can refuse (bad gradients,
      ``error_if_nonfinite``) has passed: a refused clip records nothing;
    * consumed by the next step of its optimizer, exactly once. A fused step
      takes its factors (:func:`fold`); any other optimizer gets its
      gradients multiplied first (:meth:`apply_`). A step that raises before
      it writes keeps it, so a retry over the same gradients applies it once;
      one that multiplied the gradients first has consumed it (the record
      then says the gradients are unscaled, as they are);
    * applied to the gradients as torch's recipe leaves them
      (:meth:`apply_`) when something needs them so: a second clip (which
      then composes as torch's: it measures the clipped gradients, so the
      smaller bound wins), ``state_dict()`` of the optimizer that holds it,
      and the scaler's ``load_state_dict`` (which changes the scale);
    * dropped by the holder's ``zero_grad()`` (ASGD) or ``update()``
      (GradScaler), and when its gradients were replaced or removed since
      (``zero_grad(set_to_none=True)``, a new ``.grad``): it has nothing left
      to apply to, and the step takes the gradients it finds unclipped (with
      a scaler: checked and unscaled afresh);
    * refused (:class:`GradsChangedError`, nothing changed) by a step when a
      gradient it measured was written in place since (a backward that
      accumulated, ``zero_()``, an edit): those are not the gradients it
      measured, and what they hold now cannot be told; so is a second clip
      (torch's would measure the first clip's result plus what was written).
    """
    __slots__ = ("optimizer", "coef", "scaled", "seen")

    def __init__(self, optimizer, coef: Tensor | None, scaled: bool, seen) -> None:
        self.optimizer, self.coef, self.scaled, self.seen = optimizer, coef, scaled, seen

    def status(self) -> int:
        """SAME, REPLACED or WRITTEN: the gradients against those measured
        (SAME while torch.compile traces, or with no record of them)."""
        if self.seen is None or torch.compiler.is_compiling():
            return SAME
        worst = SAME
        for seen in self.seen:
            worst = max(worst, seen.changed())
            if worst == REPLACED:
                break
        return worst

    def valid(self) -> bool:
        """True when it still applies; False when its gradients were replaced
        or removed (drop it); raises :class:`GradsChangedError` when they
        were written in place."""
        status = self.status()
        if status == WRITTEN:
            raise GradsChangedError(
                "a gradient clipped by clip_grad_norm_() was written in place since the "
                "clip measured it (a backward that accumulated into it, zero_grad("
                "set_to_none=False), or an edit), so the pending clip cannot apply to it. "
                "Clip after the last write to the gradients, or drop the pending clip first "
                "(optimizer.zero_grad(), or scaler.update() with a GradScaler). Nothing was "
                "changed.")
        return status == SAME

    def apply_(self, grads: list[Tensor], scale: Tensor | None) -> None:
        """Multiplies ``grads`` (every gradient it measured: for sparse ones,
        their values) in place as torch's recipe leaves them: by
        ``1 / scale`` (float32, as ``unscale_``) when they are still scaled,
        then by ``coef``, rounded after each factor."""
        inv = None
        if self.scaled:
            inv = scale.double().reciprocal().float()
        multiply_(grads, inv, self.coef)


class ClipSlot:
    """Where an optimizer keeps its own :class:`PendingClip` (``pending``).
    A plain object: Dynamo drops attribute writes on a
    ``torch.optim.Optimizer`` made inside compiled code, so a clip consumed
    by a compiled step, written as an optimizer attribute, would stay
    pending; a write on an object the optimizer holds is kept."""

    def __init__(self) -> None:
        self.pending: PendingClip | None = None


#: How an optimizer takes a pending clip at its step (see :func:`fold`).
TWO_FACTORS = "two factors"   # grad_scale and clip_coef (torchext's fused-step protocol)
ONE_FACTOR = "one factor"     # grad_scale only (torch's fused Adam/AdamW/SGD)


class Factors(NamedTuple):
    """What a fused step gets: ``grad_scale`` (the gradients are divided by
    it), ``clip_coef`` (then multiplied by it; two-factor optimizers only),
    and ``rewrite``: True when the pending clip must be applied to the
    gradients first (:meth:`PendingClip.apply_`) because one float32
    ``grad_scale`` cannot carry it."""
    grad_scale: Tensor | None
    clip_coef: Tensor | None
    rewrite: bool


def fold(clip: PendingClip | None, scale: Tensor | None, kind: str,
         may_read_host: bool) -> Factors:
    """The one fold of a pending clip into a fused step, exact at every scale
    torch's scaler reaches (up to 2**127, and FLT_MAX) and every coefficient
    down to float32's smallest normal.

    ``scale``: the scaler's scale, applied when the gradients are still
    scaled (``clip.scaled``, or no clip and a scaled step). Two-factor
    optimizers get both factors, applied one after the other in registers,
    exactly torch's recipe's two multiplies. A one-factor optimizer gets
    ``scale / coef`` when that is a finite float32 (it then divides by it:
    within two float32 roundings of torch's recipe); it is not at large
    scales with small coefficients (2**127 / 0.1 overflows, and the step
    would be a silent zero), and then the gradients are multiplied first
    (``rewrite``) and it gets no ``grad_scale``. Whether it is finite is a
    host read, made only where ``may_read_host`` (eager, not capturing);
    where none may happen (torch.compile, CUDA-graph capture) the gradients
    are always multiplied first: one more pass over them, no sync."""
    if clip is None:
        return Factors(scale, None, False)
    step_scale = scale if clip.scaled else None
    coef = clip.coef
    if coef is None:  # max_norm=inf: an unscale alone
        return Factors(step_scale, None, False)
    if kind == TWO_FACTORS:
        return Factors(step_scale, coef if coef.dtype in (torch.float32, torch.float64)
                       else coef.float(), False)
    if may_read_host:
        coef32 = coef.float().to(step_scale.device if step_scale is not None else coef.device,
                                 non_blocking=True)
        folded = coef32.reciprocal() if step_scale is None else step_scale / coef32
        if bool(torch.isfinite(folded)):
            return Factors(folded, None, False)
    return Factors(None, None, True)
