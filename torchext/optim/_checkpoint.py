"""ASGD's rules for hyperparameters and checkpoints: the constructor and
``load_state_dict`` apply the same ones, so a checkpoint the constructor
would refuse is refused whole, before anything changes.

The C++ API applies the same rules (csrc/api/asgd_state.h); the table of
corruptions in tests/checkpoint_corruptions.py is checked on both sides.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Any

import torch
from torch import Tensor

from .._devices import indices_by_device, pick
from .. import _dtensor
from ._state import SCALAR_KEYS, scalar_dtype

__all__ = ["check_hyperparams", "validate_state_dict", "restore_scalar_state"]

_FLAGS = ("maximize", "differentiable", "capturable", "stochastic_rounding")  # bool
_OPTIONAL_FLAGS = ("foreach", "fused")  # bool or None


def _number(v: Any) -> float | None:
    """A Python real or a 1-element real tensor as a float (None otherwise)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, Real):
        return float(v)
    if isinstance(v, Tensor) and v.numel() == 1 and not v.is_complex() and v.layout == torch.strided:
        return float(_dtensor.to_local(v).detach().reshape(()).item())
    return None


def _lr_value_readable(lr: Tensor) -> bool:
    """Whether a tensor lr's value can be read without a device sync: only
    where it lives in host memory (a CUDA lr is not read, a meta one holds
    no value). The asgd_ op's validator reads the same ones
    (csrc/ops/asgd.cpp: check_asgd_header)."""
    local = _dtensor.to_local(lr)
    return local.device.type == "cpu" and not local.is_meta


#: What a param group holds for a float32 average: a plain string, since
#: torch's distributed checkpoints (DCP) refuse a torch.dtype in param_groups.
FLOAT32_AVERAGE = "float32"


def normalize_average_dtype(value: Any, where: str | None) -> str | None:
    """``average_dtype`` as a param group holds it: ``"float32"`` (a float32
    average for fp16/bf16 parameters; ``torch.float32`` is accepted) or None
    (the parameter's dtype, torch's layout); anything else is refused."""
    if value is None:
        return None
    if value == torch.float32 or value == FLOAT32_AVERAGE:
        return FLOAT32_AVERAGE
    raise ValueError(f"{where + ': ' if where else ''}average_dtype must be torch.float32 "
                     f"(a float32 average for float16/bfloat16 parameters) or None (the "
                     f"parameter's dtype), got {value!r}")


def average_dtype_of(p: Tensor, group: dict[str, Any]) -> torch.dtype:
    """The rule for ``ax``'s dtype (state creation and load; C++:
    ``ASGDOptions::average_dtype``, ``asgd_state.h``): float32 for an fp16/bf16
    parameter unless its group's ``average_dtype`` is None, else the
    parameter's dtype."""
    dtype = _dtensor.to_local(p).dtype
    if dtype in (torch.float16, torch.bfloat16) and group.get(
            "average_dtype", FLOAT32_AVERAGE) is not None:
        return torch.float32
    return dtype


