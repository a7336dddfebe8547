"""DTensor (FSDP2 / ``torch.distributed.tensor``) support for torchext's ops,
shared by the optimizer (``optim/``: the step, its state, checkpoints,
averaging) and the scaler (``_grads.py``).

Design choice: **unwrap to local shards**, not DTensor sharding rules.

torchext's ops are elementwise. ``asgd_`` updates every element of a
parameter from the same element of its gradient and of ``ax``, plus
``step``/``eta``/``mu``, which are one scalar per parameter. When the
parameter, its gradient and ``ax`` are laid out the same way (same mesh,
same placements, which FSDP2 and ``zeros_like(param)`` give), running the op
on the local shards on every rank *is* the global update, with no
communication. The same holds for ``check_finite_``/``unscale_`` on sharded
gradients: each rank checks its shard and GradScaler all-reduces ``found_inf``
(its ``process_group``).

Registering sharding rules (``torch.distributed.tensor.experimental
.register_sharding``) would reach the same kernels but costs more and buys
nothing here:

* DTensor's dispatcher refuses to mix DTensors and plain tensors in one op,
  so the per-parameter scalars (plain tensors, see below) would have to become
  replicated DTensors, or be wrapped on every step;
* a rule has to describe lists of any length with one strategy per element,
  and DTensor runs sharding propagation in Python on every call, per step;
* ``register_sharding`` is experimental and changes between torch releases.

Unwrapping keeps a single fused op call per device over all local shards,
and the same code runs on every torch release torchext supports. What it
must not do is combine tensors laid out differently, so :func:`to_local_lists`
checks that gradients and ``ax`` match their parameter (a gradient laid out
differently, e.g. ``Partial``, is redistributed to the parameter's layout
first, as DTensor would do) and that DTensor scalars are replicated.

``step``/``eta``/``mu`` stay **plain 0-d tensors** on the parameter's local
device, as ``torch.optim`` keeps ``step`` for FSDP2 parameters. Every rank
holds the same values (every rank takes the same step/skip decision), and
``torch.distributed.checkpoint`` saves a plain tensor as replicated (one copy)
and loads it on every rank, so ``get_optimizer_state_dict`` /
``set_optimizer_state_dict`` work unchanged and the layout of the state
stays interchangeable with ``torch.optim.ASGD``'s. Replicated DTensor
scalars (e.g. from another tool's checkpoint) are accepted too.
"""
from __future__ import annotations

import sys

import torch
from torch import Tensor

__all__ = ["to_local", "to_local_lists"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _dtensor_cls():
    # A DTensor can only exist once torch.distributed.tensor is imported:
    # no import (0.4 s) for users who never touch it.
    mod = sys.modules.get("torch.distributed.tensor")
    return None if mod is None else getattr(mod, "DTensor", None)


def to_local(t: Tensor) -> Tensor:
    """The local shard of a DTensor (the same storage, so in-place ops on it
    update the DTensor), or ``t`` itself."""
    if type(t) in _PLAIN:
        return t
    cls = _dtensor_cls()
    if cls is not None and isinstance(t, cls):
        with torch.no_grad():
            return t.to_local()
    return t


def _layout(t):
    return (t.device_mesh, tuple(t.placements))


def to_local_lists(params, grads, axs, mus, etas, steps):
    """The op's lists with DTensors replaced by their local shards.

    Plain tensors (the common case) go through untouched, in the same lists.
    """
    if all(type(p) in _PLAIN for p in params):
        return params, grads, axs, mus, etas, steps
    cls = _dtensor_cls()
    if cls is None:
        return params, grads, axs, mus, etas, steps
    grads = list(grads)
    for i, p in enumerate(params):
        p_is_d = isinstance(p, cls)
        for name, t in (("grad", grads[i]), ("ax", axs[i])):
            if isinstance(t, cls) != p_is_d:
                raise TypeError(
                    f"ASGD: parameter {i} is {'a DTensor' if p_is_d else 'a plain tensor'} "
                    f"but its {name} is not; load DTensor optimizer state with "
                    "torch.distributed.checkpoint.state_dict.set_optimizer_state_dict")
        if not p_is_d:
            continue
        if _layout(grads[i]) != _layout(p):
            # e.g. a Partial gradient: reduce it to the parameter's layout,
            # as DTensor's own ops would before an elementwise update.
            grads[i] = grads[i].redistribute(p.device_mesh, p.placements)
        if _layout(axs[i]) != _layout(p):
            raise ValueError(
                f"ASGD: 'ax' of parameter {i} is laid out as {axs[i].placements} on "
                f"{axs[i].device_mesh}, the parameter as {p.placements} on {p.device_mesh}")
        for name, s in (("mu", mus[i]), ("eta", etas[i]), ("step", steps[i])):
            if isinstance(s, cls) and not all(pl.is_replicate() for pl in s.placements):
                raise ValueError(f"ASGD: '{name}' of parameter {i} must be a plain tensor or "
                                 f"a replicated DTensor, got placements {s.placements}")

    def local(xs):
        return [to_local(x) for x in xs]

    return local(params), local(grads), local(axs), local(mus), local(etas), local(steps)


def flat_offset(p: Tensor) -> int:
    """The index, in the full tensor's row-major (logical) order, of the
    first element of ``p``'s local shard: 0 for a plain tensor. Stochastic
    rounding keys each element's random bits by that index, so that a run
    resharded through DCP rounds every element as before. Only a shard that
    is one contiguous block of the full tensor has such an offset (dim-0
    sharding, FSDP2's default, and replication); others are refused."""
    cls = _dtensor_cls()
    if cls is None or not isinstance(p, cls):
        return 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    shape = tuple(p.shape)
    local, offset = compute_local_shape_and_global_offset(shape, p.device_mesh, p.placements)
    partial = [d for d in range(len(shape)) if local[d] != shape[d]]
    if partial and any(local[d] != 1 for d in range(partial[0])) or len(partial) > 1:
        raise ValueError(
            f"stochastic_rounding: a DTensor parameter placed as {tuple(p.placements)} "
            f"(shape {shape}, local shard {tuple(local)}) is not one contiguous block of the "
            "full tensor, so its elements have no single offset there; shard parameters on "
            "dim 0 (FSDP2's default) or turn stochastic_rounding off")
    flat, stride = 0, 1
    for d in reversed(range(len(shape))):
        flat += int(offset[d]) * stride
        stride *= shape[d]
    return flat
