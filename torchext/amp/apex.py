"""NVIDIA apex ``amp`` API on torch autocast and torchext's GradScaler.

Code written for apex::

    from apex import amp
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()

runs with only the import changed to ``from torchext import amp``, on CPU or
CUDA, without apex. How each piece maps (see "Migrating from apex" in README.md):

* ``O1``: each model's ``forward`` runs under ``torch.autocast`` (fp16 on
  CUDA, bf16 on CPU), instead of apex's monkey-patching of torch functions.
* ``O2``/``O3``: the model is cast to half (batchnorm kept fp32 in O2) and its
  inputs are cast on the way in; in O2 the optimizer holds fp32 master
  weights, its gradients are copied from the model after backward, and the
  masters are copied (rounded) back to the model after ``optimizer.step()``.
* Loss scaling: one :class:`torchext.amp.GradScaler` per loss
  (``num_losses``). ``scale_loss`` unscales and checks for inf/NaN on exit and
  updates that loss's scale on the device. An overflow makes the next
  ``optimizer.step()`` a no-op: optimizers with ``_step_supports_amp_scaling``
  (torchext's ASGD, torch's fused Adam/AdamW/SGD) skip on the device without a
  host sync; others are checked on the host once, as apex and torch do.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import types
import warnings
from collections import OrderedDict
from typing import Any, Iterator

import torch
from torch import Tensor

from .grad_scaler import GradScaler

__all__ = [
    "initialize", "scale_loss", "master_params", "state_dict", "load_state_dict",
    "disable_casts", "register_half_function", "register_float_function",
    "register_promote_function", "half_function", "float_function", "promote_function",
    "reset",
]

_OPT_LEVELS = ("O0", "O1", "O2", "O3")
_HALF_DTYPES = (torch.float16, torch.bfloat16)
_SCALE_WINDOW = 2000  # apex's growth interval ("scale_seq_len")


# ---------------------------------------------------------------------- state

class _AmpState:
    """Process-wide state, as apex's ``_amp_state`` (also reachable as
    ``amp._amp_state``: ``amp._amp_state.loss_scalers[i].loss_scale()``)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.initialized = False
        self.opt_properties: dict[str, Any] | None = None
        self.verbosity = 1
        self.loss_scalers: list[_LossScaler] = []
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.undo: list[Any] = []  # callables that undo initialize's patches, in order


_amp_state = _AmpState()
_local = threading.local()  # disable_casts() depth, per thread like autocast


def _casts_disabled() -> bool:
    return getattr(_local, "disabled", 0) > 0


class _LossScaler:
    """One loss's scale: a torchext GradScaler, or nothing at all for a static
    scale of 1.0 without master weights (apex's short cut: the loss is
    yielded as ``loss.float()`` and gradients are left alone)."""

    def __init__(self, loss_scale, min_loss_scale, max_loss_scale, master_weights: bool) -> None:
        self.dynamic = loss_scale == "dynamic"
        self._min = min_loss_scale
        self._max = max_loss_scale
        self._master_weights = master_weights
        if self.dynamic:
            init = 2.0 ** 16 if max_loss_scale is None else min(float(max_loss_scale), 2.0 ** 16)
        else:
            init = float(loss_scale)
        self._build(init, 0)

    def _build(self, scale: float, unskipped: int) -> None:
        self.passthrough = False
        if self.dynamic:
            self.scaler = GradScaler(
                init_scale=scale, growth_interval=_SCALE_WINDOW, allow_fp16=True,
                min_scale=None if not self._min else float(self._min),
                max_scale=None if self._max is None else float(self._max))
        elif scale == 1.0 and not self._master_weights:
            self.scaler = None
            self.passthrough = True
            self._static_unskipped = unskipped
            return
        else:
            # A static scale: min == max, so backoff and growth leave it as it is;
            # an overflow still skips the step (apex would apply it).
            self.scaler = GradScaler(init_scale=scale, growth_interval=_SCALE_WINDOW,
                                     allow_fp16=True, min_scale=scale, max_scale=scale)
        if unskipped:
            sd = self.scaler.state_dict()
            sd["_growth_tracker"] = int(unskipped)
            self.scaler.load_state_dict(sd)

    def loss_scale(self) -> float:
        """The current scale as a Python float (a host sync, as in apex)."""
        return 1.0 if self.scaler is None else self.scaler.get_scale()

    # apex's private attribute names, read by many training scripts for logging.
    @property
    def _loss_scale(self) -> float:
        return self.loss_scale()

    @property
    def _unskipped(self) -> int:
        return self._static_unskipped if self.scaler is None else self.scaler._get_growth_tracker()

    def load(self, loss_scale: float, unskipped: int) -> None:
        if self.dynamic:
            sd = self.scaler.state_dict()
            sd["scale"] = float(loss_scale)
            sd["_growth_tracker"] = int(unskipped)
            self.scaler.load_state_dict(sd)
        else:
            self._build(float(loss_scale), int(unskipped))


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


