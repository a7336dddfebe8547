"""GradScaler's option rules and checkpoint format: the constructor and
``load_state_dict`` apply the same rules, so a checkpoint the constructor
would refuse is refused whole, before anything changes. The C++ GradScaler
applies the same rules (the update_scale_ op's validator, csrc/ops/amp.cpp);
tests/checkpoint_corruptions.py holds the table both sides are tested on."""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from torch import Tensor

__all__ = ["STATE_DICT_VERSION", "TORCH_KEYS", "check_options", "parse_state_dict"]


def _library_version() -> int:
    """The version's one home is the C++ library
    (csrc/include/torchext/amp/state_dict_version.h): read from it, as
    torchext.cpu_isa() reads the ISA."""
    import ctypes

    from .._library import library_path
    fn = ctypes.CDLL(library_path).torchext_scaler_state_dict_version
    fn.restype = ctypes.c_int64
    return int(fn())


#: Version of torchext's extra keys, the C++ GradScaler's too.
STATE_DICT_VERSION = _library_version()
#: torch.amp.GradScaler.state_dict()'s keys, first in ours.
TORCH_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def check_options(*, init_scale: float, backoff_factor: float, growth_factor: float | None = None,
                  growth_interval: Any, hysteresis: Any, min_scale: Any, max_scale: Any,
                  where: str = "GradScaler") -> None:
    """The rules beyond torch's own asserts (growth_factor > 1 and
    backoff_factor < 1, which torch's constructor checks itself).

    Nothing non-finite where it would make the scale non-finite: a finite
    init_scale > 0, a finite growth_factor > 1, backoff_factor in (0, 1),
    integer (so finite) growth_interval and hysteresis >= 1, a finite
    min_scale >= 0; max_scale may be inf (no clamp, the default None) but
    not NaN. The C++ rules are update_scale_'s validator
    (csrc/ops/amp.cpp) plus the same init_scale check."""
    if growth_factor is not None and not 1.0 < growth_factor < math.inf:
        raise ValueError(f"{where}: growth_factor must be > 1 and finite, got {growth_factor}")
    if not (math.isfinite(init_scale) and init_scale > 0.0):
        raise ValueError(f"{where}: init_scale must be > 0 and finite, got {init_scale}")
    if not 0.0 < backoff_factor < 1.0:
        raise ValueError(f"{where}: backoff_factor must be in (0, 1), got {backoff_factor}")
    for key, v in (("growth_interval", growth_interval), ("hysteresis", hysteresis)):
        if isinstance(v, bool) or not isinstance(v, Real) or not (
                math.isfinite(v) and v == int(v) and v >= 1):
            raise ValueError(f"{where}: {key} must be an integer >= 1, got {v}")
    lo = 0.0 if min_scale is None else float(min_scale)
    hi = float("inf") if max_scale is None else float(max_scale)
    if not math.isfinite(lo):  # max_scale = inf is "no clamp"
        raise ValueError(f"{where}: min_scale must be finite, got {min_scale}")
    if math.isnan(hi):
        raise ValueError(f"{where}: max_scale must not be NaN (inf or None: no clamp), "
                         f"got {max_scale}")
    if not 0.0 <= lo <= hi:
        raise ValueError(f"{where}: need 0 <= min_scale <= max_scale, got {min_scale}, "
                         f"{max_scale}")


def _number(sd: dict[str, Any], key: str, where: str) -> float:
    v = sd[key]
    if isinstance(v, Tensor) and v.numel() == 1 and not v.is_complex():
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, Real) or math.isnan(float(v)):
        raise ValueError(f"{where}['{key}'] must be a number, got {sd[key]!r}")
    return float(v)


def _integer(sd: dict[str, Any], key: str, where: str, lo: int) -> int:
    v = _number(sd, key, where)
    if not (math.isfinite(v) and v == int(v) and v >= lo):
        raise ValueError(f"{where}['{key}'] must be an integer >= {lo}, got {sd[key]!r}")
    return int(v)


def parse_state_dict(sd: Any) -> dict[str, Any]:
    """Checks a GradScaler state_dict (torch's five keys, and torchext's
    extras when present) and returns its values as Python numbers; raises
    naming the key."""
    where = "GradScaler state_dict"
    if not isinstance(sd, dict):
        raise ValueError(f"{where} must be a dict, got {type(sd).__name__}")
    missing = [k for k in TORCH_KEYS if k not in sd]
    if missing:
        raise KeyError(f"{where} is missing {missing}")
    version = sd.get("_torchext_version", 0)
    if not isinstance(version, Integral) or isinstance(version, bool) or version < 0:
        raise ValueError(f"{where}['_torchext_version'] must be an int >= 0, got {version!r}")
    if version > STATE_DICT_VERSION:
        raise RuntimeError(
            f"{where}['_torchext_version'] is {version}: GradScaler state_dict version "
            f"{version} is newer than this torchext understands ({STATE_DICT_VERSION}); "
            f"upgrade torchext.")
    out: dict[str, Any] = {"version": int(version)}
    out["scale"] = _number(sd, "scale", where)
    out["growth_factor"] = _number(sd, "growth_factor", where)
    out["backoff_factor"] = _number(sd, "backoff_factor", where)
    out["growth_interval"] = _integer(sd, "growth_interval", where, 1)
    out["_growth_tracker"] = _integer(sd, "_growth_tracker", where, 0)
    if version >= 1:
        for key in ("hysteresis", "_hysteresis_tracker", "min_scale", "max_scale",
                    "skipped_steps"):
            if key not in sd:
                raise KeyError(f"{where} (torchext version {version}) is missing '{key}'")
        out["hysteresis"] = _integer(sd, "hysteresis", where, 1)
        out["_hysteresis_tracker"] = _integer(sd, "_hysteresis_tracker", where, 0)
        out["min_scale"] = _number(sd, "min_scale", where)
        out["max_scale"] = _number(sd, "max_scale", where)
        out["skipped_steps"] = _integer(sd, "skipped_steps", where, 0)
        if out["_hysteresis_tracker"] > out["hysteresis"]:
            raise ValueError(f"{where}['_hysteresis_tracker'] ({out['_hysteresis_tracker']}) "
                             f"must be <= hysteresis ({out['hysteresis']})")
    check_options(init_scale=out["scale"], growth_factor=out["growth_factor"],
                  backoff_factor=out["backoff_factor"], growth_interval=out["growth_interval"],
                  hysteresis=out.get("hysteresis", 1),
                  min_scale=out.get("min_scale"), max_scale=out.get("max_scale"),
                  where=where)
    return out
