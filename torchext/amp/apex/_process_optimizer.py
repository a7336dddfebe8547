"""What ``initialize`` does to an optimizer: fp32 master weights (O2), and a
subclass whose ``step`` skips after an overflow and copies the masters back,
and whose ``zero_grad`` also clears the model's half grads."""
from __future__ import annotations

import functools
import types

import torch
from torch import Tensor

from ..._compile_compat import is_marked_not_wrapped
from ._amp_state import _amp_state
from .. import protocol
from ._casting import HALF_DTYPES


class _OptStash:
    """What torchext's apex layer keeps on each optimizer (``opt._torchext_amp``)."""

    def __init__(self) -> None:
        self.pending: Tensor | None = None  # found_inf (device) for the next step()
        self.grads_are_scaled = False  # a delay_unscale backward has not been unscaled yet
        self.stashed: dict[int, Tensor] | None = None  # grads set aside during a backward
        self.master_pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []  # (model, master)
        self.device_skip = False  # _step_supports_amp_scaling

    def model_half_params(self) -> list[torch.nn.Parameter]:
        return [p for p, _ in self.master_pairs]


def _stash(optimizer) -> _OptStash:
    stash = getattr(optimizer, "_torchext_amp", None)
    if stash is None:
        raise RuntimeError(
            "This optimizer was not passed to amp.initialize. Pass it (with its model) to "
            "amp.initialize and use the optimizer it returns; or, without the apex API, use "
            "torchext.amp.GradScaler directly.")
    return stash


def _amp_step(self, *args, **kwargs):
    """``step()`` of an optimizer given to ``amp.initialize``: skips after an
    overflow, and in O2 copies the masters back into the model."""
    stash: _OptStash | None = self.__dict__.get("_torchext_amp")
    base = type(self)._torchext_amp_base
    if stash is None:  # amp.reset() ran, or a copy made by a checkpoint/unpickle
        return base.step(self, *args, **kwargs)
    if stash.grads_are_scaled:
        raise RuntimeError(
            "optimizer.step() was called while the gradients are still scaled by "
            "amp.scale_loss(..., delay_unscale=True). The last backward before a step "
            "must use delay_unscale=False (the default), which unscales them.")
    pending, stash.pending = stash.pending, None
    if pending is not None and (args or kwargs.get("closure") is not None):
        raise RuntimeError(
            "Closures are not supported with amp loss scaling (as in apex). Call "
            "optimizer.step() without a closure after the amp.scale_loss block.")
    if pending is None:
        out = base.step(self, *args, **kwargs)
    else:
        # The scaler's skip protocol (the grads are already unscaled, so no
        # grad_scale): an optimizer that skips on the device gets found_inf,
        # any other is not called on an overflow (one host read, as apex and
        # torch's GradScaler).
        called, out = protocol.step_unless_overflow(
            self, lambda: base.step(self, *args, **kwargs), pending, stash.device_skip)
        if stash.device_skip:
            if _amp_state.verbosity >= 2 and pending.item():
                print("torchext.amp: gradient overflow, step skipped")
        elif not called:  # skipped; an LR scheduler's wrapper (outside) still saw the call
            if is_marked_not_wrapped(base.step):
                # This optimizer records the call for LR schedulers in its own
                # step() (so they do not wrap it), which did not run: record it.
                self._opt_called = True
            if _amp_state.verbosity >= 1:
                print("torchext.amp: gradient overflow, skipping step; loss scale(s) now "
                      + ", ".join(f"{s.loss_scale():g}" for s in _amp_state.loss_scalers))
    if stash.master_pairs:
        with torch.no_grad():
            # rounded to the model's dtype
            torch._foreach_copy_([p for p, _ in stash.master_pairs],
                                 [m for _, m in stash.master_pairs])
        for _, master in stash.master_pairs:
            master.grad = None  # consumed; remade from the model's grad next backward
    return out


def _amp_zero_grad(self, set_to_none: bool = True):
    """``zero_grad()`` that also clears the model's half grads in O2 (the
    optimizer itself holds the fp32 masters), as apex."""
    type(self)._torchext_amp_base.zero_grad(self, set_to_none)
    stash = self.__dict__.get("_torchext_amp")
    for p in [] if stash is None else stash.model_half_params():
        if p.grad is not None:
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()


def _step_tracked_for_lr_scheduler(self, *args, **kwargs):
    # What torch's LR-scheduler wrapper does, through amp's step.
    self._opt_called = True
    return type(self).step(self, *args, **kwargs)