def _require_state(what: str) -> _AmpState:
    if not _amp_state.initialized:
        raise RuntimeError(
            f"Invoked {what}, but amp has not been initialized. "
            "model, optimizer = amp.initialize(model, optimizer, opt_level=...) must be called "
            f"before {what}.")
    return _amp_state


def _stash(optimizer) -> _OptStash:
    stash = getattr(optimizer, "_torchext_amp", None)
    if stash is None:
        raise RuntimeError(
            "This optimizer was not passed to amp.initialize. Pass every optimizer to the one "
            "amp.initialize call (amp.initialize(model, [opt1, opt2], ...)) and use the ones it "
            "returns; or, without the apex API, use torchext.amp.GradScaler directly.")
    return stash


# ------------------------------------------------------------------ patching

def _model_device_type(model: torch.nn.Module) -> str:
    for t in model.parameters():
        return t.device.type
    for t in model.buffers():
        return t.device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


def _default_autocast_dtype(device_type: str) -> torch.dtype:
    # CPU: bf16, autocast's CPU default: its op lists and fast kernels are made
    # for bf16 (fp16 on CPU is slow and less covered), and bf16 has fp32's
    # exponent range, so O1 grads overflow no more often than in fp32.
    if device_type == "cpu":
        return torch.bfloat16
    if device_type == "cuda":
        return torch.float16  # as apex
    return torch.get_autocast_dtype(device_type)


def _apply(value, fn):
    """Applies fn to the tensors in a (nested) list/tuple/dict."""
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, dict):
        items = [(k, _apply(v, fn)) for k, v in value.items()]
        return type(value)(items) if type(value) in (dict, OrderedDict) else dict(items)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_apply(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_apply(v, fn) for v in value)
    return value


def _caster(dtype: torch.dtype):
    def cast(t: Tensor) -> Tensor:
        return t.to(dtype) if t.is_floating_point() else t
    return cast


class _AmpForward:
    """The ``forward`` that ``initialize`` puts on a model instance: casts the
    inputs (O2/O3), runs the model's own forward (under autocast in O1) and
    casts the outputs. An object rather than a closure, so the model still
    pickles, and ``copy.deepcopy`` makes the copy's forward run the copy."""

    def __init__(self, module, previous, autocast, autocast_dtype, input_dtype, output_dtype):
        self.module = module
        self.previous = previous  # an instance-level forward that was there, if any
        self.autocast = autocast
        self.autocast_dtype = autocast_dtype
        self.input_dtype = input_dtype
        self.output_dtype = output_dtype

    def __call__(self, *args, **kwargs):
        module = self.module
        if self.input_dtype is not None:
            cast = _caster(self.input_dtype)
            args, kwargs = _apply(args, cast), _apply(kwargs, cast)
        inner = self.previous
        if inner is None:
            inner = functools.partial(type(module).forward, module)
        if self.autocast and not _casts_disabled():
            device_type = _model_device_type(module)
            dtype = self.autocast_dtype or _default_autocast_dtype(device_type)
            with torch.autocast(device_type, dtype=dtype):
                out = inner(*args, **kwargs)
        else:
            out = inner(*args, **kwargs)
        return out if self.output_dtype is None else _apply(out, _caster(self.output_dtype))


