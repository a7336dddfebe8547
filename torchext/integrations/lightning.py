"""torchext's GradScaler and fused gradient clip inside PyTorch Lightning:
:class:`MixedPrecision`.

Lightning's ``MixedPrecision`` plugin already takes torchext's scaler
(``scaler=torchext.amp.GradScaler()``), but it clips with
``torch.nn.utils.clip_grad_norm_``, which reads the gradients for the norm
and rewrites them for the multiply. This subclass is the same plugin with
torchext's GradScaler as its default and ``gradient_clip_val`` (norm) routed
to torchext's fused clip:

    from torchext.integrations.lightning import MixedPrecision
    trainer = pl.Trainer(gradient_clip_val=1.0, plugins=[MixedPrecision("16-mixed", "cuda")])

* ``"16-mixed"`` with torchext's scaler: Lightning unscales the gradients
  before its clip hooks, so the clip is ``scaler.clip_grad_norm_(optimizer,
  clip_val)``: one read gives the norm and the clip coefficient is folded
  into the scaler's step (a fused-step optimizer such as
  ``torchext.optim.ASGD`` multiplies by it on the fly; others get one
  multiply, as torch's clip). The gradients are left unscaled, not clipped.
* ``"bf16-mixed"`` (no scaler) with ``torchext.optim.ASGD``: its own
  ``clip_grad_norm_``, folded into its next step.
* Anything else (torch's scaler, clipping by value, grads that were not
  unscaled, as in manual optimization) is Lightning's own clip, unchanged.

``_step_supports_amp_scaling`` stays False on torchext's ASGD (Lightning
refuses gradient clipping for optimizers that unscale internally).
"""
from __future__ import annotations

from typing import Any, Literal

from pytorch_lightning.core.optimizer import LightningOptimizer
from pytorch_lightning.plugins import MixedPrecision as _LightningMixedPrecision

from ..amp import GradScaler, OptState
from ..optim import ASGD

__all__ = ["MixedPrecision"]


class MixedPrecision(_LightningMixedPrecision):
    """Lightning's ``MixedPrecision`` with torchext's GradScaler (the
    default for ``"16-mixed"``; ``scaler=`` takes any, as Lightning's) and
    torchext's fused clip by norm (the module's docstring says when)."""

    def __init__(self, precision: Literal["16-mixed", "bf16-mixed"], device: str,
                 scaler: Any = None) -> None:
        if scaler is None and precision == "16-mixed":
            scaler = GradScaler(device=device)
        super().__init__(precision, device, scaler)

    def clip_grad_by_norm(self, optimizer: Any, clip_val: float) -> None:
        if isinstance(optimizer, LightningOptimizer):  # manual optimization passes these
            optimizer = optimizer.optimizer
        scaler = self.scaler
        if isinstance(scaler, GradScaler) and scaler.is_enabled():
            if scaler.stage(optimizer) is OptState.UNSCALED:
                scaler.clip_grad_norm_(optimizer, clip_val)
                return
        elif scaler is None and isinstance(optimizer, ASGD):
            optimizer.clip_grad_norm_(clip_val)  # folded into its next step
            return
        super().clip_grad_by_norm(optimizer, clip_val)
