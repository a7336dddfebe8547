"""The gradients GradScaler checks and unscales and the clip measures
(``_clip.py``): an optimizer's grads grouped by device, gathered and checked
in full before anything is written."""
from __future__ import annotations

import torch
from torch import Tensor

from ._compile_compat import param_groups
from ._devices import indices_by_device, pick
from ._dtensor import to_local

__all__ = ["GradsByDevice"]


class GradsByDevice:
    """``lists``: the optimizer's gradients per device (sparse ones by their
    values). ``sharded``: some grad was a DTensor (each rank sees only its
    shard). ``coalesced``: (param, coalesced grad) for uncoalesced fp16
    sparse grads; assigned to ``param.grad`` only by a pass that writes
    (unscale). ``sparse``: some grad was sparse (its values are in
    ``lists``; ``norm_lists`` has the values of their coalesced form, whose
    norm is the gradient's)."""

    def __init__(self, optimizer, allow_fp16: bool) -> None:
        self.sharded = False
        self.sparse = False
        self.coalesced: list[tuple[Tensor, Tensor]] = []
        grads: list[Tensor] = []
        norm_inputs: list[Tensor] = []
        for group in param_groups(optimizer):
            for param in group["params"]:
                if param.grad is None:
                    continue
                # DTensor (FSDP2) grads: the ops check/unscale this rank's
                # shard; found_inf is then all-reduced over process_group.
                grad = to_local(param.grad)
                self.sharded = self.sharded or grad is not param.grad
                if not allow_fp16 and grad.dtype == torch.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                norm_input = grad
                if grad.is_sparse:
                    self.sparse = True
                    norm_input = (grad if grad.is_coalesced() else grad.coalesce())._values()
                    if grad.dtype is torch.float16 and not grad.is_coalesced():
                        grad = grad.coalesce()
                        self.coalesced.append((param, grad))
                    grad = grad._values()
                grads.append(grad)
                norm_inputs.append(norm_input)
        by_device = indices_by_device(grads)
        self.lists: dict[torch.device, list[Tensor]] = {
            device: pick(grads, idx) for device, idx in by_device.items()}
        self.norm_lists: dict[torch.device, list[Tensor]] = (
            {device: pick(norm_inputs, idx) for device, idx in by_device.items()}
            if self.sparse else self.lists)

    def each_device(self, call, lists: dict | None = None) -> dict[torch.device, Tensor]:
        """``call(device, tensors, found_inf)`` for each device's list (of
        ``lists``, default ``self.lists``), each with a fresh found_inf (0-d
        float32 zero on that device): the scaler's one loop over devices.
        Returns the found_infs per device."""
        found_per_device = {}
        with torch.no_grad():
            for device, tensors in (self.lists if lists is None else lists).items():
                found = found_per_device[device] = torch.zeros((), dtype=torch.float32,
                                                               device=device)
                call(device, tensors, found)
        return found_per_device

    def all(self) -> list[Tensor]:
        """Every gradient (sparse ones by their values), devices in turn."""
        return [g for ts in self.lists.values() for g in ts]

    def validate(self, op) -> None:
        """Runs ``op``'s checks on every device's list but the first, on
        shadows on the meta device, so that a list the op refuses on a later
        device is refused before the first device's list is written (each
        op call checks its own list in full before writing)."""
        for grads in list(self.lists.values())[1:]:
            shadows = [torch.empty_like(g, device="meta") for g in grads]
            found = torch.zeros((), dtype=torch.float32, device="meta")
            op(shadows, found)
