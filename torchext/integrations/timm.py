"""torchext's GradScaler inside timm: :class:`NativeScaler`.

timm's training loop (``train.py``) scales, clips and steps through a
``NativeScaler`` wrapping a ``torch.amp.GradScaler``. This one is timm's
class with torchext's GradScaler inside: the same call
(``loss_scaler(loss, optimizer, clip_grad=..., need_update=...)``), the same
``state_dict_key`` and checkpoints (``CheckpointSaver``/``resume_checkpoint``
save and restore it; a checkpoint of either class loads into the other).

    loss_scaler = torchext.integrations.timm.NativeScaler(device=device.type)

With ``clip_grad=...`` and ``clip_mode="norm"`` (timm's ``--clip-grad``),
where ``parameters``' gradients are exactly the optimizer's, timm's
``unscale_`` + ``clip_grad_norm_`` + ``step`` becomes
``scaler.clip_and_step(optimizer, clip_grad)``: timm's ``__call__`` does
backward, clip and step in one call, so no user code runs between the clip
and the step, and the clip can be folded into a fused step (one read gives
the norm and the inf check; torchext's ASGD multiplies by the coefficient
on the fly). The other modes ("value", "agc") and other parameters are
timm's own, unchanged.

``torchext.optim.ASGD`` also works with timm's own NativeScaler as it is.
"""
from __future__ import annotations

from typing import Any

import torch

from timm.utils import NativeScaler as _TimmNativeScaler
from timm.utils import dispatch_clip_grad

from ..amp import GradScaler, OptState
from ._clip import clips_the_same_grads

__all__ = ["NativeScaler"]


class NativeScaler(_TimmNativeScaler):
    """timm's ``NativeScaler`` on ``torchext.amp.GradScaler``.

    Args:
        device: as timm's (``"cuda"``, ``"cpu"``, ...), except that the
            default None takes the device from the first loss.
        **kwargs: ``torchext.amp.GradScaler``'s options (``init_scale``,
            ``growth_interval``, ``hysteresis``, ...).
    """

    def __init__(self, device: str | None = None, **kwargs: Any) -> None:
        # timm's __init__ only builds a torch.amp.GradScaler (which warns and
        # disables itself for "cuda" without a GPU): not called.
        self._scaler = GradScaler(device=device, **kwargs)

    def __call__(self, loss, optimizer, clip_grad=None, clip_mode="norm", parameters=None,
                 create_graph=False, need_update=True):
        """timm's ``NativeScaler.__call__``, with the fused clip by norm."""
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if not need_update:
            return
        if clip_grad is not None:
            assert parameters is not None
            parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            if clip_mode == "norm" and self._fuses_clip(optimizer, parameters):
                self._scaler.clip_and_step(optimizer, clip_grad)
                self._scaler.update()
                return
            self._scaler.unscale_(optimizer)
            dispatch_clip_grad(parameters, clip_grad, mode=clip_mode)
        self._scaler.step(optimizer)
        self._scaler.update()

    def _fuses_clip(self, optimizer, parameters) -> bool:
        # The fused clip is timm's when it clips the same gradients, not
        # yet unscaled (else timm's unscale_ raises, as it should).
        if not self._scaler.is_enabled():
            return False
        return (self._scaler.stage(optimizer) is OptState.READY
                and clips_the_same_grads(parameters, optimizer))
