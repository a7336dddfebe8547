"""Optimizers built on torchext's fused ops."""
from . import functional
from .asgd import ASGD
from .averaging import NonMonotonicTrigger, averaged_state_dict

__all__ = ["ASGD", "NonMonotonicTrigger", "averaged_state_dict", "functional"]