def _patch_forward(model: torch.nn.Module, *, autocast: bool, autocast_dtype, input_dtype,
                   output_dtype) -> None:
    previous = model.__dict__.get("forward")
    model.forward = _AmpForward(model, previous, autocast, autocast_dtype, input_dtype,
                                output_dtype)

    def undo():
        if previous is None:
            model.__dict__.pop("forward", None)
        else:
            model.forward = previous

    _amp_state.undo.append(undo)


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
    elif stash.device_skip:
        # The optimizer skips on the device when found_inf != 0 (the grads
        # are already unscaled, so no grad_scale): no host sync.
        self.found_inf = pending
        try:
            out = base.step(self, *args, **kwargs)
        finally:
            del self.found_inf
        if _amp_state.verbosity >= 2 and pending.item():
            print("torchext.amp: gradient overflow, step skipped")
    elif pending.item():  # one host sync, as apex and torch's GradScaler
        out = None  # skipped; an LR scheduler's wrapper (outside) still saw the call
        if getattr(base.step, "_wrapped_by_lr_sched", False):
            # This optimizer records the call for LR schedulers in its own
            # step() (so they do not wrap it), which did not run: record it.
            self._opt_called = True
        if _amp_state.verbosity >= 1:
            print("torchext.amp: gradient overflow, skipping step; loss scale(s) now "
                  + ", ".join(f"{s.loss_scale():g}" for s in _amp_state.loss_scalers))
    else:
        out = base.step(self, *args, **kwargs)
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


# ---------------------------------------------------------------- initialize

def _properties(opt_level, cast_model_type, patch_torch_functions, keep_batchnorm_fp32,
                master_weights, loss_scale) -> dict[str, Any]:
    if opt_level not in _OPT_LEVELS:
        raise RuntimeError(f"Unexpected optimization level {opt_level}. "
                           "Options are 'O0', 'O1', 'O2', 'O3'.")
    props = {
        "O0": dict(cast_model_type=torch.float32, patch_torch_functions=False,
                   keep_batchnorm_fp32=None, master_weights=False, loss_scale=1.0),
        "O1": dict(cast_model_type=None, patch_torch_functions=True,
                   keep_batchnorm_fp32=None, master_weights=None, loss_scale="dynamic"),
        "O2": dict(cast_model_type=torch.float16, patch_torch_functions=False,
                   keep_batchnorm_fp32=True, master_weights=True, loss_scale="dynamic"),
        "O3": dict(cast_model_type=torch.float16, patch_torch_functions=False,
                   keep_batchnorm_fp32=False, master_weights=False, loss_scale=1.0),
    }[opt_level]
    props["opt_level"] = opt_level
    o1 = opt_level == "O1"
    if cast_model_type is not None:
        if o1 and cast_model_type not in (False, torch.float32):
            raise RuntimeError(
                "O1 runs the model's forward under torch.autocast and keeps the weights fp32; "
                f"cast_model_type={cast_model_type} is not allowed with O1. To cast the model "
                "itself use opt_level='O2' or 'O3'; for bf16 autocast use autocast_dtype=.")
        props["cast_model_type"] = cast_model_type or None
    if patch_torch_functions is not None:
        if patch_torch_functions and not o1:
            raise RuntimeError("patch_torch_functions=True (autocast in forward) is only "
                               "available with opt_level='O1'.")
        props["patch_torch_functions"] = bool(patch_torch_functions)
    if keep_batchnorm_fp32 is not None:
        if o1:
            raise RuntimeError("With opt_level O1 autocast already runs batchnorm in fp32, "
                               "so keep_batchnorm_fp32 should be None.")
        if keep_batchnorm_fp32 in ("True", "False"):
            keep_batchnorm_fp32 = keep_batchnorm_fp32 == "True"
        if not isinstance(keep_batchnorm_fp32, bool):
            raise ValueError("keep_batchnorm_fp32 must be a boolean, the string 'True' or "
                             f"'False', or None, found {keep_batchnorm_fp32!r}")
        props["keep_batchnorm_fp32"] = keep_batchnorm_fp32
    if master_weights is not None:
        if o1 and master_weights:
            raise RuntimeError("master_weights do not apply to O1: its weights stay fp32. "
                               "Use opt_level='O2' for fp16 weights with fp32 masters.")
        props["master_weights"] = bool(master_weights)
    if loss_scale is not None:
        props["loss_scale"] = "dynamic" if loss_scale == "dynamic" else float(loss_scale)
    return props


