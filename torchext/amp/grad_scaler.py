"""``torchext.amp.GradScaler``: torch's GradScaler on torchext's ops.

It extends ``torch.amp.GradScaler`` as torch's own ``ShardedGradScaler``
does: construction, the getters and setters, ``state_dict`` and pickling are
torch's (extended with torchext's keys). Overridden is what differs, and one
constraint decides it: Dynamo does not trace code defined in
torch/amp/grad_scaler.py, so everything a compiled training step calls
(``scale``, ``unscale_``, ``step``, ``update`` and their helpers) is defined
here. How an optimizer is stepped (plain or fused) is the protocol in
``protocol.py``; the checkpoint rules are in ``_checkpoint.py``.
"""
from __future__ import annotations

import inspect
import warnings
from collections import defaultdict
from typing import Any, Iterable

import torch
from torch import Tensor
from torch.amp.grad_scaler import OptState

from .. import _clip
from .._compile_compat import STEP_GATE_FRAMES, gate_compiled_step, param_groups
from . import _checkpoint, protocol
from .._grads import GradsByDevice

__all__ = ["GradScaler", "OptState"]

STATE_DICT_VERSION = _checkpoint.STATE_DICT_VERSION
_UPDATE_SCALE = torch.ops.torchext.update_scale_.counted


def _refresh_per_optimizer_state() -> dict[str, Any]:
    # torch's function of the same name, defined here so that Dynamo traces
    # the defaultdict's factory inside a compiled step.
    return {"stage": OptState.READY, "found_inf_per_device": {}}


def _step_takes_grad_scaler(optimizer) -> bool:
    # torch's older contract for _step_supports_amp_scaling optimizers: a
    # step(grad_scaler=...) keyword gets the scaler itself. (Asked only of
    # optimizers outside torchext's protocol: inspect.signature costs a fifth
    # of an eager step's fixed cost.)
    return "grad_scaler" in inspect.signature(optimizer.step).parameters


