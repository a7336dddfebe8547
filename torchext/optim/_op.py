"""``torch.ops.torchext.asgd_`` as Python calls it.

Python reads the names of the op's hyperparameters from its registered
schema (``csrc/ops/schemas.cpp``), so a hyperparameter added there reaches
the optimizer (which takes it from the param group of the same name)
without a second list here. C++ keeps their order in one place,
``ASGDHyperparams`` (csrc/ops/asgd_args.h, checked against the schema's
names), which also reads the values :func:`hyper_list` gives the holder.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["HYPER", "hyper_of", "hyper_list", "lr_tensor", "call", "validate"]

_LISTS = torch.ops.torchext.asgd_.default
_PACKED = torch.ops.torchext.asgd_.packed
# The op's Meta kernel is its validation alone: called with real tensors it
# checks them exactly as the CPU/CUDA kernels do, and touches no data.
_VALIDATE_ONLY = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)

_NOT_HYPER = ("lr", "grad_scale", "found_inf", "clip_coef", "rounding_seed", "rounding_ids",
              "rounding_offsets")
_ARGS = [a for a in _LISTS._schema.arguments if a.kwarg_only and a.name not in _NOT_HYPER]
#: The op's scalar hyperparameters, in schema order (lambd, alpha, t0, ...).
HYPER: tuple[str, ...] = tuple(a.name for a in _ARGS)
_CAST = {a.name: (bool if str(a.type) == "bool" else float) for a in _ARGS}


def hyper_of(source: dict[str, Any], **override: Any) -> dict[str, Any]:
    """The op's hyperparameters, read from a param group (or any dict with
    the same names), each cast to the schema's type."""
    return {name: _CAST[name](override[name] if name in override else source[name])
            for name in HYPER}


def hyper_list(hyper: dict[str, Any]) -> list[float]:
    """The same, as a list in schema order, bools as 0/1 (what the C++ holder
    takes: ``ASGDHyperparams::from_values``)."""
    return [float(hyper[name]) for name in HYPER]


def lr_tensor(lr: float | Tensor, device: torch.device | None = None) -> Tensor:
    """The op's ``lr``: a tensor lr as it is; a float as a float64 0-d
    tensor, on the CPU in eager mode (the kernels read a CPU lr on the host:
    no sync, no copy), on the params' device while torch.compile traces (a
    constant of the graph, which a CUDA graph then holds on the device)."""
    if isinstance(lr, Tensor):
        return lr
    if device is not None and torch.compiler.is_compiling():
        return torch.tensor(float(lr), dtype=torch.float64, device=device)
    return torch.tensor(float(lr), dtype=torch.float64)


def _overload(lists) -> Any:
    # The schedule state as lists of 0-d tensors, or packed (one tensor each).
    return _PACKED if isinstance(lists[5], Tensor) else _LISTS


def call(lists: list, lr: float | Tensor, hyper: dict[str, Any],
         grad_scale: Tensor | None, found_inf: Tensor | None,
         clip_coef: Tensor | None = None, rounding: dict[str, Any] | None = None) -> None:
    """One ``asgd_`` call over [params, grads, axs, mus, etas, steps] (the
    last three lists of 0-d tensors, or packed 1-D tensors). ``rounding``:
    the op's ``rounding_*`` arguments (stochastic rounding), or None."""
    device = lists[0][0].device if lists[0] else None
    _overload(lists)(*lists, lr=lr_tensor(lr, device), **hyper, grad_scale=grad_scale,
                     found_inf=found_inf, clip_coef=clip_coef, **(rounding or {}))


def validate(lists: list, lr: float | Tensor, hyper: dict[str, Any],
             grad_scale: Tensor | None, found_inf: Tensor | None,
             clip_coef: Tensor | None = None, rounding: dict[str, Any] | None = None) -> None:
    """Raises what :func:`call` would raise for bad input, and writes nothing.
    Skipped while torch.compile traces: every op call is then checked by its
    Meta kernel at trace time, before any of them runs."""
    if torch.compiler.is_compiling():
        return
    _overload(lists).redispatch(_VALIDATE_ONLY, *lists, lr=lr_tensor(lr), **hyper,
                                grad_scale=grad_scale, found_inf=found_inf,
                                clip_coef=clip_coef, **(rounding or {}))


def rounding_args(seed: int | None, ids: list[int], offsets: list[int] | None) -> dict[str, Any]:
    """The op's ``rounding_*`` keywords: {} (round to nearest) without a
    seed; ``offsets`` None when every one is 0 (plain tensors)."""
    if seed is None:
        return {}
    return {"rounding_seed": int(seed), "rounding_ids": ids, "rounding_offsets": offsets}


def rounding_id(group_index: int, index: int) -> int:
    """A param's identity in its optimizer, which keys its random stream:
    its group's position and its own in the group (C++: the same)."""
    return (group_index << 32) | index