def _check_model(model) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError("models must be either a single model or a list of models.")
    parallel = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    names = {"FullyShardedDataParallel", "FSDPModule"}
    if isinstance(model, parallel) or any(c.__name__ in names for c in type(model).__mro__):
        raise RuntimeError(
            f"Incoming model is an instance of {type(model).__name__}. amp.initialize must see "
            "the bare model: call model, optimizer = amp.initialize(model, optimizer, ...) "
            f"first, then wrap the returned model: model = {type(model).__name__}(model, ...).")
    if type(model).__name__ == "OptimizedModule":
        raise RuntimeError(
            "Incoming model was made by torch.compile. Call amp.initialize on the plain model, "
            "then torch.compile the model it returns.")
    if getattr(model, "_torchext_amp_model", False):
        raise RuntimeError("This model was already processed by amp.initialize; pass it once.")
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.dtype in _HALF_DTYPES:
            raise RuntimeError(
                f"Found {name} with dtype {t.dtype}; amp.initialize expects an fp32 model. Do "
                "not call .half() (or .to(dtype)) yourself: pass the fp32 model and "
                "amp.initialize casts it as the opt_level says (O2/O3 for half weights).")


def _check_optimizer(optimizer) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("optimizers must be either a single torch.optim.Optimizer or a list "
                        f"of them, got {type(optimizer).__name__}.")
    if getattr(optimizer, "_torchext_amp", None) is not None:
        raise RuntimeError("This optimizer was already processed by amp.initialize; pass it once.")


def _cast_model(model: torch.nn.Module, dtype: torch.dtype, keep_batchnorm_fp32: bool) -> None:
    """model.to(dtype), except affine batchnorms when keep_batchnorm_fp32 (as
    apex's convert_network)."""
    bn = torch.nn.modules.batchnorm._BatchNorm
    for module in model.modules():
        if keep_batchnorm_fp32 and isinstance(module, bn) and module.affine:
            continue
        module._apply(lambda t: t.to(dtype) if t.is_floating_point() else t, recurse=False)


def reset() -> None:
    """Forgets what :func:`initialize` did: restores the patched ``forward``,
    ``step`` and ``zero_grad`` and drops the loss scalers, so ``initialize``
    may be called again (e.g. between tests). Weights cast by O2/O3 stay
    cast, and an O2 optimizer keeps its fp32 masters: build fresh models and
    optimizers for the next ``initialize``."""
    for undo in reversed(_amp_state.undo):
        undo()
    for model in _amp_state.models:
        model.__dict__.pop("_torchext_amp_model", None)
    for opt in _amp_state.optimizers:
        opt.__dict__.pop("_torchext_amp", None)
    _amp_state.clear()


def initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None,
               patch_torch_functions=None, keep_batchnorm_fp32=None, master_weights=None,
               loss_scale=None, cast_model_outputs=None, num_losses=1, verbosity=1,
               min_loss_scale=None, max_loss_scale=2.0 ** 24, *, autocast_dtype=None):
    """apex's ``amp.initialize``: same arguments, same returns.

    Returns the model(s) and optimizer(s), in the shape given (a single one or
    a list). Call it once, after building the models and optimizers and
    before any DistributedDataParallel wrapping or ``torch.compile``.

    Args (as apex):
        opt_level: ``"O0"`` fp32; ``"O1"`` autocast in each model's forward +
            dynamic loss scaling; ``"O2"`` fp16 model (batchnorm fp32), fp32
            master weights in the optimizer, dynamic loss scaling; ``"O3"``
            pure fp16, static loss scale 1.0.
        cast_model_type, patch_torch_functions, keep_batchnorm_fp32,
        master_weights, loss_scale (``"dynamic"`` or a number): overrides of
            the opt_level's defaults.
        cast_model_outputs: cast the models' floating outputs to this dtype.
        num_losses: one loss scale per loss (``loss_id`` of
            :func:`scale_loss`).
        verbosity: 0 silent; 1 a summary and host-checked overflows; 2 also
            overflows of device-skipped steps (costs a host sync per step).
        min_loss_scale, max_loss_scale: clamps of the dynamic scale.
        autocast_dtype (torchext only): the O1 autocast dtype. Default
            float16 on CUDA, bfloat16 on CPU.
    """
    if _amp_state.initialized:
        raise RuntimeError(
            "amp.initialize was already called. As in apex it must be called once: pass every "
            "model and optimizer to that one call, as lists (models, [opt1, opt2] = "
            "amp.initialize([m1, m2], [opt1, opt2], ...)). To start over (e.g. between tests) "
            "call torchext.amp.apex.reset() first.")
    if not enabled:
        _amp_state.clear()
        _amp_state.initialized = True
        _amp_state.opt_properties = {"enabled": False}
        _amp_state.verbosity = verbosity
        return models if optimizers is None else (models, optimizers)

    props = _properties(opt_level, cast_model_type, patch_torch_functions, keep_batchnorm_fp32,
                        master_weights, loss_scale)
    props["enabled"] = True
    if autocast_dtype is not None and autocast_dtype not in _HALF_DTYPES:
        raise ValueError(f"autocast_dtype must be torch.float16 or torch.bfloat16, "
                         f"got {autocast_dtype}")
    props["autocast_dtype"] = autocast_dtype

    models_was_list = isinstance(models, (list, tuple))
    model_list = list(models) if models_was_list else [models]
    if optimizers is None:
        opt_list, opts_was_list = [], False
    elif isinstance(optimizers, (list, tuple)):
        opt_list, opts_was_list = list(optimizers), True
    else:
        opt_list, opts_was_list = [optimizers], False
    for model in model_list:
        _check_model(model)
    for opt in opt_list:
        _check_optimizer(opt)
    if len({id(m) for m in model_list}) != len(model_list):
        raise RuntimeError("The same model was passed twice to amp.initialize.")
    if len({id(o) for o in opt_list}) != len(opt_list):
        raise RuntimeError("The same optimizer was passed twice to amp.initialize.")
    if int(num_losses) < 1:
        raise ValueError(f"num_losses must be >= 1, got {num_losses}")

    cast_type = props["cast_model_type"]
    half_cast = cast_type in _HALF_DTYPES
    want_masters = bool(props["master_weights"]) and half_cast

    try:
        # fp32 copies of the weights, taken before the cast (exact masters).
        fp32_of: dict[int, Tensor] = {}
        renamed: dict[int, torch.nn.Parameter] = {}
        if cast_type is not None:
            for model in model_list:
                before = list(model.named_parameters())
                if want_masters:
                    for _, p in before:
                        if p.is_floating_point():
                            fp32_of[id(p)] = p.detach().clone()
                _cast_model(model, cast_type, bool(props["keep_batchnorm_fp32"]))
                after = dict(model.named_parameters())
                for name, p in before:  # params replaced by the cast (overwrite_module_params_on_conversion)
                    if after.get(name) is not None and after[name] is not p:
                        renamed[id(p)] = after[name]
                        if id(p) in fp32_of:
                            fp32_of[id(after[name])] = fp32_of[id(p)]

        for model in model_list:
            autocast = props["patch_torch_functions"]
            in_dtype = cast_type if cast_type is not None else None
            out_dtype = cast_model_outputs
            if cast_type is not None and out_dtype is None:
                out_dtype = torch.float32  # apex: outputs come back fp32 when the model is cast
            if autocast or in_dtype is not None or out_dtype is not None:
                _patch_forward(model, autocast=autocast, autocast_dtype=autocast_dtype,
                               input_dtype=in_dtype, output_dtype=out_dtype)
            model._torchext_amp_model = True
            _amp_state.models.append(model)

        for opt in opt_list:
            stash = _OptStash()
            stash.device_skip = bool(getattr(opt, "_step_supports_amp_scaling", False))
            for group in opt.param_groups:
                params = group["params"]
                for i, p in enumerate(params):
                    p = renamed.get(id(p), p)
                    params[i] = p
                    if want_masters and p.dtype in _HALF_DTYPES:
                        src = fp32_of.get(id(p))
                        master = torch.nn.Parameter(
                            src if src is not None else p.detach().float().clone(),
                            requires_grad=p.requires_grad)
                        if p in opt.state:
                            opt.state[master] = opt.state.pop(p)
                        params[i] = master
                        stash.master_pairs.append((p, master))
            if cast_type is not None and opt.state:
                # Re-key/re-cast pre-existing per-parameter state (apex's trick).
                opt.load_state_dict(opt.state_dict())
            opt._torchext_amp = stash
            _patch_optimizer(opt)
            _amp_state.optimizers.append(opt)
        if want_masters:
            for model in model_list:
                _register_master_refresh(model)

        _amp_state.loss_scalers = [
            _LossScaler(props["loss_scale"], min_loss_scale, max_loss_scale, want_masters)
            for _ in range(int(num_losses))]
    except BaseException:
        reset()
        raise
    _amp_state.opt_properties = props
    _amp_state.verbosity = verbosity
    _amp_state.initialized = True
    if verbosity >= 1:
        print(f"torchext.amp: opt_level {opt_level}: " + _describe(props))

    out_models = model_list if models_was_list else model_list[0]
    if optimizers is None:
        return out_models
    return out_models, (opt_list if opts_was_list else opt_list[0])


