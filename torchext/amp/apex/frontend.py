"""``initialize`` (opt levels and their properties), ``reset``,
``master_params``, and the loss scalers' checkpoint state
(``state_dict``/``load_state_dict``)."""
from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any, Iterator

import torch
from torch import Tensor

from ..._compile_compat import mse_loss_mixed_dtype_works, promoting_mse_loss
from ._amp_state import _amp_state, _require_state
from ._casting import HALF_DTYPES
from ._initialize import _cast_model, _check_model, _check_optimizer, _patch_forward
from ._process_optimizer import _process_optimizer, _register_master_refresh
from .scaler import _LossScaler

_OPT_LEVELS = ("O0", "O1", "O2", "O3")


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


def reset() -> None:
    """Forgets what :func:`initialize` did: restores the patched ``forward``,
    ``step`` and ``zero_grad`` and drops the loss scalers (e.g. between
    tests). Weights cast by O2/O3 stay cast, and an O2 optimizer keeps its
    fp32 masters: build fresh models and optimizers for the next
    ``initialize``."""
    _amp_state.rollback()
    _amp_state.clear()


def initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None,
               patch_torch_functions=None, keep_batchnorm_fp32=None, master_weights=None,
               loss_scale=None, cast_model_outputs=None, num_losses=1, verbosity=1,
               min_loss_scale=None, max_loss_scale=2.0 ** 24, *, autocast_dtype=None):
    """apex's ``amp.initialize``: same arguments, same returns.

    Returns the model(s) and optimizer(s), in the shape given (a single one or
    a list). Call it after building the models and optimizers and before
    any DistributedDataParallel wrapping or ``torch.compile``. As in apex it
    may be called again with other models and optimizers (a second model, a
    rerun notebook cell): the new call's opt level and loss scalers replace
    the earlier ones. An optimizer may go through it only once, and models
    must be fp32.

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
    if not enabled:
        # apex: nothing is set up; scale_loss yields the loss as it is.
        _amp_state.initialized = True
        _amp_state.opt_properties = {"enabled": False}
        _amp_state.verbosity = verbosity
        return models if optimizers is None else (models, optimizers)

    props = _properties(opt_level, cast_model_type, patch_torch_functions, keep_batchnorm_fp32,
                        master_weights, loss_scale)
    props["enabled"] = True
    if autocast_dtype is not None and autocast_dtype not in HALF_DTYPES:
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
    half_cast = cast_type in HALF_DTYPES
    want_masters = bool(props["master_weights"]) and half_cast

    mark = _amp_state.mark()
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
            _amp_state.models.append(model)
        if props["patch_torch_functions"] and not mse_loss_mixed_dtype_works():
            _patch_mse_loss()

        for opt in opt_list:
            _process_optimizer(opt, renamed, fp32_of if want_masters else None,
                               recast_state=cast_type is not None)
        if want_masters:
            for model in model_list:
                _register_master_refresh(model)

        _amp_state.loss_scalers = [
            _LossScaler(props["loss_scale"], min_loss_scale, max_loss_scale, want_masters)
            for _ in range(int(num_losses))]
    except BaseException:
        _amp_state.rollback(mark)  # a failed call leaves the earlier ones as they were
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


def _patch_mse_loss() -> None:
    """O1 on a torch whose mse_loss backward refuses a half output against
    fp32 targets: F.mse_loss computes in the promoted dtype, as newer torch
    (_compile_compat (7)); undone by reset()."""
    F = torch.nn.functional
    previous = F.mse_loss
    if getattr(previous, "_torchext_promoting", False):
        return
    F.mse_loss = promoting_mse_loss(previous)

    def undo():
        F.mse_loss = previous

    _amp_state.undo.append(undo)


def _describe(props) -> str:
    parts = []
    if props["patch_torch_functions"]:
        dt = props["autocast_dtype"]
        parts.append("autocast in forward" + ("" if dt is None else f" ({dt})")
                     + " (float16 on CUDA, bfloat16 on CPU)" * (dt is None))
    if props["cast_model_type"] is not None:
        parts.append(f"model cast to {props['cast_model_type']}"
                     + (" except batchnorm" if props["keep_batchnorm_fp32"] else ""))
    if props["master_weights"] and props["cast_model_type"] in HALF_DTYPES:
        parts.append("fp32 master weights")
    ls = props["loss_scale"]
    parts.append("dynamic loss scale" if ls == "dynamic" else f"static loss scale {ls:g}")
    return ", ".join(parts)


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
