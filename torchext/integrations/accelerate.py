"""torchext's GradScaler inside HF accelerate (and the HF Trainer, which
trains through accelerate).

accelerate builds a ``torch.amp.GradScaler`` itself for ``mixed_precision=
"fp16"`` (only on devices with fp16 autocast: not on the CPU) and has no
argument for another one. ``torchext.optim.ASGD`` needs nothing: with
accelerate's scaler it behaves as ``torch.optim.ASGD`` does (the scaler
unscales the gradients, then steps it, or not on an overflow).
:func:`use_torchext_scaler` puts torchext's GradScaler in its place, with the
same settings and state, so that a step without clipping is torchext's fused
one (a read-only inf check, then one update pass that unscales on the fly).

    accelerator = Accelerator(mixed_precision="fp16")
    use_torchext_scaler(accelerator)                   # the one line
    model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)

    trainer = Trainer(model, args, optimizers=(torchext.optim.ASGD(...), None))
    use_torchext_scaler(trainer.accelerator)           # the HF Trainer

(The Trainer builds its Accelerator in ``__init__``, and again for each trial
of ``hyperparameter_search``: there, call it at the end of an overridden
``create_accelerator_and_postprocess``.)

Everything accelerate does with its scaler keeps working: ``backward``,
``clip_grad_norm_`` (unscales first), ``optimizer_step_was_skipped`` (True
when ``optimizer.step()`` was not called, as with torch's scaler),
``save_state``/``load_state`` (either scaler's checkpoint loads into the
other), the HF Trainer's ``scaler.pt``.
"""
from __future__ import annotations

from typing import Any

import torch

from ..amp import GradScaler, OptState

__all__ = ["use_torchext_scaler"]


def use_torchext_scaler(accelerator: Any, **kwargs: Any) -> GradScaler | None:
    """Replaces ``accelerator.scaler`` (torch's) by ``torchext.amp.GradScaler``.

    The new scaler gets the old one's device, settings and state (scale,
    growth tracker: ``state_dict``), so it may be called before or after
    ``accelerator.prepare``, between two iterations; optimizers already
    prepared are switched too. ``kwargs`` are torchext's extra options
    (``hysteresis``, ``min_scale``, ``max_scale``, ...); settings from
    accelerate's ``GradScalerKwargs`` carry over.

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
        return old
    if type(old) not in _PLAIN_SCALERS:
        raise TypeError(
            f"use_torchext_scaler replaces a torch.amp.GradScaler; accelerate uses a "
            f"{type(old).__module__}.{type(old).__qualname__} here, which it keeps.")
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
    return new


def _plain_scalers() -> tuple[type, ...]:
    plain: list[type] = [torch.amp.GradScaler]
    try:  # torch.cuda.amp.GradScaler: torch.amp's with device "cuda" (deprecated)
        import torch.cuda.amp as cuda_amp
        plain.append(cuda_amp.GradScaler)
    except (ImportError, AttributeError):
        pass
    return tuple(plain)


_PLAIN_SCALERS = _plain_scalers()
