"""How torchext's GradScaler steps an optimizer: the fused-step protocol.

A scaler has two ways to step an optimizer whose gradients were scaled:

* **plain** (torch's rule for most optimizers): unscale the gradients in
  place, check them for inf/NaN, read the result on the host, and call
  ``optimizer.step()`` only when they are finite. An overflowed step is one
  where ``step()`` was not called, which is what LR schedulers, accelerate's
  ``optimizer_step_was_skipped`` and the HF Trainer look at.
* **fused**: check the gradients (read-only), then hand the optimizer the
  scale and the check's result as the attributes ``grad_scale`` and
  ``found_inf`` and call ``step()``: the optimizer unscales on the fly and
  makes the whole step a no-op on the device when ``found_inf != 0``. One pass
  over the gradients less, and no host read (torch's
  ``_step_supports_amp_scaling`` contract, used by its fused Adam/SGD).

An optimizer opts into the fused step for **torchext's** scaler by defining

* ``_torchext_amp_step = True``: its ``step()`` honours ``grad_scale`` and
  ``found_inf`` as above, and ``clip_coef`` (the clip coefficient of
  ``GradScaler.clip_and_step``, a 0-d float32/float64 tensor or None: the
  unscaled gradients are then multiplied by it, a second factor after
  ``1 / grad_scale``, never folded into it: Note [Clip: applied when
  called, folded only inside one call] in ``torchext/_clip.py``); and
  ``clip_grad_norm_(max_norm, norm_type, error_if_nonfinite, foreach)`` and
  ``clip_and_step(max_norm, norm_type, error_if_nonfinite, closure=None)``,
  its own clips for when nothing is scaled;
* optionally ``_torchext_amp_check(self, allow_fp16) -> dict[device, Tensor]
  | None``: its own read-only inf/NaN check of every gradient (found_inf per
  device, 0-d float32 tensors set to nonzero on inf/NaN; fp16 gradients
  refused unless ``allow_fp16``, with unscale_'s ValueError), or None to let
  the scaler gather the gradients itself. torchext's ASGD checks through
  the C++ holders of its state (no list from Python).
* optionally ``_torchext_amp_norms(self, norm_type, inv_scale, allow_fp16)``:
  the clip's read (``torchext/_clip.py``, ``measure``): ``(norms, found_inf
  per device)``, the per-tensor norms of every gradient (a list of 1-D
  tensors; of the unscaled gradients with ``inv_scale``, and then with the
  inf/NaN check of the same read, else None), or None to let the scaler
  gather the gradients itself.

Even then torchext's scaler reads ``found_inf`` on the host and does not call
``step()`` on an overflow, as torch does for plain optimizers, unless no host
read may happen:

* while ``torch.compile`` traces (the skip becomes part of the graph),
* while a CUDA graph is being captured,
* when the optimizer says so with torch's ``_step_supports_amp_scaling``
  (torchext's ASGD: ``capturable=True``; torch's fused optimizers always).

Then ``step()`` is always called and the skip is decided on the device. The
trade-off: one host read of ``found_inf`` per eager step (free on the CPU, a
sync on CUDA), which torch's own scaler already pays for every plain
optimizer, in exchange for behaving exactly like ``torch.optim.ASGD`` inside
training frameworks. Foreign scalers (``torch.amp.GradScaler``) only see
``_step_supports_amp_scaling``, so for them torchext's ASGD is a plain
optimizer unless ``capturable=True``.

The C++ API follows the same protocol (``torchext::amp::FusedAmpStep``,
csrc/include/torchext/amp/fused_step.h).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["STEP", "CHECK", "NORMS", "takes_grad_scale", "torch_fused", "host_read_allowed",
           "must_not_sync", "fused_check", "fused_norms", "step_unless_overflow"]

#: The protocol's names (single underscore, as torch's own
#: ``_step_supports_amp_scaling``).
STEP, CHECK, NORMS = "_torchext_amp_step", "_torchext_amp_check", "_torchext_amp_norms"


def takes_grad_scale(optimizer: Any) -> bool:
    """Whether ``optimizer.step()`` honours ``grad_scale``/``found_inf``."""
    return bool(getattr(optimizer, STEP, False)
                or getattr(optimizer, "_step_supports_amp_scaling", False))


def torch_fused(optimizer: Any) -> bool:
    """Whether torch's own scaler would step ``optimizer`` fused (its
    ``_step_supports_amp_scaling``): torch then steps fp16 gradients, and a
    no-op when there is none; any other optimizer it unscales first, which
    refuses both. torchext's scaler keeps torch's answers for each."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def host_read_allowed() -> bool:
    """False while torch.compile traces or a CUDA graph is being captured."""
    if torch.compiler.is_compiling():
        return False
    # (is_initialized: no capture without CUDA, and is_available costs a
    # driver query per step)
    return not (torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())


def must_not_sync(optimizer: Any) -> bool:
    """Whether the skip must be decided on the device (no host read)."""
    return not host_read_allowed() or torch_fused(optimizer)


def fused_check(optimizer: Any, allow_fp16: bool) -> dict[torch.device, Tensor] | None:
    """The optimizer's own read-only check, when it has one."""
    check = getattr(optimizer, CHECK, None)
    return None if check is None else check(allow_fp16)


def fused_norms(optimizer: Any, norm_type: float, inv_scale: Tensor | None, allow_fp16: bool):
    """The optimizer's own read for the clip, when it has one."""
    norms = getattr(optimizer, NORMS, None)
    return None if norms is None else norms(norm_type, inv_scale, allow_fp16)


_MISSING = object()


def step_unless_overflow(optimizer: Any, step, found_inf: Tensor, device_skip: bool,
                         attrs=None):
    """The skip protocol, written once for torchext's Python (GradScaler's
    fused and plain steps, the apex layer's ``amp.initialize`` optimizers;
    C++'s is ``GradScaler::step``): returns ``(called, what step() returned)``.

    Without ``device_skip`` the overflow is read on the host (one read of
    ``found_inf``, a 0-d tensor summed over devices) and ``step`` is not
    called when it is nonzero: an overflowed step is one the optimizer never
    saw, as torch's scaler has it. With ``device_skip`` (no host read may
    happen, or the optimizer decides the skip itself) ``step`` is always
    called with ``optimizer.found_inf`` set, and skips on the device.
    ``attrs()`` (called only when the step is: it may prepare it) gives the
    attributes (``grad_scale``, ``clip_coef``) set on the optimizer for the
    call; afterwards they are gone, as torch's scaler deletes them (a
    ``grad_scale`` the user had set too), except when the step raised: then
    the optimizer's own values are as they were."""
    if not device_skip and found_inf.item():
        return False, None
    attrs = {} if attrs is None else attrs()
    if device_skip:
        attrs["found_inf"] = found_inf
    before = {k: getattr(optimizer, k, _MISSING) for k in attrs}
    for k, v in attrs.items():
        setattr(optimizer, k, v)
    try:
        retval = step()
    except BaseException:
        for k, v in before.items():
            if v is _MISSING:
                delattr(optimizer, k)
            else:
                setattr(optimizer, k, v)
        raise
    for k in attrs:
        delattr(optimizer, k)
    return True, retval
