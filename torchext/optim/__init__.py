"""Optimizers built on torchext's fused ops."""
from . import functional
from .asgd import ASGD

__all__ = ["ASGD", "functional"]
