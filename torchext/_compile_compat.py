"""Workarounds for torch.compile (Dynamo) and torch's LR schedulers, and the
differences between the torch versions torchext supports, in one place. Each says which torch behaviour it works around; the tests in
tests/compile/test_compile_compat.py check that torch still behaves that way, so a
workaround can go when its test starts failing.

Used by ``torchext.optim.ASGD``, ``torchext.amp.GradScaler`` and the apex
layer (``torchext.amp.apex``).
"""
from __future__ import annotations

import functools
import re
from typing import Any, Callable, NamedTuple

import torch

__all__ = ["GroupsAlias", "param_groups", "mark_step_not_wrapped", "is_marked_not_wrapped",
           "LR_SCHED_MARKER", "STEP_CALLED", "StepCalled", "SUPPORTED_TORCH", "torch_version", "TorchFeature",
           "COMPILED_STEP", "FEATURES", "mse_loss_mixed_dtype_works",
           "promoting_mse_loss", "gate_compiled_step"]

# (1) torch's LR schedulers wrap `optimizer.step` in a function defined in
# torch/optim/lr_scheduler.py that sets `optimizer._opt_called`; Dynamo
# refuses to trace that file, so a compiled step graph-breaks (and the
# wrapper's weakref hides the grad_scale/found_inf GradScaler sets in the same
# graph). A step that records `_opt_called` itself carries this marker, and
# the schedulers then leave it alone.
# (1b) And Dynamo drops every attribute a compiled function writes on a
# torch.optim.Optimizer (it does not track optimizers for side effects:
# OptimizerVariable is not among the types VariableBuilder registers with
# track_object_existing), so a compiled step's `self._opt_called = True` never
# reaches the optimizer, and the scheduler's first step() warns "Detected call
# of `lr_scheduler.step()` before `optimizer.step()`". Writes on a plain
# object it holds are kept: GroupsAlias keeps `_opt_called` in a StepCalled.
LR_SCHED_MARKER = "_wrapped_by_lr_sched"
STEP_CALLED = "_torchext_step_called"


class StepCalled:
    """(1b) Whether ``step()`` was called, for torch's LR schedulers
    (``optimizer._opt_called``), in an object Dynamo tracks: a compiled
    step's ``called = True`` reaches it."""

    def __init__(self) -> None:
        self.called = False


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
# (No code here: the workaround is the step path's names, checked by
# tests/compile/test_compile_compat.py.)


# ---------------------------------------------------------------------------
# Torch versions. torchext supports torch 2.11 to 2.15 (SUPPORTED_TORCH; the
# library is built for one of them, torchext/_library.py). What an older torch
# in that range cannot do is a TorchFeature below: refused at its first call
# with a message naming it and the first torch that has it, and its tests
# skip with that message. What an older torch does differently but can be
# made to work is worked around here. No version test anywhere else.

#: The oldest and the newest (major, minor) torchext is built and tested for.
SUPPORTED_TORCH = ((2, 11), (2, 15))