def _describe(props) -> str:
    parts = []
    if props["patch_torch_functions"]:
        dt = props["autocast_dtype"]
        parts.append("autocast in forward" + ("" if dt is None else f" ({dt})")
                     + " (float16 on CUDA, bfloat16 on CPU)" * (dt is None))
    if props["cast_model_type"] is not None:
        parts.append(f"model cast to {props['cast_model_type']}"
                     + (" except batchnorm" if props["keep_batchnorm_fp32"] else ""))
    if props["master_weights"] and props["cast_model_type"] in _HALF_DTYPES:
        parts.append("fp32 master weights")
    ls = props["loss_scale"]
    parts.append("dynamic loss scale" if ls == "dynamic" else f"static loss scale {ls:g}")
    return ", ".join(parts)


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


# ---------------------------------------------------------------- scale_loss

def _optimizer_list(optimizers) -> list[torch.optim.Optimizer]:
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    return list(optimizers)


def _grad_params(opt) -> Iterator[torch.nn.Parameter]:
    for group in opt.param_groups:
        yield from group["params"]


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False,
               delay_overflow_check=False):
    """apex's ``amp.scale_loss``: yields ``loss.float() * scale``.

    On exit (unless ``delay_unscale``) the gradients produced inside the
    block are unscaled in place and checked for inf/NaN at once (so clipping
    after the block sees real gradients; in O2 clip ``amp.master_params``),
    gradients already there before the block are kept and added back, and
    this loss's scale is updated on the device. After an overflow the next
    ``optimizer.step()`` of these optimizers is a no-op.

    ``delay_unscale=True`` leaves the gradients scaled (gradient
    accumulation): the last backward before ``step()`` must use the default
    ``False``. ``model`` is unused, as in apex. ``delay_overflow_check`` is
    accepted and has no effect: the check already runs on the device, and a
    step with an overflow is always skipped.
    """
    st = _require_state("'with amp.scale_loss'")
    if not st.opt_properties["enabled"]:
        yield loss
        return
    opts = _optimizer_list(optimizers)
    stashes = [_stash(o) for o in opts]
    if not 0 <= loss_id < len(st.loss_scalers):
        raise IndexError(f"loss_id {loss_id} is out of range: amp.initialize was called with "
                         f"num_losses={len(st.loss_scalers)}; pass num_losses=N to it for N "
                         "losses with their own scales.")
    ls = st.loss_scalers[loss_id]
    if ls.passthrough:
        yield loss.float()
        return

    # Gradients already there (another loss's, unscaled) are set aside so that
    # only this backward's gradients get unscaled; they are added back on exit.
    for opt, stash in zip(opts, stashes):
        if not stash.grads_are_scaled and stash.stashed is None:
            stashed = {}
            for p in _grad_params(opt):
                if p.grad is not None:
                    stashed[id(p)] = p.grad
                    p.grad = None
            for p in stash.model_half_params():
                p.grad = None  # already copied into the masters (or stale)
            stash.stashed = stashed

    try:
        yield ls.scaler.scale(loss.float())
    except BaseException:
        # The block failed (e.g. in backward): drop its partial, scaled grads
        # and put back the ones set aside, as if the block had not run.
        for opt, stash in zip(opts, stashes):
            if not stash.grads_are_scaled and stash.stashed is not None:
                for p in _grad_params(opt):
                    p.grad = stash.stashed.get(id(p))
                stash.stashed = None
        raise

    if delay_unscale:
        for stash in stashes:
            stash.grads_are_scaled = True
        return
    scaler = ls.scaler
    unscaled = []
    with torch.no_grad():
        for opt, stash in zip(opts, stashes):
            for p, master in stash.master_pairs:
                master.grad = None if p.grad is None else p.grad.to(torch.float32, copy=True)
            if any(p.grad is not None for p in _grad_params(opt)):
                scaler.unscale_(opt)
                unscaled.append(opt)
    found = None
    if unscaled:
        for opt in unscaled:
            for f in scaler._found_inf_per_device(opt).values():
                f = f.to(scaler._get_scale_async().device)
                found = f.clone() if found is None else found + f
        scaler.update()  # this loss's scale, on the device
    with torch.no_grad():
        for opt, stash in zip(opts, stashes):
            stashed, stash.stashed = stash.stashed or {}, None
            stash.grads_are_scaled = False
            if stashed:
                for p in _grad_params(opt):
                    old = stashed.get(id(p))
                    if old is not None:
                        if p.grad is None:
                            p.grad = old
                        else:
                            p.grad.add_(old)
            if found is not None:
                stash.pending = found if stash.pending is None else stash.pending + found