class GradScaler(torch.amp.GradScaler):
    r"""Dynamic loss scaling, as :class:`torch.amp.GradScaler`, on torchext ops.

    Every public method of ``torch.amp.GradScaler`` works the same, with the
    same errors for misuse, and ``_per_optimizer_states[id(opt)]["stage"]``
    holds torch's :class:`~torch.amp.grad_scaler.OptState`. Beyond torch:

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

    ``scaler.step(opt)`` steps torchext's ASGD (and any optimizer with the
    fused-step protocol, ``torchext/amp/protocol.py``) in one fused pass: a
    read-only inf/NaN check, then a step that unscales on the fly. Whether
    ``step()`` is called on an overflow follows torch: not called (one host
    read of found_inf), unless no host read may happen (torch.compile,
    CUDA-graph capture, ``capturable=True``): then the skip is decided on
    the device. Other optimizers get torch's behaviour: unscale, a host
    check, then step.

    :meth:`step` and :meth:`unscale_` are all-or-nothing: every gradient of
    every group and device is checked before the first one is written, and
    when the optimizer's step raises, the scaler's records for that
    optimizer are as they were before the call. :meth:`step` returns what
    the optimizer's ``step()`` returned (None when it was skipped).
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
        # torch checks growth/backoff factors (AssertionError, its messages)
        # and disables a "cuda" scaler without CUDA; the rest is checked here.
        super().__init__(device, init_scale, growth_factor, backoff_factor, growth_interval,
                         enabled)
        self._allow_fp16 = allow_fp16
        self._process_group = process_group
        if self._enabled:
            _checkpoint.check_options(init_scale=init_scale, growth_factor=growth_factor,
                                      backoff_factor=backoff_factor,
                                      growth_interval=growth_interval, hysteresis=hysteresis,
                                      min_scale=min_scale, max_scale=max_scale)
            self._growth_interval = int(growth_interval)
            self._hysteresis = int(hysteresis)
            self._init_hysteresis_tracker = int(hysteresis)
            self._hysteresis_tracker: Tensor | None = None
            self._min_scale = min_scale
            self._max_scale = max_scale
            self._init_skipped_steps = 0
            self._skipped_steps: Tensor | None = None
            self._last_step_skipped: Tensor | None = None
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    # ------------------------------------------------------------------ state
    # _check_scale_growth_tracker is torch's, restated because step() calls
    # it inside compiled code (see the module docstring).

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

    def _optimizer_state(self, optimizer) -> dict[str, Any]:
        """This iteration's record for ``optimizer``, without creating one:
        a call that fails leaves ``_per_optimizer_states`` as it was."""
        state = self._per_optimizer_states.get(id(optimizer))
        return _refresh_per_optimizer_state() if state is None else state

    # ------------------------------------------------------------------ scale

    def scale(self, outputs: Tensor | Iterable[Tensor]) -> Tensor | Iterable[Tensor]:
        """Multiplies a tensor, or a (nested) list/tuple/iterable of tensors,
        by the scale factor. Returned unmodified when the scaler is disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            scale = self._scale
            if scale.device != outputs.device:  # (a .to that moves nothing still costs)
                scale = scale.to(device=outputs.device, non_blocking=True)
            return outputs * scale
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
        """torch's private method, with torch's signature (its tests and
        subclasses such as ``ShardedGradScaler`` call and override it):
        unscales the grads in place and checks them (one pass per device),
        after every device's grads passed the op's checks. ``found_inf`` is
        the template of each device's flag (a copy per device, as torch's
        ``_MultiDeviceReplicator`` makes); returns the flags per device."""
        grads = GradsByDevice(optimizer, allow_fp16)
        unscale = torch.ops.torchext.unscale_
        grads.validate(lambda ts, found: unscale(ts, found, torch.ones_like(found)))
        for param, coalesced in grads.coalesced:
            param.grad = coalesced
        found_per_device = {}
        with torch.no_grad():
            for device, ts in grads.lists.items():
                found = found_per_device[device] = found_inf.to(device=device, non_blocking=True,
                                                                copy=True)
                unscale(ts, found, inv_scale.to(device, non_blocking=True))
        self._sync_found_inf(found_per_device, grads.sharded)
        return found_per_device

    def _check_inf_grads(self, optimizer, allow_fp16: bool = True) -> dict[torch.device, Tensor]:
        """Read-only inf/NaN check of the grads (the fused step): they are
        read once and nothing but the returned found_inf is written. fp16
        grads are refused unless ``allow_fp16`` (unscale_'s rule)."""
        found_per_device = protocol.fused_check(optimizer, allow_fp16)
        if found_per_device is not None:
            if self._process_group is not None:  # (else no sync: plain grads)
                self._sync_found_inf(found_per_device, sharded=False)
            return found_per_device
        grads = GradsByDevice(optimizer, allow_fp16)
        check = torch.ops.torchext.check_finite_
        grads.validate(check)
        found_per_device = grads.each_device(lambda device, ts, found: check(ts, found))
        self._sync_found_inf(found_per_device, grads.sharded)
        return found_per_device

    def _check_inf_per_device(self, optimizer) -> dict[torch.device, Tensor]:
        # torch's private method, called by no code of torchext's (our step
        # checks through _check_inf_grads): apex's FusedAdam/FusedLAMB with
        # capturable=True call it from step(grad_scaler=...), the keyword this
        # scaler still passes (_fused_step). Checks and records the result for
        # `optimizer`, read-only (torch's unscales the grads by 1 in place).
        self._check_scale_growth_tracker("_check_inf_per_device")
        found_per_device = self._check_inf_grads(optimizer)
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = found_per_device
        return found_per_device

    def found_inf(self, optimizer) -> Tensor:
        """How many inf/NaN checks failed for ``optimizer`` since the last
        :meth:`update` (its :meth:`unscale_` or :meth:`step`), summed over
        devices: a 0-d float32 tensor on the scale's device, read without a
        host sync. Nonzero means its step is (or was) skipped. Raises when
        nothing was recorded for it."""
        state = self._per_optimizer_states.get(id(optimizer))
        if state is None or not state["found_inf_per_device"]:
            raise AssertionError(
                "No inf checks were recorded for this optimizer; call "
                "scaler.unscale_(optimizer) or scaler.step(optimizer) first.")
        return self._combined_found_inf([state])

    def unscale_(self, optimizer) -> None:
        """Divides ("unscales") the optimizer's gradients by the scale, and
        records inf/NaN checks; no host sync. Once per optimizer per step."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        optimizer_state = self._optimizer_state(optimizer)
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update().")
        elif optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # Same float32 reciprocal as torch (the fused ASGD uses it too).
        inv_scale = self._scale.double().reciprocal().float()
        found = self._unscale_grads_(
            optimizer, inv_scale, torch.zeros((), dtype=torch.float32, device=self._scale.device),
            self._allow_fp16)
        optimizer_state["found_inf_per_device"] = found
        optimizer_state["stage"] = OptState.UNSCALED
        self._per_optimizer_states[id(optimizer)] = optimizer_state

    # ------------------------------------------------------------------ clip

    def stage(self, optimizer) -> OptState:
        """This iteration's stage for ``optimizer``, torch's
        :class:`~torch.amp.grad_scaler.OptState`: READY, UNSCALED (after
        :meth:`unscale_` or :meth:`clip_grad_norm_`, as torch's recipe
        unscales before it clips) or STEPPED. The public read of what
        ``_per_optimizer_states[id(optimizer)]["stage"]`` holds."""
        state = self._per_optimizer_states.get(id(optimizer)) if self._enabled else None
        return OptState.READY if state is None else state["stage"]

    def clip_grad_norm_(self, optimizer, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
        """torch's recipe ``unscale_(optimizer)`` + ``torch.nn.utils.clip_grad_norm_``
        over the optimizer's gradients, in two fused passes: one read gives
        the norms of the unscaled gradients and the inf/NaN check, one pass
        writes the unscaled, clipped gradients (rounded after each factor,
        as torch's recipe stores them). Returns the total norm (torch's
        value, dtype and device: the first gradient's; inf/NaN on an
        overflow step). Afterwards everything is as torch's recipe leaves
        it: the gradients clipped, the record UNSCALED with the inf check;
        whatever code then runs before :meth:`step`, the step uses what the
        gradients hold (Note [Clip: applied when called, folded only inside
        one call], ``torchext/_clip.py``). To fold the clip into a fused
        step instead of rewriting the gradients, use :meth:`clip_and_step`.

        ``optimizer`` may be a list of optimizers on this scaler: one clip
        over all their gradients (torch's ``unscale_(o1)``, ``unscale_(o2)``,
        one ``clip_grad_norm_`` over every parameter). After :meth:`unscale_`
        (Lightning's order) it clips without unscaling again, and a second
        clip measures the clipped gradients, as torch's recipe does. fp16
        gradients are refused unless ``allow_fp16`` (torch's ``unscale_``
        refuses them). ``error_if_nonfinite=True`` reads the norm on the
        host (refused under torch.compile and CUDA-graph capture) and, on a
        non-finite norm, leaves what torch's recipe leaves before it raises:
        the gradients unscaled (not clipped) and the inf check recorded, so
        ``update()`` backs off. ``max_norm=inf`` measures and never clips
        (torch multiplies by inf/inf = NaN when the norm overflowed). With
        sharded (DTensor, FSDP2) gradients the norm is the global one, each
        rank's part all-reduced over ``process_group`` (default WORLD).
        ``foreach`` is accepted for torch's signature (one fused pass either
        way). Bad gradients are refused before anything is written."""
        optimizers = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
        if not self._enabled:
            return _clip.clip_optimizers_(optimizers, max_norm, norm_type, error_if_nonfinite,
                                          foreach)
        measured, reads, refused = self._measure(optimizers, norm_type, error_if_nonfinite,
                                                 "clip_grad_norm_")
        if measured.total is None:
            return torch.tensor(0.0)
        with torch.no_grad():
            coef = None if refused else _clip.clip_coef(measured.total, max_norm)
        for k, (opt, inv_scale) in enumerate(reads):
            _clip.apply_(opt, measured.grads[k], inv_scale, coef)
            self._record_unscaled(opt, inv_scale, measured.found[k], measured.grads[k])
        if refused is not None:
            raise refused
        return measured.total

    def _measure(self, optimizers, norm_type, error_if_nonfinite, name):
        """A clip's read (``_clip.measure``) for ``optimizers``, each
        unscaled unless its record says UNSCALED, checked first (no scale,
        after step, host read refused). Returns the read, its (optimizer,
        inv_scale) pairs and the ``error_if_nonfinite`` error to raise once
        the gradients are left as torch's recipe leaves them (None if none).
        Nothing is written or recorded."""
        self._check_scale_growth_tracker(name)
        _clip.check_host_read(error_if_nonfinite)
        inv = None
        reads = []
        for opt in optimizers:
            stage = self.stage(opt)
            if stage is OptState.STEPPED:
                raise RuntimeError(f"{name}() is being called after step().")
            if stage is OptState.READY and inv is None:
                # Same float32 reciprocal as torch's unscale_.
                inv = self._scale.double().reciprocal().float()
            reads.append((opt, inv if stage is OptState.READY else None))
        # (fp16 grads: torch's unscale_ refuses them; already unscaled ones pass)
        allow_fp16 = self._allow_fp16 or all(i is None for _, i in reads)
        measured = _clip.measure(reads, float(norm_type), allow_fp16, self._sharded_group)
        refused = None
        if measured.total is not None:
            try:
                _clip.check_nonfinite(measured.total, float(norm_type), error_if_nonfinite)
            except RuntimeError as e:  # the clip is refused, its unscale stands (as torch's)
                refused = e
        return measured, reads, refused

    def _record_unscaled(self, optimizer, inv_scale, found_per_device, grads,
                         synced: bool = False) -> None:
        """The record torch's ``unscale_`` leaves: UNSCALED, with the inf
        check of this read (all-reduced here unless ``synced``; kept from the
        earlier unscale_ when the gradients were unscaled already)."""
        state = self._optimizer_state(optimizer)
        if inv_scale is not None:
            if found_per_device is None:  # (no grads on this optimizer)
                found_per_device = {}
            if not synced:
                self._sync_found_inf(found_per_device, grads is not None and grads.sharded)
            state["found_inf_per_device"] = found_per_device
        state["stage"] = OptState.UNSCALED
        self._per_optimizer_states[id(optimizer)] = state

    @gate_compiled_step  # (a torch that cannot trace it: _compile_compat (6))
    def clip_and_step(self, optimizer, max_norm: float, norm_type: float = 2.0, *,
                      error_if_nonfinite: bool = False, **kwargs: Any) -> _clip.ClipAndStep:
        """:meth:`clip_grad_norm_` then :meth:`step` in one call, with the
        clip folded into a fused step where nothing can come between the
        two (DeepSpeed's ``engine.step()``): returns ``(total_norm,
        result)``, the norm :meth:`clip_grad_norm_` returns and what
        ``optimizer.step(**kwargs)`` returned (None when it was skipped).
        It does not call :meth:`update`, and leaves the record STEPPED, as
        :meth:`step` does.

        How the clip reaches the step (Note [Clip: applied when called,
        folded only inside one call], ``torchext/_clip.py``), and what the
        gradients hold afterwards:

        * torchext's ASGD: the step gets ``grad_scale`` and ``clip_coef``,
          two factors multiplied one after the other (exact at every scale
          up to 2**127); its gradients are left scaled and unclipped.
        * torch's fused Adam/AdamW/SGD: ``grad_scale = scale / coef`` where
          that float32 is finite (a host read); they write back
          ``grad / grad_scale`` (scaled, when the step was skipped). Where it
          is not, and always under torch.compile and CUDA-graph capture,
          the gradients are unscaled and clipped first.
        * any other optimizer, and any optimizer with step pre-hooks (user
          code that would run between the two halves): the gradients are
          unscaled and clipped in place first, then stepped, so the hooks
          see torch's values.

        After :meth:`unscale_` or a two-call clip in the same iteration it
        measures the gradients as they are and clips them again, as torch's
        recipe with one more clip would; it never unscales twice. A call
        that raises before it writes changes nothing; once the gradients
        were written (the pass, then a step that raised) the record says
        UNSCALED, so :meth:`step` retries without clipping twice.
        ``error_if_nonfinite`` leaves what torch's recipe leaves (the
        gradients unscaled, the inf check recorded) and raises."""
        if not self._enabled:
            return _clip.clip_and_step_plain(optimizer, max_norm, norm_type, error_if_nonfinite,
                                             kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        ours = getattr(optimizer, protocol.STEP, False)
        foldable = ((ours or protocol.torch_fused(optimizer))
                    and not _clip.has_step_pre_hooks(optimizer)
                    and (ours or not _step_takes_grad_scaler(optimizer)))
        if not foldable:  # the pass, then the step: nothing to fold into
            total = self.clip_grad_norm_(optimizer, max_norm, norm_type, error_if_nonfinite)
            return _clip.ClipAndStep(total, self.step(optimizer, **kwargs))
        state = self._per_optimizer_states.get(id(optimizer))
        stage = OptState.READY if state is None else state["stage"]
        if stage is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        torch_fused = protocol.torch_fused(optimizer)
        self._check_scale_growth_tracker("clip_and_step")
        _clip.check_host_read(error_if_nonfinite)
        inv_scale = (self._scale.double().reciprocal().float() if stage is OptState.READY
                     else None)
        norm_type = float(norm_type)
        measured = _clip.measure([(optimizer, inv_scale)], norm_type,
                                 inv_scale is None or torch_fused or self._allow_fp16,
                                 self._sharded_group)
        total = measured.total
        if total is None:  # no gradients: torch's recipe's tensor(0.), then its step
            self._record_unscaled(optimizer, inv_scale, None, None)
            return _clip.ClipAndStep(torch.tensor(0.0), self.step(optimizer, **kwargs))
        try:
            _clip.check_nonfinite(total, norm_type, error_if_nonfinite)
        except RuntimeError:  # torch's recipe: its unscale_ stands, the clip raised
            _clip.apply_(optimizer, measured.grads[0], inv_scale, None)
            self._record_unscaled(optimizer, inv_scale, measured.found[0], measured.grads[0])
            raise
        with torch.no_grad():
            coef = _clip.clip_coef(total, max_norm)
        found_per_device = measured.found[0] if inv_scale is not None else None
        if found_per_device is not None:
            self._sync_found_inf(found_per_device, measured.grads[0] is not None
                                 and measured.grads[0].sharded)

        def apply_first():
            # The pass: unscaled and clipped in place, recorded as such (a
            # step that then raises is retried by step() without a second clip).
            _clip.apply_(optimizer, measured.grads[0], inv_scale, coef)
            self._record_unscaled(optimizer, inv_scale, found_per_device, measured.grads[0],
                                  synced=True)

        retval, found_per_device = self._fused_step(
            optimizer, stage, state, (), kwargs, coef=coef, found_per_device=found_per_device,
            apply_first=apply_first)
        self._record_stepped(optimizer, found_per_device)
        return _clip.ClipAndStep(total, retval)

    def _sharded_group(self):
        import torch.distributed as dist
        return self._process_group if self._process_group is not None else dist.group.WORLD

    # ------------------------------------------------------------------ step

    def _combined_found_inf(self, states) -> Tensor:
        """The found_inf of every state's devices, summed on the scale's
        device (one device on it: its tensor itself, no op)."""
        device = self._scale.device
        combined = None
        for state in states:
            for f in state["found_inf_per_device"].values():
                if f.device != device:  # (a .to that moves nothing still costs)
                    f = f.to(device, non_blocking=True)
                combined = f if combined is None else combined + f
        if combined is None:
            raise AssertionError("No inf checks were recorded prior to update.")
        return combined

    @gate_compiled_step  # (a torch that cannot trace it: _compile_compat (6))
    def step(self, optimizer, *args: Any, **kwargs: Any):
        """Unscales (unless :meth:`unscale_` was called) and steps the
        optimizer unless its gradients hold inf/NaN; returns what
        ``optimizer.step()`` returned, or None when it was not called.

        Optimizers with the fused-step protocol (``protocol.py``: torchext's
        ASGD, torch's fused Adam/AdamW/SGD) get ``grad_scale``/``found_inf``
        and unscale on the fly
        (``grad_scale`` multiplied by one already set on the optimizer, as
        torch). One whose ``step`` takes a ``grad_scaler`` keyword gets this
        scaler that way instead, with torch's FutureWarning.

        When the optimizer's step raises, the records are as they were
        before the call (gradients unscaled before a plain optimizer's step
        stay so, and the record says UNSCALED, so a retry does not unscale
        them again).
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        if self._scale is None or self._growth_tracker is None:
            self._check_scale_growth_tracker("step")
        # (this iteration's record, read without creating one: see _optimizer_state)
        state = self._per_optimizer_states.get(id(optimizer))
        stage = OptState.READY if state is None else state["stage"]
        if stage is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if protocol.takes_grad_scale(optimizer):
            retval, found_per_device = self._fused_step(optimizer, stage, state, args, kwargs)
            self._record_stepped(optimizer, found_per_device)
            return retval
        if stage is OptState.READY:
            self.unscale_(optimizer)
        state = self._per_optimizer_states[id(optimizer)]
        if len(state["found_inf_per_device"]) == 0:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        _, retval = protocol.step_unless_overflow(
            optimizer, lambda: optimizer.step(*args, **kwargs),
            self._combined_found_inf((state,)), device_skip=False)
        state["stage"] = OptState.STEPPED
        return retval

    def _record_stepped(self, optimizer, found_per_device) -> None:
        state = self._per_optimizer_states.get(id(optimizer))  # (the step may have made it)
        if state is None:  # (the usual case: made here, not by the defaultdict's factory)
            self._per_optimizer_states[id(optimizer)] = {
                "stage": OptState.STEPPED, "found_inf_per_device": found_per_device}
        else:
            state["found_inf_per_device"] = found_per_device
            state["stage"] = OptState.STEPPED

    def _fused_step(self, optimizer, stage, state, args, kwargs, coef=None,
                    found_per_device=None, apply_first=None):
        """The optimizer unscales (and, with no host read allowed, skips) by
        itself. Nothing is recorded for it here: returns what its step
        returned and the found_inf per device to record. ``state``: its
        record of this iteration, None when there is none yet. From
        :meth:`clip_and_step`: ``coef``, the clip coefficient to fold in,
        ``found_per_device``, the inf check of the clip's read, and
        ``apply_first()``, the pass that unscales and clips the gradients
        where one float32 ``grad_scale`` cannot carry the clip."""
        ours = getattr(optimizer, protocol.STEP, False)
        if not ours and _step_takes_grad_scaler(optimizer):
            warnings.warn(
                "GradScaler is going to stop passing itself as a keyword argument to the passed "
                "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
                "`found_inf: Tensor` to the passed optimizer and let the optimizer use them "
                "directly.", FutureWarning, stacklevel=3 + STEP_GATE_FRAMES)
            retval = optimizer.step(*args, **{**kwargs, "grad_scaler": self})
            # (what its step recorded through _check_inf_per_device, if anything)
            return retval, self._optimizer_state(optimizer)["found_inf_per_device"]
        # What torch's scaler treats as fused (its _step_supports_amp_scaling)
        # steps fp16 grads and, with no grads, a no-op; any other optimizer is
        # unscaled by torch's recipe, which refuses both.
        torch_fused = protocol.torch_fused(optimizer)
        if found_per_device is None:  # (else clip_and_step's read checked them)
            found_per_device = (
                self._check_inf_grads(optimizer, torch_fused or self._allow_fp16)
                if stage is OptState.READY
                else state["found_inf_per_device"])  # (unscale_ or a clip checked them)
        device = self._scale.device
        if len(found_per_device) == 1:  # (the usual case, without _combined_found_inf's loops)
            found_inf, = found_per_device.values()
            if found_inf.device != device:
                found_inf = found_inf.to(device, non_blocking=True)
        elif found_per_device:
            found_inf = self._combined_found_inf(({"found_inf_per_device": found_per_device},))
        elif torch_fused:
            found_inf = torch.zeros((), dtype=torch.float32, device=device)
        else:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        device_skip = protocol.must_not_sync(optimizer)
        if device_skip and len(found_per_device) > 1:
            # torch's fused kernels skip only when found_inf == 1.
            found_inf = torch.clamp(found_inf, max=1.0)

        def attrs():
            grad_scale = None if stage is OptState.UNSCALED else self._scale
            clip_coef = None
            if coef is not None and ours:  # two factors, one after the other
                clip_coef = coef if coef.dtype in (torch.float32, torch.float64) else coef.float()
            elif coef is not None:  # one factor: scale / coef, where a finite float32
                folded = _clip.one_factor(grad_scale, coef, not device_skip
                                          or protocol.host_read_allowed())
                if folded is None:
                    apply_first()
                grad_scale = folded
            # A grad_scale already on the optimizer is multiplied in, as torch does.
            user_scale = getattr(optimizer, "grad_scale", None)
            if user_scale is not None:
                grad_scale = user_scale if grad_scale is None else grad_scale * user_scale
            return ({"grad_scale": grad_scale, "clip_coef": clip_coef} if ours
                    else {"grad_scale": grad_scale})

        _, retval = protocol.step_unless_overflow(
            optimizer, lambda: optimizer.step(*args, **kwargs), found_inf, device_skip, attrs)
        return retval, found_per_device

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
        if self._scale is None or self._growth_tracker is None:
            self._check_scale_growth_tracker("update")
        by_optimizer = isinstance(new_scale, torch.optim.Optimizer)
        if new_scale is None or by_optimizer:
            if by_optimizer:
                state = self._per_optimizer_states.get(id(new_scale))
                if state is None or not state["found_inf_per_device"]:
                    raise AssertionError(
                        "No inf checks were recorded for this optimizer prior to "
                        "update(optimizer); call scaler.step(optimizer) (or "
                        "scaler.unscale_(optimizer)) first.")
                found_inf = self._combined_found_inf((state,))
            else:
                found_inf = self._combined_found_inf(self._per_optimizer_states.values())
            # One op: the scale's update and the skip record (last_step_skipped
            # = found_inf != 0, skipped_steps += it), in place (a CUDA graph
            # keeps the tensors); its settings positional (cheaper to parse).
            _UPDATE_SCALE(
                self._scale, self._growth_tracker, self._hysteresis_tracker, found_inf,
                self._last_step_skipped, self._skipped_steps, float(self._growth_factor),
                float(self._backoff_factor), int(self._growth_interval), int(self._hysteresis),
                None if self._min_scale is None else float(self._min_scale),
                None if self._max_scale is None else float(self._max_scale))
            if by_optimizer:
                del self._per_optimizer_states[id(new_scale)]
            else:
                self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
            return
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
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

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

    def _get_hysteresis_tracker(self) -> int:
        return (self._init_hysteresis_tracker if self._hysteresis_tracker is None
                else int(self._hysteresis_tracker.item()))

    # ------------------------------------------------------------ checkpoint
    # get_scale, the growth/backoff/interval getters and setters,
    # is_enabled, _get_growth_tracker and __setstate__ are torch's.

    def state_dict(self) -> dict[str, Any]:
        """torch's state_dict (its five keys first, so
        ``torch.amp.GradScaler.load_state_dict`` reads ours), plus torchext's
        version, hysteresis, clamps and skip count: only numbers, so it loads
        with ``torch.load(weights_only=True)``. Empty when disabled, as torch."""
        if not self._enabled:
            return {}
        return {
            **super().state_dict(),
            "_torchext_version": STATE_DICT_VERSION,
            "hysteresis": self._hysteresis,
            "_hysteresis_tracker": self._get_hysteresis_tracker(),
            "min_scale": 0.0 if self._min_scale is None else float(self._min_scale),
            "max_scale": float("inf") if self._max_scale is None else float(self._max_scale),
            "skipped_steps": self.num_skipped_steps(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state_dict of this class or of ``torch.amp.GradScaler``,
        before or after the first :meth:`scale`. All of it is checked first
        (numbers, the constructor's rules, a finite scale > 0): when it is
        refused, nothing changes. A torch state_dict leaves the
        torchext-only settings as constructed (hysteresis tracker full, skip
        count 0)."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler.")
        sd = _checkpoint.parse_state_dict(state_dict)
        super().load_state_dict({k: sd[k] for k in _checkpoint.TORCH_KEYS})
        if sd["version"] >= 1:
            self._hysteresis = sd["hysteresis"]
            self._init_hysteresis_tracker = sd["_hysteresis_tracker"]
            self._min_scale = None if sd["min_scale"] == 0.0 else sd["min_scale"]
            self._max_scale = None if sd["max_scale"] == float("inf") else sd["max_scale"]
            self._init_skipped_steps = sd["skipped_steps"]
        if self._scale is not None:
            self._hysteresis_tracker.fill_(self._init_hysteresis_tracker)
            self._skipped_steps.fill_(self._init_skipped_steps)

    def __getstate__(self) -> dict[str, Any]:
        # torch's refuses mid-iteration and turns scale and growth tracker
        # into numbers; the other tensors are turned into numbers here.
        state = super().__getstate__()
        if self._enabled:
            state["_init_hysteresis_tracker"] = self._get_hysteresis_tracker()
            state["_init_skipped_steps"] = self.num_skipped_steps()
            for key in ("_hysteresis_tracker", "_skipped_steps", "_last_step_skipped"):
                state[key] = None
            state["_process_group"] = None  # process groups do not pickle
        return state
