"""apex's cast decorators and ``register_*_function``: a function run with
autocast off and its floating inputs cast (half, float or promoted)."""
from __future__ import annotations

import functools

import torch

from ._amp_state import _casts_disabled
from ._casting import _apply, _caster, _first_tensor, _floating_dtypes


def _cast_wrapper(fn, mode: str):
    """``fn`` run, under autocast, with autocast off and its floating inputs
    cast: to the autocast dtype ("half"), float32 ("float"), or the widest of
    their dtypes ("promote"). Outside autocast, or under disable_casts, it is
    ``fn`` as is."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t = _first_tensor((args, kwargs))
        if t is None or _casts_disabled() or not torch.is_autocast_enabled(t.device.type):
            return fn(*args, **kwargs)
        device_type = t.device.type
        if mode == "half":
            dtype = torch.get_autocast_dtype(device_type)
        elif mode == "float":
            dtype = torch.float32
        else:
            dtypes = _floating_dtypes((args, kwargs), [])
            if not dtypes:
                return fn(*args, **kwargs)
            dtype = functools.reduce(torch.promote_types, dtypes)
        cast = _caster(dtype)
        with torch.autocast(device_type, enabled=False):
            return fn(*_apply(args, cast), **_apply(kwargs, cast))

    wrapper._torchext_amp_cast = mode
    return wrapper


def _register(module, name: str, mode: str) -> None:
    if not hasattr(module, name):
        raise ValueError(f"No function named {name} in module {module}.")
    fn = getattr(module, name)
    if getattr(fn, "_torchext_amp_cast", None) is not None:
        raise RuntimeError(f"{getattr(module, '__name__', module)}.{name} is already registered "
                           f"as a {fn._torchext_amp_cast} function.")
    setattr(module, name, _cast_wrapper(fn, mode))


def half_function(fn):
    """Decorator (apex's ``amp.half_function``): under autocast, ``fn`` gets
    its floating inputs in the autocast dtype and runs with autocast off."""
    return _cast_wrapper(fn, "half")


def float_function(fn):
    """Decorator (apex's ``amp.float_function``): under autocast, ``fn`` runs
    in float32."""
    return _cast_wrapper(fn, "float")


def promote_function(fn):
    """Decorator (apex's ``amp.promote_function``): under autocast, ``fn``
    gets its floating inputs in the widest of their dtypes."""
    return _cast_wrapper(fn, "promote")


def register_half_function(module, function_name: str) -> None:
    """Under autocast, ``module.function_name`` gets its floating inputs cast
    to the autocast dtype (fp16 on CUDA, bf16 on CPU) and runs with autocast
    off. It wraps the module attribute at once (apex applied it at
    ``initialize``); code that imported the function by name earlier keeps
    the unwrapped one, as in apex."""
    _register(module, function_name, "half")


def register_float_function(module, function_name: str) -> None:
    """Under autocast, ``module.function_name`` runs in float32 (see
    :func:`register_half_function`)."""
    _register(module, function_name, "float")


def register_promote_function(module, function_name: str) -> None:
    """Under autocast, ``module.function_name`` gets its floating inputs cast
    to the widest of their dtypes (see :func:`register_half_function`)."""
    _register(module, function_name, "promote")