# ------------------------------------------------------------------- helpers

def master_params(optimizer) -> Iterator[torch.nn.Parameter]:
    """The parameters the optimizer updates: the fp32 masters in O2, the
    model's parameters otherwise. Clip these: ``clip_grad_norm_(
    amp.master_params(optimizer), max_norm)``."""
    for group in optimizer.param_groups:
        yield from group["params"]


def state_dict(destination=None) -> dict[str, dict[str, Any]]:
    """The loss scales, in apex's format:
    ``{"loss_scaler0": {"loss_scale": float, "unskipped": int}, ...}``
    (readable by apex's ``amp.load_state_dict`` as well). One host sync."""
    if destination is None:
        destination = OrderedDict()
    for idx, ls in enumerate(_amp_state.loss_scalers):
        destination[f"loss_scaler{idx}"] = {"loss_scale": ls.loss_scale(),
                                            "unskipped": ls._unskipped}
    return destination


def load_state_dict(state_dict) -> None:
    """Loads :func:`state_dict` output, or an apex checkpoint's ``amp`` entry.
    ``unskipped`` (steps since the last overflow or growth) becomes the
    GradScaler's growth tracker."""
    _require_state("amp.load_state_dict")
    if len(state_dict) != len(_amp_state.loss_scalers):
        warnings.warn(f"state_dict contains {len(state_dict)} entries, while "
                      f"{len(_amp_state.loss_scalers)} loss_scalers are used", stacklevel=2)
    unexpected = [k for k in state_dict if "loss_scaler" not in k]
    if unexpected:
        raise RuntimeError("Error(s) in loading state_dict. Unexpected key(s) in state_dict: "
                           + ", ".join(f'"{k}"' for k in unexpected) + ". ")
    keys = [k for k in state_dict if "loss_scaler" in k]
    for idx, key in enumerate(keys):
        if idx >= len(_amp_state.loss_scalers):
            warnings.warn(f"Skipping {key}, since num_losses was set to "
                          f"{len(_amp_state.loss_scalers)}", stacklevel=2)
            break
        entry = state_dict[key]
        _amp_state.loss_scalers[idx].load(float(entry["loss_scale"]), int(entry["unskipped"]))


