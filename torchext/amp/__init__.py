"""Automatic mixed precision on torchext's ops: a drop-in ``GradScaler``."""
from .grad_scaler import GradScaler, OptState

__all__ = ["GradScaler", "OptState"]