def check_rounding(h: dict[str, Any], where: str | None) -> None:
    """``stochastic_rounding`` a bool, ``rounding_seed`` an int64, and the
    flag only where the fused op runs (C++: ``ASGDOptions``' check)."""
    at = where + ": " if where else ""
    sr = h.get("stochastic_rounding", False)
    if not isinstance(sr, bool):
        raise ValueError(f"{at}'stochastic_rounding' must be a bool, got {sr!r}")
    seed = h.get("rounding_seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not -2**63 <= seed < 2**63:
        raise ValueError(f"{at}'rounding_seed' must be an int (int64), got {seed!r}")
    if sr and (h.get("fused") is False or h.get("differentiable")):
        from .functional import check_rounding_route
        check_rounding_route(h.get("fused"), bool(h.get("differentiable")))


def check_hyperparams(h: dict[str, Any], where: str | None) -> None:
    """lr, lambd, alpha, t0, weight_decay by the constructor's rules
    (torch's messages when ``where`` is None: the constructor).

    The rule (one home per language; C++: the asgd_ op's validator): lr,
    lambd, alpha and weight_decay finite and >= 0 (inf makes the step's
    params and state NaN); t0 any number but NaN (inf: never average).
    A tensor lr must hold one floating-point element; its value is checked
    here when it is on the CPU, never read from a device (no sync); after
    that it is the user's, as in torch (a scheduler may write it)."""
    if "average_dtype" in h:
        normalize_average_dtype(h["average_dtype"], where)
    check_rounding(h, where)
    lr = h.get("lr")
    skip_value = ()
    if isinstance(lr, Tensor):
        if lr.numel() != 1:
            raise ValueError(f"{where + ': ' if where else ''}Tensor lr must be 1-element")
        if not lr.is_floating_point():
            raise ValueError(f"{where + ': ' if where else ''}Tensor lr must be floating point, "
                             f"got {lr.dtype}")
        if not _lr_value_readable(lr):
            skip_value = ("lr",)
    for key, name in (("lr", "learning rate"), ("lambd", "lambd value"), ("alpha", "alpha value"),
                      ("weight_decay", "weight_decay value")):
        if key in skip_value:
            continue
        v = _number(h.get(key))
        if v is None or not 0.0 <= v < math.inf:  # NaN fails too
            if where is None:
                raise ValueError(f"Invalid {name}: {h.get(key)} (must be finite and >= 0)")
            raise ValueError(f"{where}: '{key}' must be a finite number >= 0, got "
                             f"{h.get(key)!r}")
    t0 = _number(h.get("t0"))
    if t0 is None or math.isnan(t0):
        raise ValueError(f"{where + ': ' if where else ''}'t0' must be a number, not NaN "
                         f"(inf: never average), got {h.get('t0')!r}")


def _saved_id_to_param(opt, state_dict) -> dict[Any, Tensor]:
    if not isinstance(state_dict, dict):
        raise ValueError(f"loaded state dict must be a dict, got {type(state_dict).__name__}")
    if not isinstance(state_dict.get("state"), dict):
        raise ValueError("loaded state dict must have a 'state' dict")
    saved_groups = state_dict.get("param_groups")
    if not isinstance(saved_groups, list):
        raise ValueError("loaded state dict must have a 'param_groups' list")
    if len(opt.param_groups) != len(saved_groups):
        raise ValueError(f"loaded state dict has a different number of parameter groups "
                         f"({len(saved_groups)}) than the optimizer ({len(opt.param_groups)})")
    id_to_param = {}
    for gi, (g, sg) in enumerate(zip(opt.param_groups, saved_groups)):
        where = f"loaded state dict: param_groups[{gi}]"
        if not isinstance(sg, dict) or not isinstance(sg.get("params"), list):
            raise ValueError(f"{where} must be a dict with a 'params' list")
        ids = sg["params"]
        if len(g["params"]) != len(ids):
            raise ValueError(f"{where}['params'] has {len(ids)} ids but the optimizer's group "
                             f"has {len(g['params'])} params (the group doesn't match the size "
                             "of optimizer's group)")
        for k, pid in enumerate(ids):
            # torch.optim writes ints, torch.distributed.checkpoint parameter
            # names; a duplicate would leave a param without its state.
            if not isinstance(pid, (int, str)) or isinstance(pid, bool):
                raise ValueError(f"{where}['params'][{k}] must be an int (or a parameter "
                                 f"name), got {pid!r}")
            if pid in id_to_param:
                raise ValueError(f"{where}['params'][{k}]: id {pid} appears twice")
            id_to_param[pid] = g["params"][k]
    return id_to_param


def _check_group(gi: int, sg: dict[str, Any]) -> None:
    where = f"loaded state dict: param_groups[{gi}]"
    missing = [k for k in ("lr", "lambd", "alpha", "t0", "weight_decay") if k not in sg]
    if missing:
        raise ValueError(f"{where} lacks {missing}")
    check_hyperparams(sg, where)
    for key in _FLAGS:
        if key in sg and not isinstance(sg[key], bool):
            raise ValueError(f"{where}: '{key}' must be a bool, got {sg[key]!r}")
    for key in _OPTIONAL_FLAGS:
        if key in sg and sg[key] is not None and not isinstance(sg[key], bool):
            raise ValueError(f"{where}: '{key}' must be a bool or None, got {sg[key]!r}")
    if sg.get("fused") and sg.get("differentiable"):
        raise ValueError(f"{where}: 'fused' and 'differentiable' cannot both be True")
    t0s = sg.get("t0_per_param")
    if t0s is not None:
        if not isinstance(t0s, (list, tuple)) or len(t0s) != len(sg["params"]) or any(
                _number(t) is None or math.isnan(_number(t)) for t in t0s):
            raise ValueError(f"{where}: 't0_per_param' must be a list of one number per "
                             f"param ({len(sg['params'])}), got {t0s!r}")


def _check_entry(pid: Any, st: Any, p: Tensor) -> list[tuple[str, Tensor | float]]:
    """Checks one param's saved state; returns its step/eta/mu to check for
    finiteness (tensors, read together per device afterwards)."""
    where = f"loaded state dict: state[{pid!r}]"
    if not isinstance(st, dict):
        raise ValueError(f"{where} must be a dict, got {type(st).__name__}")
    missing = [k for k in SCALAR_KEYS + ("ax",) if k not in st]
    if missing:
        raise ValueError(f"{where} lacks {missing} (an ASGD state has step, eta, mu and ax)")
    ax = st["ax"]
    if not isinstance(ax, Tensor):
        raise ValueError(f"{where}['ax'] must be a tensor, got {type(ax).__name__}")
    if ax.layout != torch.strided:
        raise ValueError(f"{where}['ax'] must be a strided (dense) tensor, got {ax.layout}")
    if tuple(ax.shape) != tuple(p.shape):
        raise ValueError(f"{where}: 'ax' of parameter {pid} has shape "
                         f"{tuple(ax.shape)} but the parameter has shape {tuple(p.shape)}")
    if not (ax.is_floating_point() or ax.is_complex()) or ax.is_complex() != p.is_complex():
        raise ValueError(f"{where}['ax'] has dtype {ax.dtype} but the parameter has dtype "
                         f"{p.dtype}")
    if ax.is_meta and not _dtensor.to_local(p).is_meta:
        raise ValueError(f"{where}['ax'] is on meta (it holds no values) but the parameter is "
                         f"on {_dtensor.to_local(p).device}")
    out = []
    for key in SCALAR_KEYS:
        v = st[key]
        if isinstance(v, Tensor):
            if v.numel() != 1:
                raise ValueError(f"{where}: '{key}' of parameter {pid} must hold "
                                 f"one element, got shape {tuple(v.shape)}")
            if v.is_complex() or v.dtype == torch.bool or v.layout != torch.strided:
                raise ValueError(f"{where}['{key}'] must be one real number, got {v.dtype} "
                                 f"{v.layout}")
            if v.is_meta and not _dtensor.to_local(p).is_meta:
                raise ValueError(f"{where}['{key}'] is on meta (it holds no value) but the "
                                 f"parameter is on {_dtensor.to_local(p).device}")
        elif _number(v) is None:
            raise ValueError(f"{where}['{key}'] must be a number or a 1-element tensor, "
                             f"got {v!r}")
        out.append((f"{where}['{key}']", v))
    return out


def _retake_ax(saved: Tensor, loaded: Tensor, dtype: torch.dtype) -> Tensor:
    """``ax`` from its saved values in ``dtype``, where torch's loader put it
    (its device; a DTensor keeps the saved placements, as DCP loads them)."""
    cls = _dtensor._dtensor_cls()
    if cls is not None and isinstance(loaded, cls):
        src = saved if isinstance(saved, cls) else loaded
        return src.detach().to(dtype=dtype).clone()
    return saved.detach().to(device=loaded.device, dtype=dtype, copy=True)


def _check_values(values: list[tuple[str, Tensor | float]]) -> None:
    """step, eta and mu: finite and >= 0. Tensors are read once per device."""
    tensors: list[tuple[str, Tensor]] = []
    for where, v in values:
        if isinstance(v, Tensor):
            tensors.append((where, _dtensor.to_local(v).detach()))
        elif not (math.isfinite(float(v)) and float(v) >= 0):
            raise ValueError(f"{where} must be finite and >= 0, got {v!r}")
    for device, idx in indices_by_device(v for _, v in tensors).items():
        if device.type == "meta":
            continue
        pairs = pick(tensors, idx)
        stacked = torch.stack([v.reshape(()).double() for _, v in pairs])
        bad = (~torch.isfinite(stacked)) | (stacked < 0)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"{pairs[i][0]} must be finite and >= 0, got "
                             f"{pairs[i][1].item()}")