@contextlib.contextmanager
def disable_casts():
    """Runs the block without amp's casts: autocast is disabled (on CPU, on
    CUDA when present, and on the models' devices), O1 forwards do not turn
    it back on, and registered half/float/promote functions run uncast."""
    device_types = {"cpu"}
    if torch.cuda.is_available():
        device_types.add("cuda")
    for model in _amp_state.models:
        device_types.add(_model_device_type(model))
    _local.disabled = getattr(_local, "disabled", 0) + 1
    try:
        with contextlib.ExitStack() as stack:
            for dt in sorted(device_types):
                stack.enter_context(torch.autocast(dt, enabled=False))
            yield
    finally:
        _local.disabled -= 1


def _first_tensor(value):
    if isinstance(value, Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _floating_dtypes(value, out: list) -> list:
    if isinstance(value, Tensor):
        if value.is_floating_point():
            out.append(value.dtype)
    elif isinstance(value, dict):
        for v in value.values():
            _floating_dtypes(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _floating_dtypes(v, out)
    return out


def _cast_wrapper(fn, mode: str):
    """``fn`` run, under autocast, with autocast off and its floating inputs
    cast: to the autocast dtype ("half"), float32 ("float"), or the widest of
    their dtypes ("promote"). Outside autocast, or under disable_casts, it is
    ``fn`` as is."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t = _first_tensor((args, kwargs))
        if t is None or _casts_disabled() or not torch.is_autocast_enabled(t.device.type):
            return fn(*args, **kwargs)
        device_type = t.device.type
        if mode == "half":
            dtype = torch.get_autocast_dtype(device_type)
        elif mode == "float":
            dtype = torch.float32
        else:
            dtypes = _floating_dtypes((args, kwargs), [])
            if not dtypes:
                return fn(*args, **kwargs)
            dtype = functools.reduce(torch.promote_types, dtypes)
        cast = _caster(dtype)
        with torch.autocast(device_type, enabled=False):
            return fn(*_apply(args, cast), **_apply(kwargs, cast))

    wrapper._torchext_amp_cast = mode
    return wrapper


def _register(module, name: str, mode: str) -> None:
    if not hasattr(module, name):
        raise ValueError(f"No function named {name} in module {module}.")
    fn = getattr(module, name)
    if getattr(fn, "_torchext_amp_cast", None) is not None:
        raise RuntimeError(f"{getattr(module, '__name__', module)}.{name} is already registered "
                           f"as a {fn._torchext_amp_cast} function.")
    setattr(module, name, _cast_wrapper(fn, mode))


def half_function(fn):
    """Decorator (apex's ``amp.half_function``): under autocast, ``fn`` gets
    its floating inputs in the autocast dtype and runs with autocast off."""
    return _cast_wrapper(fn, "half")


def float_function(fn):
    """Decorator (apex's ``amp.float_function``): under autocast, ``fn`` runs
    in float32."""
    return _cast_wrapper(fn, "float")


def promote_function(fn):
    """Decorator (apex's ``amp.promote_function``): under autocast, ``fn``
    gets its floating inputs in the widest of their dtypes."""
    return _cast_wrapper(fn, "promote")


def register_half_function(module, function_name: str) -> None:
    """Under autocast, ``module.function_name`` gets its floating inputs cast
    to the autocast dtype (fp16 on CUDA, bf16 on CPU) and runs with autocast
    off. It wraps the module attribute at once (apex applied it at
    ``initialize``); code that imported the function by name earlier keeps
    the unwrapped one, as in apex."""
    _register(module, function_name, "half")


def register_float_function(module, function_name: str) -> None:
    """Under autocast, ``module.function_name`` runs in float32 (see
    :func:`register_half_function`)."""
    _register(module, function_name, "float")


def register_promote_function(module, function_name: str) -> None:
    """Under autocast, ``module.function_name`` gets its floating inputs cast
    to the widest of their dtypes (see :func:`register_half_function`)."""
    _register(module, function_name, "promote")
