"""torchext's GradScaler and clips inside PyTorch Lightning:
:class:`MixedPrecision`.

Lightning's ``MixedPrecision`` plugin already takes torchext's scaler
(``scaler=torchext.amp.GradScaler()``), but it clips with
``torch.nn.utils.clip_grad_norm_``, which reads the gradients for the norm
and rewrites them for the multiply. This subclass is the same plugin with
torchext's GradScaler as its default and ``gradient_clip_val`` (norm) routed
to torchext's clips:

    from torchext.integrations.lightning import MixedPrecision
    trainer = pl.Trainer(gradient_clip_val=1.0, plugins=[MixedPrecision("16-mixed", "cuda")])

Which call, and when (Note [Clip: applied when called, folded only inside
one call], ``torchext/_clip.py``):

* ``"16-mixed"`` with torchext's scaler, automatic optimization and the
  LightningModule's default ``configure_gradient_clipping``: the clip is
  folded into the step, ``scaler.clip_and_step(optimizer, clip_val)``.
  Lightning unscales before its hooks (``on_before_optimizer_step`` sees the
  unscaled, unclipped gradients, as with torch's scaler), then clips, then
  steps; the default ``configure_gradient_clipping`` is the last thing
  between the clip and the step, so no user code runs there. One read gives
  the norm; torchext's ASGD multiplies by the coefficient on the fly (its
  gradients are left unclipped), others get one pass.
* ``"16-mixed"`` with an overridden ``configure_gradient_clipping`` (user
  code that runs after the clip), or manual optimization: the two-call clip,
  ``scaler.clip_grad_norm_(optimizer, clip_val)``, applied when called.
* ``"bf16-mixed"`` (no scaler) with ``torchext.optim.ASGD``: its own
  two-call ``clip_grad_norm_`` (one read, one pass).
* Anything else (torch's scaler, clipping by value, grads that were not
  unscaled) is Lightning's own clip, unchanged.

``_step_supports_amp_scaling`` stays False on torchext's ASGD (Lightning
refuses gradient clipping for optimizers that unscale internally).
"""
from __future__ import annotations

from typing import Any, Literal

import pytorch_lightning as pl
from pytorch_lightning.core.optimizer import LightningOptimizer
from pytorch_lightning.plugins import MixedPrecision as _LightningMixedPrecision
from pytorch_lightning.utilities import GradClipAlgorithmType

from ..amp import GradScaler, OptState
from ..optim import ASGD

__all__ = ["MixedPrecision"]


class MixedPrecision(_LightningMixedPrecision):
    """Lightning's ``MixedPrecision`` with torchext's GradScaler (the
    default for ``"16-mixed"``; ``scaler=`` takes any, as Lightning's) and
    torchext's clips by norm (the module's docstring says which, when)."""

    def __init__(self, precision: Literal["16-mixed", "bf16-mixed"], device: str,
                 scaler: Any = None) -> None:
        if scaler is None and precision == "16-mixed":
            scaler = GradScaler(device=device)
        super().__init__(precision, device, scaler)
        self._folding = False  # inside optimizer_step, the clip is to be folded
        self._folded_clip: float | None = None

    def _may_fold(self, optimizer: Any, model: Any) -> bool:
        scaler = self.scaler
        trainer = getattr(model, "trainer", None)
        return (isinstance(scaler, GradScaler) and scaler.is_enabled()
                and isinstance(model, pl.LightningModule) and model.automatic_optimization
                and type(model).configure_gradient_clipping
                is pl.LightningModule.configure_gradient_clipping
                and trainer is not None and trainer.gradient_clip_val
                and trainer.gradient_clip_algorithm in (None, GradClipAlgorithmType.NORM))

    def optimizer_step(self, optimizer: Any, model: Any, closure: Any, **kwargs: Any) -> Any:
        """Lightning's ``optimizer_step`` for ``"16-mixed"``, with the clip
        folded into ``scaler.clip_and_step`` where no user code runs between
        them (see the module's docstring); Lightning's own otherwise."""
        if not self._may_fold(optimizer, model):
            return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        closure_result = closure()
        # (as Lightning: backward skipped in automatic optimization, nothing to step)
        skip = closure_result is None
        if not skip:
            self.scaler.unscale_(optimizer)
        self._folding, self._folded_clip = not skip, None
        try:
            self._after_closure(model, optimizer)  # hooks, then the default clip: recorded
        finally:
            clip_val, self._folding, self._folded_clip = self._folded_clip, False, None
        if skip:
            return closure_result
        if clip_val is None:
            out = self.scaler.step(optimizer, **kwargs)
        else:
            out = self.scaler.clip_and_step(optimizer, clip_val, **kwargs).result
        self.scaler.update()
        return out

    def clip_grad_by_norm(self, optimizer: Any, clip_val: float) -> None:
        if isinstance(optimizer, LightningOptimizer):  # manual optimization passes these
            optimizer = optimizer.optimizer
        scaler = self.scaler
        if self._folding:  # the default configure_gradient_clipping, from optimizer_step
            self._folded_clip = float(clip_val)
            return
        if isinstance(scaler, GradScaler) and scaler.is_enabled():
            if scaler.stage(optimizer) is OptState.UNSCALED:
                scaler.clip_grad_norm_(optimizer, clip_val)
                return
        elif scaler is None and isinstance(optimizer, ASGD):
            optimizer.clip_grad_norm_(clip_val)
            return
        super().clip_grad_by_norm(optimizer, clip_val)