_step_tracked_for_lr_scheduler._wrapped_by_lr_sched = True

_AMP_CLASSES: dict[type, type] = {}


def _amp_reduce_ex(self, protocol):
    # Pickles and deep-copies as the plain optimizer class: the copy is not
    # part of the amp setup (its state is what Optimizer.__getstate__ keeps).
    return _new_instance, (type(self)._torchext_amp_base,), self.__getstate__()


def _new_instance(cls):
    return cls.__new__(cls)


def _amp_class(cls: type) -> type:
    """A subclass of the optimizer's class with amp's step/zero_grad. A class
    (not an instance attribute) so that torch's LR scheduler, which wraps
    ``opt.step`` on the instance, and optimizers that route that wrapper to
    ``type(self).step`` (torchext's ASGD) all go through it."""
    sub = _AMP_CLASSES.get(cls)
    if sub is None:
        @functools.wraps(_amp_step)
        def step(self, *args, **kwargs):
            return _amp_step(self, *args, **kwargs)

        if getattr(cls.step, "_wrapped_by_lr_sched", False):
            step._wrapped_by_lr_sched = True  # as the base: schedulers need not wrap it
        # base.step already runs the step hooks: torch must not wrap this one
        # again (Optimizer.__setstate__, e.g. on deepcopy, would otherwise).
        step.hooked = True
        sub = type(cls.__name__, (cls,), {
            "step": step, "zero_grad": _amp_zero_grad, "_torchext_amp_base": cls,
            "__reduce_ex__": _amp_reduce_ex,
            "__module__": cls.__module__, "__qualname__": cls.__qualname__})
        _AMP_CLASSES[cls] = sub
    return sub


def _patch_optimizer(optimizer: torch.optim.Optimizer) -> None:
    previous = optimizer.__dict__.get("step")
    if previous is not None and not hasattr(previous, "_wrapped_by_lr_sched"):
        raise RuntimeError(
            "optimizer.step was replaced on this optimizer instance before amp.initialize; amp "
            "cannot see through it. Call amp.initialize first and replace or wrap step after.")
    base = type(optimizer)
    optimizer.__class__ = _amp_class(base)
    if previous is not None:
        # An LR scheduler made before amp.initialize: its wrapper calls the
        # class's step it saw, not amp's. Count the call the same way, via amp.
        optimizer.step = types.MethodType(_step_tracked_for_lr_scheduler, optimizer)

    def undo():
        optimizer.__class__ = base
        if previous is not None:
            optimizer.__dict__["step"] = previous

    _amp_state.undo.append(undo)


def _process_optimizer(opt: torch.optim.Optimizer, renamed: dict[int, torch.nn.Parameter],
                       fp32_of: dict[int, Tensor] | None, recast_state: bool) -> None:
    """Points ``opt`` at the model's (possibly cast, hence ``renamed``)
    parameters, gives it fp32 masters for half ones when ``fp32_of`` (the
    fp32 weights taken before the cast) is given, and swaps its class."""
    stash = _OptStash()
    stash.device_skip = bool(getattr(opt, "_step_supports_amp_scaling", False))
    for group in opt.param_groups:
        params = group["params"]
        for i, p in enumerate(params):
            p = renamed.get(id(p), p)
            params[i] = p
            if fp32_of is not None and p.dtype in HALF_DTYPES:
                src = fp32_of.get(id(p))
                master = torch.nn.Parameter(
                    src if src is not None else p.detach().float().clone(),
                    requires_grad=p.requires_grad)
                if p in opt.state:
                    opt.state[master] = opt.state.pop(p)
                params[i] = master
                stash.master_pairs.append((p, master))
    if recast_state and opt.state:
        # Re-key/re-cast pre-existing per-parameter state (apex's trick).
        opt.load_state_dict(opt.state_dict())
    opt._torchext_amp = stash
    _patch_optimizer(opt)
    _amp_state.optimizers.append(opt)


def _register_master_refresh(model: torch.nn.Module) -> None:
    """After ``model.load_state_dict`` the masters are refreshed from the
    model's (half) weights, or the next step would bring the old ones back."""
    def refresh(module, incompatible_keys):
        mine = {id(p) for p in module.parameters()}
        with torch.no_grad():
            for opt in _amp_state.optimizers:
                for p, master in opt._torchext_amp.master_pairs:
                    if id(p) in mine:
                        master.copy_(p)

    _amp_state.undo.append(model.register_load_state_dict_post_hook(refresh).remove)
