"""``torchext.amp.GradScaler``: torch's GradScaler API on torchext's ops, with
no host sync on the fused path and what users asked for beyond torch."""
from __future__ import annotations

import warnings
from collections import defaultdict
from enum import Enum
from typing import Any, Iterable

import torch
from torch import Tensor

from ..optim._dtensor import to_local

__all__ = ["GradScaler", "OptState"]

STATE_DICT_VERSION = 1


class OptState(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _refresh_per_optimizer_state() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf_per_device": {}}


def _grads_by_device(optimizer, allow_fp16: bool):
    """The optimizer's gradients, grouped by device (sparse ones by values),
    and whether any was a DTensor (sharded: each rank sees only its shard)."""
    out: dict[torch.device, list[Tensor]] = defaultdict(list)
    sharded = False
    # torchext optimizers expose their groups as `_groups` too: reading
    # `param_groups` inside torch.compile triggers Dynamo's optimizer
    # special-casing (see torchext.optim.ASGD._refresh_views).
    groups = optimizer._current_groups() if hasattr(optimizer, "_current_groups") \
        else optimizer.param_groups
    for group in groups:
        for param in group["params"]:
            # DTensor (FSDP2) grads: the ops check/unscale this rank's shard;
            # found_inf is then all-reduced over process_group.
            if param.grad is None:
                continue
            grad = to_local(param.grad)
            sharded = sharded or grad is not param.grad
            if not allow_fp16 and grad.dtype == torch.float16:
                raise ValueError("Attempting to unscale FP16 gradients.")
            if grad.is_sparse:
                if grad.dtype is torch.float16:
                    param.grad = grad = grad.coalesce()
                grad = grad._values()
            out[grad.device].append(grad)
    return out, sharded


class GradScaler(torch.amp.GradScaler):
    r"""Dynamic loss scaling, as :class:`torch.amp.GradScaler`, on torchext ops.

    Every public method of ``torch.amp.GradScaler`` works the same, with the
    same errors for misuse. Beyond torch:

    Args:
        device (str, optional): ``"cuda"``, ``"cpu"``, ... Default ``None``:
            taken from the first tensor passed to :meth:`scale`, so the
            scaler works on CPU out of the box. ``"cuda"`` on a machine
            without CUDA warns and disables the scaler, as torch does.
        init_scale, growth_factor, backoff_factor, growth_interval, enabled:
            as torch.
        hysteresis (int): back off only after this many overflows since the
            last growth (Megatron-LM's rule). 1 (default) is torch's rule.
        min_scale, max_scale (float, optional): clamps for backoff and
            growth. Growth never produces inf (as in torch).
        allow_fp16 (bool): allow :meth:`unscale_` on fp16 gradients (pure
            fp16 training; torchext's fused ASGD computes in fp32). torch
            refuses them.
        process_group (optional): all-reduce found_inf (MAX) over this
            ``torch.distributed`` group before deciding a step, so every rank
            skips together (for sharded gradients, as ShardedGradScaler).
            When gradients are DTensors (FSDP2) and no group is given, the
            default (WORLD) group is used, as ShardedGradScaler does.

    ``scaler.step(opt)`` with an optimizer that has
    ``_step_supports_amp_scaling`` (torchext's ASGD, torch's fused
    Adam/AdamW/SGD) runs a read-only inf/NaN check and hands ``grad_scale``
    and ``found_inf`` to the optimizer, which unscales on the fly and skips
    on the device: no ``.item()``, no separate unscale pass. Other
    optimizers get torch's behaviour: unscale, a host check, then step.
    """

    def __init__(
        self,
        device: str | None = None,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        hysteresis: int = 1,
        min_scale: float | None = None,
        max_scale: float | None = None,
        allow_fp16: bool = False,
        process_group: Any = None,
    ) -> None:
        # torch.amp.GradScaler.__init__ is not called: every attribute it sets
        # is set here (same names, so code that peeks at them keeps working).
        self._device = device
        self._enabled = enabled
        if device == "cuda" and enabled and not torch.cuda.is_available():
            warnings.warn(
                "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                stacklevel=2)
            self._enabled = False
        self._allow_fp16 = allow_fp16
        self._process_group = process_group
        if self._enabled:
            if growth_factor <= 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
            if backoff_factor <= 0.0:
                raise ValueError("The backoff factor must be > 0.0.")
            if int(growth_interval) < 1:
                raise ValueError(f"growth_interval must be >= 1, got {growth_interval}")
            if int(hysteresis) < 1:
                raise ValueError(f"hysteresis must be >= 1, got {hysteresis}")
            lo = 0.0 if min_scale is None else float(min_scale)
            hi = float("inf") if max_scale is None else float(max_scale)
            if not 0.0 <= lo <= hi:
                raise ValueError(f"need 0 <= min_scale <= max_scale, got {min_scale}, {max_scale}")
            self._init_scale = init_scale
            self._scale: Tensor | None = None
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = int(growth_interval)
            self._init_growth_tracker = 0
            self._growth_tracker: Tensor | None = None
            self._hysteresis = int(hysteresis)
            self._init_hysteresis_tracker = int(hysteresis)
            self._hysteresis_tracker: Tensor | None = None
            self._min_scale = min_scale
            self._max_scale = max_scale
            self._init_skipped_steps = 0
            self._skipped_steps: Tensor | None = None
            self._last_step_skipped: Tensor | None = None
            self._per_optimizer_states: dict[int, dict[str, Any]] = defaultdict(
                _refresh_per_optimizer_state)

    # ------------------------------------------------------------------ state

    def _check_scale_growth_tracker(self, funcname: str) -> tuple[Tensor, Tensor]:
        fix = ("This may indicate your script did not use scaler.scale(loss or outputs) "
               "earlier in the iteration.")
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  " + fix)
        if self._growth_tracker is None:
            raise AssertionError(f"Attempted {funcname} but _growth_tracker is None.  " + fix)
        return self._scale, self._growth_tracker

    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        if self._growth_tracker is not None:
            raise AssertionError("_growth_tracker initialized before _scale")
        if self._device is None:
            self._device = dev.type  # inferred from the first scaled tensor
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=dev)
        self._growth_tracker = torch.full((), self._init_growth_tracker, dtype=torch.int32,
                                          device=dev)
        self._hysteresis_tracker = torch.full((), self._init_hysteresis_tracker,
                                              dtype=torch.int32, device=dev)
        self._skipped_steps = torch.full((), self._init_skipped_steps, dtype=torch.int64,
                                         device=dev)
        self._last_step_skipped = torch.zeros((), dtype=torch.bool, device=dev)

    # ------------------------------------------------------------------ scale

    def scale(self, outputs: Tensor | Iterable[Tensor]) -> Tensor | Iterable[Tensor]:
        """Multiplies a tensor, or a (nested) list/tuple/iterable of tensors,
        by the scale factor. Returned unmodified when the scaler is disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            return outputs * self._scale.to(device=outputs.device, non_blocking=True)
        per_device: dict[torch.device, Tensor] = {}

        def apply_scale(val):
            if isinstance(val, Tensor):
                if self._scale is None:
                    self._lazy_init_scale_growth_tracker(val.device)
                s = per_device.get(val.device)
                if s is None:
                    s = per_device[val.device] = self._scale.to(device=val.device,
                                                                 non_blocking=True)
                return val * s
            if isinstance(val, Iterable):
                iterable = map(apply_scale, val)
                if isinstance(val, (list, tuple)):
                    return type(val)(iterable)
                return iterable
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    # --------------------------------------------------------- inf checks

    def _sync_found_inf(self, found_inf_per_device: dict, sharded: bool) -> None:
        """All ranks see the same found_inf (MAX), without a host sync.

        With sharded (DTensor) gradients and no process_group given, the
        default group is used, as torch's ShardedGradScaler does: otherwise
        each rank would decide its skips alone and the replicas would drift."""
        group = self._process_group
        if group is None:
            if not sharded:
                return
            import torch.distributed as dist
            if not dist.is_initialized():
                return
            group = dist.group.WORLD
        import torch.distributed as dist
        for found_inf in found_inf_per_device.values():
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=group)

    def _unscale_grads_(self, optimizer, inv_scale: Tensor, found_inf: Tensor,
                        allow_fp16: bool) -> dict[torch.device, Tensor]:
        """Unscales the grads in place and checks them (one pass per device)."""
        found_per_device: dict[torch.device, Tensor] = {}
        by_device, sharded = _grads_by_device(optimizer, allow_fp16)
        with torch.no_grad():
            for device, grads in by_device.items():
                found = found_inf if found_inf.device == device else found_inf.to(device, copy=True)
                torch.ops.torchext.unscale_(grads, found, inv_scale.to(device, non_blocking=True))
                found_per_device[device] = found
        self._sync_found_inf(found_per_device, sharded)
        return found_per_device

    def _check_inf_per_device(self, optimizer) -> dict[torch.device, Tensor]:
        """Read-only inf/NaN check of the grads (the fused path): they are
        read once and nothing but found_inf is written."""
        scale, _ = self._check_scale_growth_tracker("_check_inf_per_device")
        found_per_device: dict[torch.device, Tensor] = {}
        by_device, sharded = _grads_by_device(optimizer, allow_fp16=True)
        with torch.no_grad():
            for device, grads in by_device.items():
                found = torch.zeros((), dtype=torch.float32, device=device)
                torch.ops.torchext.check_finite_(grads, found)
                found_per_device[device] = found
        self._sync_found_inf(found_per_device, sharded)
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = found_per_device
        return found_per_device

    def _found_inf_per_device(self, optimizer) -> dict[torch.device, Tensor]:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def unscale_(self, optimizer) -> None:
        """Divides ("unscales") the optimizer's gradients by the scale, and
        records inf/NaN checks; no host sync. Once per optimizer per step."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update().")
        elif optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # Same float32 reciprocal as torch (the fused ASGD uses it too).
        inv_scale = self._scale.double().reciprocal().float()
        found_inf = torch.zeros((), dtype=torch.float32, device=self._scale.device)
        found = self._unscale_grads_(optimizer, inv_scale, found_inf, self._allow_fp16)
        optimizer_state["found_inf_per_device"] = found
        optimizer_state["stage"] = OptState.UNSCALED

    # ------------------------------------------------------------------ step

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        # Host check: only for optimizers that cannot skip on the device.
        if not sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            return optimizer.step(*args, **kwargs)
        return None

    def _combined_found_inf(self, states) -> Tensor:
        found_infs = [f.to(self._scale.device, non_blocking=True)
                      for state in states for f in state["found_inf_per_device"].values()]
        if not found_infs:
            raise AssertionError("No inf checks were recorded prior to update.")
        combined = found_infs[0]
        for f in found_infs[1:]:
            combined = combined + f
        return combined

    def step(self, optimizer, *args: Any, **kwargs: Any):
        """Unscales (unless :meth:`unscale_` was called) and steps the
        optimizer unless its gradients hold inf/NaN.

        With ``_step_supports_amp_scaling`` optimizers this is sync-free: the
        optimizer receives ``grad_scale``/``found_inf`` and skips on device.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            if optimizer_state["stage"] is OptState.READY:
                self._check_inf_per_device(optimizer)
            found_inf = self._combined_found_inf([optimizer_state])
            # Already unscaled (e.g. for clipping): do not unscale twice.
            optimizer.grad_scale = (None if optimizer_state["stage"] is OptState.UNSCALED
                                    else self._scale)
            optimizer.found_inf = found_inf
            try:
                retval = optimizer.step(*args, **kwargs)
            finally:
                del optimizer.grad_scale
                del optimizer.found_inf
            optimizer_state["stage"] = OptState.STEPPED
            return retval
        if optimizer_state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(optimizer_state["found_inf_per_device"]) == 0:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        retval = self._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)
        optimizer_state["stage"] = OptState.STEPPED
        return retval

    # ---------------------------------------------------------------- update

    def update(self, new_scale: float | Tensor | torch.optim.Optimizer | None = None) -> None:
        """Updates the scale factor, on the device.

        * ``update()``: from the inf checks of every optimizer stepped since
          the last update (any overflow counts), then resets them all; as torch.
        * ``update(optimizer)``: from that optimizer's inf checks only, then
          resets that optimizer's per-iteration state only. With several
          optimizers, prefer one ``update()`` after stepping them all:
          ``update(opt)`` per optimizer advances the growth/backoff schedule
          once per call.
        * ``update(new_scale)``: sets the scale (float or 1-element tensor),
          as torch.
        """
        if not self._enabled:
            return
        _scale, _growth_tracker = self._check_scale_growth_tracker("update")
        if isinstance(new_scale, torch.optim.Optimizer):
            key = id(new_scale)
            state = self._per_optimizer_states.get(key)
            if state is None or not state["found_inf_per_device"]:
                raise AssertionError(
                    "No inf checks were recorded for this optimizer prior to update(optimizer); "
                    "call scaler.step(optimizer) (or scaler.unscale_(optimizer)) first.")
            self._update_scale(self._combined_found_inf([state]))
            del self._per_optimizer_states[key]
            return
        if new_scale is not None:
            if isinstance(new_scale, (float, int)) and not isinstance(new_scale, bool):
                self._scale.fill_(new_scale)
            else:
                reason = ("new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                          "torch.FloatTensor with requires_grad=False.")
                if not isinstance(new_scale, Tensor):
                    raise AssertionError(reason)
                if new_scale.device.type != self._scale.device.type:
                    raise AssertionError(reason)
                if new_scale.numel() != 1:
                    raise AssertionError(reason)
                if new_scale.requires_grad is True:
                    raise AssertionError(reason)
                self._scale.copy_(new_scale.reshape(()))
        else:
            self._update_scale(self._combined_found_inf(self._per_optimizer_states.values()))
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def _update_scale(self, found_inf: Tensor) -> None:
        torch.ops.torchext.update_scale_(
            self._scale, self._growth_tracker, self._hysteresis_tracker, found_inf,
            growth_factor=float(self._growth_factor), backoff_factor=float(self._backoff_factor),
            growth_interval=int(self._growth_interval), hysteresis=int(self._hysteresis),
            min_scale=None if self._min_scale is None else float(self._min_scale),
            max_scale=None if self._max_scale is None else float(self._max_scale))
        skipped = found_inf > 0
        self._last_step_skipped.copy_(skipped)
        self._skipped_steps.add_(skipped.to(torch.int64))

    # --------------------------------------------------------- skip report

    @property
    def last_step_skipped(self) -> Tensor | None:
        """0-d bool device tensor: did the last :meth:`update` see an overflow
        (so the optimizer step was skipped)? Reading it costs no sync."""
        return self._last_step_skipped if self._enabled else None

    @property
    def skipped_steps(self) -> Tensor | None:
        """0-d int64 device tensor: steps skipped so far (kept in state_dict)."""
        return self._skipped_steps if self._enabled else None

    def was_step_skipped(self) -> bool:
        """Host-side convenience: syncs once to read :attr:`last_step_skipped`."""
        if not self._enabled or self._last_step_skipped is None:
            return False
        return bool(self._last_step_skipped.item())

    def num_skipped_steps(self) -> int:
        """Host-side convenience: syncs once to read :attr:`skipped_steps`."""
        if not self._enabled:
            return 0
        if self._skipped_steps is None:
            return self._init_skipped_steps
        return int(self._skipped_steps.item())

    # ------------------------------------------------------ getters/setters

    def _get_scale_async(self) -> Tensor | None:
        return self._scale

    def get_scale(self) -> float:
        """The current scale as a Python float (syncs), or 1.0 if disabled."""
        if self._enabled:
            return self._init_scale if self._scale is None else float(self._scale.item())
        return 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        if self._enabled:
            return (self._init_growth_tracker if self._growth_tracker is None
                    else int(self._growth_tracker.item()))
        return 0

    def _get_hysteresis_tracker(self) -> int:
        return (self._init_hysteresis_tracker if self._hysteresis_tracker is None
                else int(self._hysteresis_tracker.item()))

    def is_enabled(self) -> bool:
        return self._enabled

    # ------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state: only numbers, so it loads with
        ``torch.load(weights_only=True)``. torch's five keys come first (so
        ``torch.amp.GradScaler.load_state_dict`` reads it and ignores the
        rest); torchext adds a version, hysteresis, clamps and the skip count.
        Empty when disabled, as torch."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
            "_torchext_version": STATE_DICT_VERSION,
            "hysteresis": self._hysteresis,
            "_hysteresis_tracker": self._get_hysteresis_tracker(),
            "min_scale": 0.0 if self._min_scale is None else float(self._min_scale),
            "max_scale": float("inf") if self._max_scale is None else float(self._max_scale),
            "skipped_steps": self.num_skipped_steps(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state_dict of this class or of ``torch.amp.GradScaler``,
        before or after the first :meth:`scale`. Validated before anything
        changes. A torch state_dict leaves the torchext-only settings as
        constructed (hysteresis tracker full, skip count 0)."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler.")
        missing = [k for k in ("scale", "growth_factor", "backoff_factor", "growth_interval",
                               "_growth_tracker") if k not in state_dict]
        if missing:
            raise KeyError(f"GradScaler state_dict is missing {missing}")
        version = state_dict.get("_torchext_version", 0)
        if version > STATE_DICT_VERSION:
            raise RuntimeError(
                f"GradScaler state_dict version {version} is newer than this torchext "
                f"understands ({STATE_DICT_VERSION}); upgrade torchext.")
        sd = dict(state_dict)
        for key in ("scale", "growth_factor", "backoff_factor"):
            sd[key] = float(sd[key])
        self._init_scale = sd["scale"]
        self._growth_factor = sd["growth_factor"]
        self._backoff_factor = sd["backoff_factor"]
        self._growth_interval = int(sd["growth_interval"])
        self._init_growth_tracker = int(sd["_growth_tracker"])
        if version >= 1:
            self._hysteresis = int(sd["hysteresis"])
            self._init_hysteresis_tracker = int(sd["_hysteresis_tracker"])
            lo, hi = float(sd["min_scale"]), float(sd["max_scale"])
            self._min_scale = None if lo == 0.0 else lo
            self._max_scale = None if hi == float("inf") else hi
            self._init_skipped_steps = int(sd["skipped_steps"])
        if self._scale is not None:
            self._scale.fill_(self._init_scale)
            self._growth_tracker.fill_(self._init_growth_tracker)
            self._hysteresis_tracker.fill_(self._init_hysteresis_tracker)
            self._skipped_steps.fill_(self._init_skipped_steps)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self._enabled:
            if len(self._per_optimizer_states) != 0:
                raise AssertionError(
                    "A GradScaler instance may only be pickled at the beginning "
                    "of an iteration, or at the end after scaler.update().")
            # Tensors are re-created lazily from these numbers on unpickling.
            state["_init_scale"] = self.get_scale()
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_init_hysteresis_tracker"] = self._get_hysteresis_tracker()
            state["_init_skipped_steps"] = self.num_skipped_steps()
            for key in ("_scale", "_growth_tracker", "_hysteresis_tracker", "_skipped_steps",
                        "_last_step_skipped"):
                state[key] = None
            state["_process_group"] = None  # process groups do not pickle
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