def torch_version(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``version`` (default: the running torch):
    "2.11.0+cu130" -> (2, 11), "2.16.0.dev20270101" -> (2, 16)."""
    m = re.match(r"(\d+)\.(\d+)", torch.__version__ if version is None else version)
    if m is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(m.group(1)), int(m.group(2))


class TorchFeature(NamedTuple):
    """A feature that needs a newer torch than the oldest supported.
    ``name`` says what the user did, ``min_torch`` the first (major, minor)
    that has it, ``why`` what the older torch lacks and what to do instead."""
    name: str
    min_torch: tuple[int, int]
    why: str

    def available(self, version: str | None = None) -> bool:
        return torch_version(version) >= self.min_torch

    def message(self, version: str | None = None) -> str:
        major, minor = self.min_torch
        return (f"{self.name} needs torch >= {major}.{minor}; this is torch "
                f"{torch.__version__ if version is None else version}. {self.why}")


# (5) Dynamo skips code defined in torch/amp/grad_scaler.py, so every method
# of torch.amp.GradScaler a compiled step calls is defined again in
# torchext's GradScaler (torchext/amp/grad_scaler.py; tests/helpers.py
# SCALER_OVERRIDES lists them), not inherited.

# (6) A compiled optimizer step. Dynamo before torch 2.12 cannot set an
# attribute on an optimizer inside a graph ("Attempted setattr on a
# user-defined object that does not have an AttributeMutation mutation_type"),
# and a step sets several: `_opt_called` (see (1)), and GradScaler hands
# `grad_scale`/`found_inf` over that way; and torch 2.11's fullgraph step
# loses the gradients of the in-graph backward ahead of the step ("No inf
# checks were recorded prior to update"; without fullgraph=True, silently:
# nothing updates). torch 2.12 does both (tests/compile/test_compile_compat.py
# probes each; on 2.12.1 the whole-step tests pass).
# On such a torch the steps are not traced (gate_compiled_step): without
# fullgraph=True the graph breaks there and the step runs eagerly, which
# works; with fullgraph=True the first call fails with this message. The compiled
# model with the eager step (docs/compile.md) works on every supported torch.
COMPILED_STEP = TorchFeature(
    "A training step compiled whole with torch.compile(fullgraph=True) (torchext's "
    "opt.zero_grad, opt.step or scaler.step inside the graph)",
    (2, 12),
    "Older Dynamo cannot set attributes on an optimizer in a graph, and loses the gradients "
    "of a backward traced after zero_grad. Compile the model only "
    "and run scaler.step(opt)/opt.step() eagerly (docs/compile.md), or drop fullgraph=True "
    "(the step then runs eagerly between graphs).")

#: Every feature that needs a newer torch than SUPPORTED_TORCH[0] (docs/status.md).
FEATURES = (COMPILED_STEP,)


def gate_compiled_step(step: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator of the steps (ASGD.step, GradScaler.step). On a torch without
    COMPILED_STEP, Dynamo does not trace them: a compiled function breaks its
    graph there and runs the step eagerly, and fullgraph=True fails at the
    first call with COMPILED_STEP's message (see (6))."""
    if COMPILED_STEP.available():
        return step
    return torch.compiler.disable(step, reason=COMPILED_STEP.message())


#: The frames gate_compiled_step adds between a step's caller and the step
#: (torch.compiler.disable's wrapper), for warnings that point at the caller.
STEP_GATE_FRAMES = 0 if COMPILED_STEP.available() else 1


class GroupsAlias:
    """Mixin for torchext's optimizers: ``_current_groups()`` (see
    :func:`param_groups`), (1b) an ``_opt_called`` that a compiled step can
    set, and (3) a traceable ``zero_grad``: torch's
    ``Optimizer.zero_grad`` is wrapped in ``torch._disable_dynamo``, a graph
    break in a fullgraph train step; this one does the same thing and is
    traceable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__[STEP_CALLED] = StepCalled()
        super().__init__(*args, **kwargs)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # (torch's __getstate__ keeps no flag: a copy starts afresh)
        self.__dict__.setdefault(STEP_CALLED, StepCalled())

    @property
    def _opt_called(self) -> bool:
        """What torch's LR schedulers read (see (1b)): True once ``step()``
        ran, compiled or not."""
        box = self.__dict__.get(STEP_CALLED)
        return box is not None and box.called

    @_opt_called.setter
    def _opt_called(self, value: bool) -> None:
        box = self.__dict__.get(STEP_CALLED)
        if box is None:  # (made at construction; only eagerly can it be made here)
            box = self.__dict__[STEP_CALLED] = StepCalled()
        box.called = bool(value)

    def _current_groups(self) -> list[dict[str, Any]]:
        return param_groups(self)

    @gate_compiled_step  # (not traced by a torch that mistraces it: (6))
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Resets the gradients of all optimized tensors, as torch's
        ``Optimizer.zero_grad``, but traceable by ``torch.compile``."""
        groups = self._current_groups()
        if set_to_none:  # (no read first, no call per param: a third of the loop's time)
            for group in groups:
                for p in group["params"]:
                    p.grad = None
            return
        for group in groups:
            for p in group["params"]:
                _zero_one_grad(p, set_to_none)


# (7) The backward of `F.mse_loss` with a half (fp16/bf16) input and a float32
# target fails before torch 2.13 ("Found dtype Float but expected BFloat16"):
# exactly apex O1's loss, a model output in the autocast dtype against fp32
# targets, computed outside the model's forward. Newer torch computes it in
# the promoted dtype; on a torch whose backward still fails (checked once, by
# running it), the apex layer's O1 puts this wrapper in torch.nn.functional
# (apex O1 patched its loss functions too), with the same numbers as newer
# torch: the inputs cast to their promoted dtype, the gradient cast back.

@functools.lru_cache(maxsize=None)
def mse_loss_mixed_dtype_works() -> bool:
    """Whether the running torch's mse_loss backward takes a bf16 input
    with a float32 target."""
    x = torch.zeros(2, dtype=torch.bfloat16, requires_grad=True)
    try:
        torch.nn.functional.mse_loss(x, torch.ones(2)).backward()
    except RuntimeError:
        return False
    return True


def promoting_mse_loss(mse_loss: Callable[..., Any]) -> Callable[..., Any]:
    """``mse_loss`` with a floating input and target of different dtypes
    computed in their promoted dtype (see (7))."""
    @functools.wraps(mse_loss)
    def wrapper(input, target, *args, **kwargs):
        if (isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor)
                and input.dtype != target.dtype and input.is_floating_point()
                and target.is_floating_point()):
            dtype = torch.promote_types(input.dtype, target.dtype)
            input, target = input.to(dtype), target.to(dtype)
        return mse_loss(input, target, *args, **kwargs)

    wrapper._torchext_promoting = True
    return wrapper
