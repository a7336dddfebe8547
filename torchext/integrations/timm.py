"""torchext's GradScaler inside timm: :class:`NativeScaler`.

timm's training loop (``train.py``) scales, clips and steps through a
``NativeScaler`` wrapping a ``torch.amp.GradScaler``. This one is timm's
class with torchext's GradScaler inside: the same call
(``loss_scaler(loss, optimizer, clip_grad=..., need_update=...)``), the same
``state_dict_key`` and checkpoints (``CheckpointSaver``/``resume_checkpoint``
save and restore it; a checkpoint of either class loads into the other).

    loss_scaler = torchext.integrations.timm.NativeScaler(device=device.type)

``torchext.optim.ASGD`` also works with timm's own NativeScaler as it is.
"""
from __future__ import annotations

from typing import Any

from timm.utils import NativeScaler as _TimmNativeScaler

from ..amp import GradScaler

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
