"""Workarounds for torch.compile (Dynamo) and torch's LR schedulers, in one
place. Each says which torch behaviour it works around; the tests in
tests/compile/test_compile_compat.py check that torch still behaves that way, so a
workaround can go when its test starts failing.

Used by ``torchext.optim.ASGD``, ``torchext.amp.GradScaler`` and the apex
layer (``torchext.amp.apex``).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["GroupsAlias", "param_groups", "mark_step_not_wrapped", "is_marked_not_wrapped",
           "LR_SCHED_MARKER"]

# (1) torch's LR schedulers wrap `optimizer.step` in a function defined in
# torch/optim/lr_scheduler.py that sets `optimizer._opt_called`; Dynamo
# refuses to trace that file, so a compiled step graph-breaks (and the
# wrapper's weakref hides the grad_scale/found_inf GradScaler sets in the same
# graph). A step that records `_opt_called` itself carries this marker, and
# the schedulers then leave it alone.
LR_SCHED_MARKER = "_wrapped_by_lr_sched"


def mark_step_not_wrapped(step: Callable[..., Any]) -> Callable[..., Any]:
    """Marks ``step`` (which must set ``self._opt_called = True`` itself) so
    torch's LR schedulers do not wrap it."""
    setattr(step, LR_SCHED_MARKER, True)
    return step


def is_marked_not_wrapped(step: Callable[..., Any]) -> bool:
    return bool(getattr(step, LR_SCHED_MARKER, False))


def param_groups(optimizer: Any) -> list[dict[str, Any]]:
    """(2) An optimizer's ``param_groups``, read so that it also works inside
    ``torch.compile``.

    Dynamo special-cases the attribute ``param_groups`` of optimizers
    (torch._dynamo.variables.optimizer.OptimizerVariable): on CUDA it flips
    ``capturable`` to True in the user's groups, and in a fullgraph step with
    an in-graph backward, gradients read through it are the stale ones from
    before the backward (the step then sees none, and nothing updates). The
    same list read from the instance's ``__dict__`` is traced like any
    attribute. Everything that walks groups inside a compiled step reads them
    through this: ASGD's step and zero_grad, torchext's GradScaler.
    Optimizers whose ``param_groups`` is a property (wrappers) are read
    through it."""
    groups = optimizer.__dict__.get("param_groups")
    return optimizer.param_groups if groups is None else groups


class GroupsAlias:
    """Mixin for torchext's optimizers: ``_current_groups()`` (see
    :func:`param_groups`) and (3) a traceable ``zero_grad``: torch's
    ``Optimizer.zero_grad`` is wrapped in ``torch._disable_dynamo``, a graph
    break in a fullgraph train step; this one does the same thing and is
    traceable."""

    def _current_groups(self) -> list[dict[str, Any]]:
        return param_groups(self)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Resets the gradients of all optimized tensors, as torch's
        ``Optimizer.zero_grad``, but traceable by ``torch.compile``."""
        for group in self._current_groups():
            for p in group["params"]:
                _zero_one_grad(p, set_to_none)


def _zero_one_grad(p: torch.Tensor, set_to_none: bool) -> None:
    if p.grad is not None:
        if set_to_none:
            p.grad = None
        else:
            if p.grad.grad_fn is not None:
                p.grad.detach_()
            else:
                p.grad.requires_grad_(False)
            p.grad.zero_()


# (4) Not torch's `_init_group`: Dynamo intercepts the method named
# `_init_group` on optimizers and forces a graph break when the same compiled
# function ran backward() (a "pending mutation" on the params' grads), so
# torch's own optimizers cannot share a graph with the backward pass.
# torchext's ASGD gathers under other names (`_run_step` -> `_call` ->
# `_gather`, traced like any Python code); its `_init_group` is a separate
# loop over the same slot groups, kept only for callers of torch's name.
DYNAMO_INTERCEPTED_INIT = "_init_group"
