"""Grouping by device, written once for torchext's Python code.

The ops take lists on one device, so every front end that accepts tensors on
several devices (the functional ASGD, GradScaler) splits its lists with
:func:`indices_by_device` and :func:`pick`.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

import torch

__all__ = ["KERNEL_DEVICES", "has_kernels", "indices_by_device", "pick", "one_device", "on_device"]

#: Device types torchext's ops have kernels for (meta: the op's validation,
#: no data). The one device rule: ASGD's ``fused=None`` default, ``fused=True``
#: and the C++ holder follow it, and so does C++ (``fused_device`` in
#: csrc/api/asgd.cpp; ``ASGDFusedDefault.*`` in cpp_tests ties the two).
KERNEL_DEVICES = ("cpu", "cuda", "meta")

T = TypeVar("T")


def has_kernels(device: torch.device) -> bool:
    """Whether torchext's ops serve tensors on ``device``."""
    return device.type in KERNEL_DEVICES


def on_device(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """``t`` (a GradScaler's grad_scale/found_inf) on ``device``, without a
    sync; None stays None."""
    if t is None or t.device == device:
        return t
    return t.to(device, non_blocking=True)


def indices_by_device(tensors: Iterable[torch.Tensor]) -> dict[torch.device, list[int]]:
    """Positions of ``tensors`` per device, devices in order of first appearance."""
    out: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        out.setdefault(t.device, []).append(i)
    return out


def pick(xs: Sequence[T], idx: Sequence[int]) -> list[T]:
    """``[xs[i] for i in idx]``: one device's part of a list."""
    return [xs[i] for i in idx]


def one_device(tensors: Sequence[torch.Tensor]) -> torch.device | None:
    """The device of every tensor when they share one, else None."""
    if not tensors:
        return None
    device = tensors[0].device
    return device if all(t.device == device for t in tensors) else None
