"""apex's loss scalers (``LossScaler``), each on a torchext GradScaler."""
from __future__ import annotations

from ..grad_scaler import GradScaler

_SCALE_WINDOW = 2000  # apex's growth interval ("scale_seq_len")


class _LossScaler:
    """One loss's scale: a torchext GradScaler, or nothing at all for a static
    scale of 1.0 without master weights (apex's short cut: the loss is
    yielded as ``loss.float()`` and gradients are left alone)."""

    def __init__(self, loss_scale, min_loss_scale, max_loss_scale, master_weights: bool) -> None:
        self.dynamic = loss_scale == "dynamic"
        self._min = min_loss_scale
        self._max = max_loss_scale
        self._master_weights = master_weights
        if self.dynamic:
            init = 2.0 ** 16 if max_loss_scale is None else min(float(max_loss_scale), 2.0 ** 16)
        else:
            init = float(loss_scale)
        self._build(init, 0)

    def _build(self, scale: float, unskipped: int) -> None:
        self.passthrough = False
        if self.dynamic:
            self.scaler = GradScaler(
                init_scale=scale, growth_interval=_SCALE_WINDOW, allow_fp16=True,
                min_scale=None if not self._min else float(self._min),
                max_scale=None if self._max is None else float(self._max))
        elif scale == 1.0 and not self._master_weights:
            self.scaler = None
            self.passthrough = True
            self._static_unskipped = unskipped
            return
        else:
            # A static scale: min == max, so backoff and growth leave it as it is;
            # an overflow still skips the step (apex would apply it).
            self.scaler = GradScaler(init_scale=scale, growth_interval=_SCALE_WINDOW,
                                     allow_fp16=True, min_scale=scale, max_scale=scale)
        if unskipped:
            sd = self.scaler.state_dict()
            sd["_growth_tracker"] = int(unskipped)
            self.scaler.load_state_dict(sd)

    def loss_scale(self) -> float:
        """The current scale as a Python float (a host sync, as in apex)."""
        return 1.0 if self.scaler is None else self.scaler.get_scale()

    # apex's private attribute names, read by many training scripts for logging.
    @property
    def _loss_scale(self) -> float:
        return self.loss_scale()

    @property
    def _unskipped(self) -> int:
        if self.scaler is None:
            return self._static_unskipped
        return self.scaler.state_dict()["_growth_tracker"]

    def load(self, loss_scale: float, unskipped: int) -> None:
        if self.dynamic:
            sd = self.scaler.state_dict()
            sd["scale"] = float(loss_scale)
            sd["_growth_tracker"] = int(unskipped)
            self.scaler.load_state_dict(sd)
        else:
            self._build(float(loss_scale), int(unskipped))
