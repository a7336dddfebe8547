"""Automatic mixed precision on torchext's ops: a drop-in ``GradScaler``,
and NVIDIA apex's ``amp`` API (``initialize``, ``scale_loss``, ...) built on it."""
from .grad_scaler import GradScaler, OptState
from .apex import (disable_casts, float_function, half_function, initialize, load_state_dict,
                   master_params, promote_function, register_float_function,
                   register_half_function, register_promote_function, reset, scale_loss,
                   state_dict)

__all__ = ["GradScaler", "OptState", "initialize", "scale_loss", "master_params", "state_dict",
           "load_state_dict", "disable_casts", "register_half_function",
           "register_float_function", "register_promote_function", "half_function",
           "float_function", "promote_function", "reset"]
