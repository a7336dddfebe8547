"""What ``initialize`` does to a model: checks, casts (O2/O3) and the patched
``forward`` (autocast in O1, input/output casts)."""
from __future__ import annotations

import functools

import torch

from ._amp_state import _amp_state, _casts_disabled
from ._casting import HALF_DTYPES, _apply, _caster, _model_device_type


def _default_autocast_dtype(device_type: str) -> torch.dtype:
    # CPU: bf16, autocast's CPU default: its op lists and fast kernels are made
    # for bf16 (fp16 on CPU is slow and less covered), and bf16 has fp32's
    # exponent range, so O1 grads overflow no more often than in fp32.
    if device_type == "cpu":
        return torch.bfloat16
    if device_type == "cuda":
        return torch.float16  # as apex
    return torch.get_autocast_dtype(device_type)


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
    # A model initialized again (e.g. O1 twice) gets the new patch in place
    # of the old one, around the same forward.
    inner = previous.previous if isinstance(previous, _AmpForward) else previous
    model.forward = _AmpForward(model, inner, autocast, autocast_dtype, input_dtype,
                                output_dtype)

    def undo():
        if previous is None:
            model.__dict__.pop("forward", None)
        else:
            model.forward = previous

    _amp_state.undo.append(undo)


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
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.dtype in HALF_DTYPES:
            raise RuntimeError(
                f"Found {name} with dtype {t.dtype}; amp.initialize expects an fp32 model. Do "
                "not call .half() (or .to(dtype)) yourself: pass the fp32 model and "
                "amp.initialize casts it as the opt_level says (O2/O3 for half weights).")


def _check_optimizer(optimizer) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("optimizers must be either a single torch.optim.Optimizer or a list "
                        f"of them, got {type(optimizer).__name__}.")
    if getattr(optimizer, "_torchext_amp", None) is not None:
        raise RuntimeError(
            "A given optimizer should only be passed through amp.initialize once. (The one "
            "amp.initialize returned is already set up; pass only new optimizers.)")


def _cast_model(model: torch.nn.Module, dtype: torch.dtype, keep_batchnorm_fp32: bool) -> None:
    """model.to(dtype), except affine batchnorms when keep_batchnorm_fp32 (as
    apex's convert_network)."""
    bn = torch.nn.modules.batchnorm._BatchNorm
    for module in model.modules():
        if keep_batchnorm_fp32 and isinstance(module, bn) and module.affine:
            continue
        module._apply(lambda t: t.to(dtype) if t.is_floating_point() else t, recurse=False)
