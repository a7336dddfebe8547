"""Grouping by device, written once for torchext's Python code.

The ops take lists on one device, so every front end that accepts tensors on
several devices (the functional ASGD, GradScaler) splits its lists with
:func:`indices_by_device` and :func:`pick`.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

import torch

__all__ = ["indices_by_device", "pick", "one_device"]

T = TypeVar("T")


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
