"""Gradient clipping by norm: drop-ins for ``torch.nn.utils.clip_grad_norm_``,
``get_total_norm`` and ``clip_grads_with_norm_``, with torch's signatures,
results, dtypes and devices.

torch computes every gradient's norm (``torch._foreach_norm``: on the CPU one
``linalg.vector_norm`` call per tensor), the norm of those norms, the
coefficient ``min(max_norm / (total + 1e-6), 1)``, then multiplies every
gradient by it. Here the per-tensor norms are one op call per device
(``tensor_norms``: one read of the gradients, chunks over all tensors and
threads) and the multiply is one more (``unscale_``, the in-place multiply by
a device scalar); everything between is torch's own arithmetic on the small
tensor of norms. No host sync, unless ``error_if_nonfinite`` asks for one, as
in torch. One difference: ``max_norm=inf`` never clips (torch multiplies by
inf/inf = NaN when the norm overflowed).

Inputs torchext has no kernel for (DTensor or sparse gradients, devices other
than CPU/CUDA) go to torch's own functions as they were when torchext was
imported, so the drop-ins can be installed in torch's place
(``torch.nn.utils.clip_grad_norm_ = torchext.nn.utils.clip_grad_norm_``, as
code that speeds up a model it does not own does) without calling
themselves. The machinery is ``torchext/_clip.py``.
"""
from __future__ import annotations

import types
import warnings
from typing import Iterable

import torch
from torch import Tensor

from ... import _clip

__all__ = ["clip_grad_norm_", "clip_grads_with_norm_", "get_total_norm"]

_TensorOrTensors = Tensor | Iterable[Tensor]


def _as_list(tensors: _TensorOrTensors) -> list[Tensor]:
    return [tensors] if isinstance(tensors, Tensor) else list(tensors)


@torch.no_grad()
def get_total_norm(tensors: _TensorOrTensors, norm_type: float = 2.0,
                   error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """``torch.nn.utils.get_total_norm``: the norm of the tensors' norms, as
    if they were concatenated into one vector; same dtype and device (the
    first tensor's) as torch's, one fused read per device."""
    return _clip.total_norm(_as_list(tensors), float(norm_type), error_if_nonfinite, foreach)


@torch.no_grad()
def clip_grads_with_norm_(parameters: _TensorOrTensors, max_norm: float, total_norm: Tensor,
                          foreach: bool | None = None) -> None:
    """``torch.nn.utils.clip_grads_with_norm_``: every gradient multiplied by
    ``min(max_norm / (total_norm + 1e-6), 1)`` in place, one fused pass per
    device. A generator is read once."""
    _clip.clip_with_norm_(_as_list(parameters), max_norm, total_norm, foreach)


@torch.no_grad()
def clip_grad_norm_(parameters: _TensorOrTensors, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_``: clips the gradients' total norm to
    ``max_norm`` in place and returns the total norm (before clipping), as
    torch does: one fused read for the norms and one fused pass for the
    multiply, per device; no host sync unless ``error_if_nonfinite``."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    else:
        is_generator = isinstance(parameters, types.GeneratorType)
        parameters = list(parameters)
        if is_generator and len(parameters) == 0:
            warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.",
                          stacklevel=3)
    return _clip.clip_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)
