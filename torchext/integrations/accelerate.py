"""torchext's GradScaler inside HF accelerate (and the HF Trainer, which
trains through accelerate).

accelerate builds a ``torch.amp.GradScaler`` itself for ``mixed_precision=
"fp16"`` (only on devices with fp16 autocast: not on the CPU) and has no
argument for another one. ``torchext.optim.ASGD`` needs nothing: with
accelerate's scaler it behaves as ``torch.optim.ASGD`` does (the scaler
unscales the gradients, then steps it, or not on an overflow).
:func:`use_torchext_scaler` puts torchext's GradScaler in its place, with the
same settings and state, so that a step without clipping is torchext's fused
one (a read-only inf check, then one update pass that unscales on the fly),
and routes ``accelerator.clip_grad_norm_`` to the scaler's fused clip.

    accelerator = Accelerator(mixed_precision="fp16")
    use_torchext_scaler(accelerator)                   # the one line
    model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)

    trainer = Trainer(model, args, optimizers=(torchext.optim.ASGD(...), None))
    use_torchext_scaler(trainer.accelerator)           # the HF Trainer

(The Trainer builds its Accelerator in ``__init__``, and again for each trial
of ``hyperparameter_search``: there, call it at the end of an overridden
``create_accelerator_and_postprocess``.)

Everything accelerate does with its scaler keeps working: ``backward``,
``clip_grad_norm_``, ``optimizer_step_was_skipped`` (True when
``optimizer.step()`` was not called, as with torch's scaler),
``save_state``/``load_state`` (either scaler's checkpoint loads into the
other), the HF Trainer's ``scaler.pt``.

``accelerator.clip_grad_norm_(parameters, max_norm)`` unscales every
optimizer's gradients, then clips ``parameters``. When ``parameters``' grads
are exactly one prepared optimizer's, it becomes
``scaler.clip_grad_norm_(optimizer, max_norm)``: one read of those grads
gives the total norm and the inf check, and one pass writes them unscaled
and clipped (the other optimizers are unscaled, as accelerate does). It is
the two-call clip, applied when called, not folded into the step: accelerate
and the HF Trainer run user code and callbacks between ``clip_grad_norm_``
and ``optimizer.step()`` (Note [Clip: applied when called, folded only
inside one call], ``torchext/_clip.py``). ``max_norm=inf``, which the HF Trainer passes
on every step when it does not clip, only computes the norm. Anything else
(other parameters, an optimizer already unscaled, FSDP, DeepSpeed, XLA,
Megatron-LM, which clip their own way) is accelerate's own clip, unchanged.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from ..amp import GradScaler, OptState
from ._clip import clips_the_same_grads

__all__ = ["use_torchext_scaler"]


def use_torchext_scaler(accelerator: Any, **kwargs: Any) -> GradScaler | None:
    """Replaces ``accelerator.scaler`` (torch's) by ``torchext.amp.GradScaler``.

    The new scaler gets the old one's device, settings and state (scale,
    growth tracker: ``state_dict``), so it may be called before or after
    ``accelerator.prepare``, between two iterations; optimizers already
    prepared are switched too. ``kwargs`` are torchext's extra options
    (``hysteresis``, ``min_scale``, ``max_scale``, ...); settings from
    accelerate's ``GradScalerKwargs`` carry over.

    It also routes ``accelerator.clip_grad_norm_`` to the scaler's fused clip
    where that is the same clip (the module's docstring says when).

    Returns the new scaler, or None when accelerate runs without one (bf16,
    fp32, fp16 on the CPU, DeepSpeed, ...): then nothing changes, so the
    same script runs everywhere. Calling it again returns the scaler in place.

    Raises:
        TypeError: accelerate's scaler is not a plain ``torch.amp.GradScaler``
            (FSDP's ShardedGradScaler, XLA's or another device's own scaler):
            those stay as they are.
        RuntimeError: called in the middle of an iteration (after
            ``backward``/``unscale_`` and before the optimizer step).
    """
    old = getattr(accelerator, "scaler", None)
    if old is None:
        return None
    if isinstance(old, GradScaler):
        _route_clip_grad_norm(accelerator)
        return old
    if type(old) not in _PLAIN_SCALERS:
        raise TypeError(
            f"use_torchext_scaler replaces a torch.amp.GradScaler; accelerate uses a "
            f"{type(old).__module__}.{type(old).__qualname__} here, which it keeps.")
    # (torch's scaler has no public read of its stages: its own record)
    if any(state["stage"] is not OptState.READY
           for state in getattr(old, "_per_optimizer_states", {}).values()):
        raise RuntimeError(
            "use_torchext_scaler must be called between iterations, not after backward() "
            "or unscale_() and before the optimizer step.")
    new = GradScaler(device=getattr(old, "_device", None), enabled=old.is_enabled(), **kwargs)
    if old.is_enabled():
        new.load_state_dict(old.state_dict())  # settings, scale and growth tracker
    accelerator.scaler = new
    for opt in getattr(accelerator, "_optimizers", ()):
        if getattr(opt, "scaler", None) is old:
            opt.scaler = new
    _route_clip_grad_norm(accelerator)
    return new


def _route_clip_grad_norm(accelerator: Any) -> None:
    """Replaces ``accelerator.clip_grad_norm_`` (on this instance) by
    :func:`_clip_grad_norm_`, which falls back to accelerate's own."""
    from accelerate.utils import DistributedType
    if getattr(accelerator.clip_grad_norm_, "_torchext_routed", False):
        return
    if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED,
                                        DistributedType.XLA, DistributedType.MEGATRON_LM):
        return  # they clip (or unscale) their own way
    unfused = accelerator.clip_grad_norm_
    routed = functools.wraps(unfused)(functools.partial(_clip_grad_norm_, accelerator, unfused))
    routed._torchext_routed = True
    accelerator.clip_grad_norm_ = routed


def _clip_grad_norm_(accelerator: Any, unfused, parameters, max_norm, norm_type=2):
    """accelerate's ``clip_grad_norm_``, fused where it clips exactly one
    optimizer's gradients; accelerate's own otherwise."""
    parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    target = _fused_target(accelerator, parameters)
    if target is None:
        return unfused(parameters, max_norm, norm_type)
    scaler = accelerator.scaler
    optimizer, others = target
    for other in others:  # accelerate unscales every optimizer
        scaler.unscale_(other)
    # (max_norm=inf measures and never clips, also when the norm overflowed)
    return scaler.clip_grad_norm_(optimizer, max_norm, norm_type)


def _fused_target(accelerator: Any, parameters: list) -> tuple[Any, list] | None:
    """(the optimizer whose grads are exactly ``parameters``', the other
    optimizers) when the fused clip is accelerate's clip; else None."""
    scaler = accelerator.scaler
    if not (isinstance(scaler, GradScaler) and scaler.is_enabled() and accelerator.native_amp
            and accelerator.mixed_precision == "fp16"):
        return None  # accelerate does not unscale here: nothing to fuse
    from accelerate.optimizer import AcceleratedOptimizer
    optimizers = []
    for opt in accelerator._optimizers:
        while isinstance(opt, AcceleratedOptimizer):
            opt = opt.optimizer
        if scaler.stage(opt) is not OptState.READY:
            # Unscaled already (accelerate's unscale_, or a clip): accelerate's
            # own clip then raises as it does with torch's scaler.
            return None
        optimizers.append(opt)
    matches = [opt for opt in optimizers if clips_the_same_grads(parameters, opt)]
    if len(matches) != 1:
        return None
    return matches[0], [opt for opt in optimizers if opt is not matches[0]]


def _plain_scalers() -> tuple[type, ...]:
    plain: list[type] = [torch.amp.GradScaler]
    try:  # torch.cuda.amp.GradScaler: torch.amp's with device "cuda" (deprecated)
        import torch.cuda.amp as cuda_amp
        plain.append(cuda_amp.GradScaler)
    except (ImportError, AttributeError):
        pass
    return tuple(plain)


_PLAIN_SCALERS = _plain_scalers()
