"""The process-wide state of the apex layer (apex's ``_amp_state``), and the
per-thread ``disable_casts`` depth."""
from __future__ import annotations

import threading
from typing import Any

import torch


class _AmpState:
    """Process-wide state, as apex's ``_amp_state``
    (``_amp_state.loss_scalers[i].loss_scale()``). Each :func:`initialize`
    call adds its models, optimizers and undo steps, and replaces the loss
    scalers and properties."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.initialized = False
        self.opt_properties: dict[str, Any] | None = None
        self.verbosity = 1
        self.loss_scalers: list = []  # scaler._LossScaler, one per loss
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.undo: list[Any] = []  # callables that undo initialize's patches, in order

    def mark(self) -> tuple[int, int, int]:
        """Where a new initialize call starts (see :meth:`rollback`)."""
        return len(self.undo), len(self.models), len(self.optimizers)

    def rollback(self, mark: tuple[int, int, int] = (0, 0, 0)) -> None:
        """Undoes the patches made, and forgets the models and optimizers
        added, since ``mark`` (by default: all of them)."""
        n_undo, n_models, n_opts = mark
        for undo in reversed(self.undo[n_undo:]):
            undo()
        for opt in self.optimizers[n_opts:]:
            opt.__dict__.pop("_torchext_amp", None)
        del self.undo[n_undo:], self.models[n_models:], self.optimizers[n_opts:]


_amp_state = _AmpState()
_local = threading.local()  # disable_casts() depth, per thread like autocast


def _casts_disabled() -> bool:
    return getattr(_local, "disabled", 0) > 0


def _require_state(what: str) -> _AmpState:
    if not _amp_state.initialized:
        raise RuntimeError(
            f"Invoked {what}, but amp has not been initialized. "
            "model, optimizer = amp.initialize(model, optimizer, opt_level=...) must be called "
            f"before {what}.")
    return _amp_state
