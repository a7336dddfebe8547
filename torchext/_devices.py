"""Grouping by device, written once for torchext's Python code.

The ops take lists on one device, and a host read is one sync per device, so
every grouping by device in torchext's Python goes through
:func:`indices_by_device` (with :func:`pick` for each list), devices in order
of first appearance: ASGD's slot groups and ``functional.asgd`` (through
:func:`indices_by_device_and_key`), the scaler's grads (``_grads.py``),
the averaged weights' swap and step counts (``optim/averaging.py``) and the
checkpoint's value check (``optim/_checkpoint.py``). C++'s twin is
csrc/api/device_groups.h (``index_by_device``, the same order).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import torch

__all__ = ["KERNEL_DEVICES", "has_kernels", "indices_by_device", "indices_by_device_and_key",
           "pick", "on_device"]

#: Device types torchext's ops have kernels for (meta: the op's validation,
#: no data). The one device rule: ASGD's ``fused=None`` default, ``fused=True``
#: and the C++ holder follow it, and so does C++ (``fused_device`` in
#: csrc/api/asgd.cpp; cpp_tests' ``ASGD.FusedDefaultMetaParamsTakeTheFusedOpAsInPython``
#: ties the two).
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


def indices_by_device_and_key(tensors: Iterable[torch.Tensor], keys: Sequence[Any] | None = None
                              ) -> dict[tuple[torch.device, Any], list[int]]:
    """Positions of ``tensors`` per (device, key): devices in order of first
    appearance, then, within a device, keys in order of first appearance
    (``keys`` None: one group per device, key None). ASGD's split into op
    calls, one per device and t0 (the slot groups, ``functional.asgd``); C++
    has the same split (``index_by_device_and_t0``, csrc/api/device_groups.h)
    and cpp_tests ``ASGD.SplitIntoOpCallsMatchesPython`` holds them together."""
    out: dict[tuple[torch.device, Any], list[int]] = {}
    for device, idx in indices_by_device(tensors).items():
        if keys is None:
            out[(device, None)] = idx
            continue
        for i in idx:
            out.setdefault((device, keys[i]), []).append(i)
    return out


def pick(xs: Sequence[T], idx: Sequence[int]) -> list[T]:
    """``[xs[i] for i in idx]``: one device's part of a list."""
    return [xs[i] for i in idx]

