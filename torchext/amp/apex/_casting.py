"""Dtype and device helpers shared by the apex layer: the half dtypes, a
model's device, and casting the tensors of nested containers."""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor

HALF_DTYPES = (torch.float16, torch.bfloat16)


def _model_device_type(model: torch.nn.Module) -> str:
    for t in model.parameters():
        return t.device.type
    for t in model.buffers():
        return t.device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


def _apply(value, fn):
    """Applies fn to the tensors in a (nested) list/tuple/dict."""
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, dict):
        items = [(k, _apply(v, fn)) for k, v in value.items()]
        return type(value)(items) if type(value) in (dict, OrderedDict) else dict(items)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_apply(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_apply(v, fn) for v in value)
    return value


def _caster(dtype: torch.dtype):
    def cast(t: Tensor) -> Tensor:
        return t.to(dtype) if t.is_floating_point() else t
    return cast


def _first_tensor(value):
    if isinstance(value, Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _floating_dtypes(value, out: list) -> list:
    if isinstance(value, Tensor):
        if value.is_floating_point():
            out.append(value.dtype)
    elif isinstance(value, dict):
        for v in value.values():
            _floating_dtypes(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _floating_dtypes(v, out)
    return out