def validate_state_dict(opt, state_dict) -> None:
    """Everything ``opt.load_state_dict(state_dict)`` relies on; raises a
    ValueError naming the entry. Unknown extra keys are allowed, as torch
    allows them."""
    id_to_param = _saved_id_to_param(opt, state_dict)
    for gi, sg in enumerate(state_dict["param_groups"]):
        _check_group(gi, sg)
    values = []
    for pid, st in state_dict["state"].items():
        p = id_to_param.get(pid)
        if p is None:
            continue  # torch keeps state of unknown ids aside too
        values.extend(_check_entry(pid, st, p))
    _check_values(values)


def restore_scalar_state(opt, state_dict) -> None:
    """torch.optim casts every state tensor but ``step`` to the parameter
    dtype: eta/mu (bf16 loses the schedule) and ``ax`` (a float32 average
    narrowed to bf16). Take them again from the saved values: step/eta/mu in
    float32/64, ``ax`` in its dtype by the rule (``average_dtype_of``: a bf16
    ``ax`` of torch's or of ``average_dtype=None`` widens to float32, a float32
    one narrows where the group opted out), on the parameter's device."""
    id_to_param = _saved_id_to_param(opt, state_dict)
    groups = {id(p): g for g in opt.param_groups for p in g["params"]}
    for pid, st in state_dict["state"].items():
        p = id_to_param.get(pid)
        if p is None:
            continue
        ax = st.get("ax")
        if isinstance(ax, Tensor) and id(p) in groups:
            dtype = average_dtype_of(p, groups[id(p)])
            if ax.dtype != dtype or _dtensor.to_local(opt.state[p]["ax"]).dtype != dtype:
                loaded = opt.state[p]["ax"]
                dict.__setitem__(opt.state[p], "ax", _retake_ax(ax, loaded, dtype))
        for key in SCALAR_KEYS:
            if key not in st:
                continue
            v = st[key]
            dtype = v.dtype if isinstance(v, Tensor) and v.dtype in (
                torch.float32, torch.float64) else scalar_dtype()
            value = torch.as_tensor(v.detach() if isinstance(v, Tensor) else float(v))
            dict.__setitem__(opt.state[p], key, value.to(
                device=_dtensor.to_local(p).device, dtype=dtype, copy=True).reshape(()))
