"""``torchext.optim.ASGD``: a drop-in ``torch.optim.ASGD`` on one fused op."""
from __future__ import annotations

import functools
from itertools import chain
from typing import Any

import torch
from torch import Tensor
from torch.optim import optimizer as _torch_optimizer
from torch.optim.optimizer import Optimizer, ParamsT

from .. import _clip, _devices
from .._compile_compat import (GroupsAlias, mark_step_not_wrapped, param_groups,
                               gate_compiled_step)
from .. import _dtensor
from . import _checkpoint, _op
from . import averaging as _averaging
from . import functional as F
from ._state import SCALAR_KEYS, Generation, ParamGroupSlots, ParamState, own_containers

__all__ = ["ASGD"]


def _has_hooks(self) -> bool:
    return bool(_torch_optimizer._global_optimizer_pre_hooks or self._optimizer_step_pre_hooks
                or self._optimizer_step_post_hooks
                or _torch_optimizer._global_optimizer_post_hooks)


def _run_hooked(self, func, args, kwargs):
    """torch's ``Optimizer.profile_hook_step`` around ``func(*args,
    **kwargs)``: global and per-instance pre-hooks (called with the args
    torch's wrapper gives them, the optimizer first, and free to replace
    them), ``_optimizer_step_code``, then the post-hooks; in the profiler's
    ``Optimizer.step#ASGD.step`` range only while a profiler runs or
    torch.compile traces (entering it costs ~10 us of an eager step
    otherwise spent doing nothing)."""
    if torch.compiler.is_compiling() or torch._C._autograd._profiler_enabled():
        with torch.autograd.profiler.record_function("Optimizer.step#ASGD.step"):
            return _call_hooked(self, func, args, kwargs)
    return _call_hooked(self, func, args, kwargs)


def _call_hooked(self, func, args, kwargs):
    # (the hook dicts are usually empty: not walked then, ~0.5 us a step)
    if _torch_optimizer._global_optimizer_pre_hooks or self._optimizer_step_pre_hooks:
        for pre_hook in chain(_torch_optimizer._global_optimizer_pre_hooks.values(),
                              self._optimizer_step_pre_hooks.values()):
            result = pre_hook(self, args, kwargs)
            if result is not None:
                if isinstance(result, tuple) and len(result) == 2:
                    args, kwargs = result
                else:
                    raise RuntimeError(f"{func} must return None or a tuple of (new_args, "
                                       f"new_kwargs), but got {result}.")
    out = func(*args, **kwargs)
    self._optimizer_step_code()
    if self._optimizer_step_post_hooks or _torch_optimizer._global_optimizer_post_hooks:
        for post_hook in chain(self._optimizer_step_post_hooks.values(),
                               _torch_optimizer._global_optimizer_post_hooks.values()):
            post_hook(self, args, kwargs)
    return out


def _hooked_step(func):
    """``func`` (the step) behind torch's hooks and profiler range
    (:func:`_run_hooked`), with no frame of its own when neither is on.
    Marked ``hooked`` so that ``Optimizer.__init__`` does not wrap it again."""

    @functools.wraps(func)
    def wrapper(self, *args, **kwargs):
        if (torch.compiler.is_compiling() or torch._C._autograd._profiler_enabled()
                or _has_hooks(self)):
            return _run_hooked(self, func, (self, *args), kwargs)
        # No hook: the step without run's frame, and without
        # _optimizer_step_code (a marker for the profiler, which is off).
        return func(self, *args, **kwargs)

    wrapper.hooked = True
    return wrapper


class _ClipCall:
    """The clip of one :meth:`ASGD.clip_and_step` call: its settings, and
    the total norm once measured (inside the step, after the closure)."""
    __slots__ = ("max_norm", "norm_type", "error_if_nonfinite", "total")

    def __init__(self, max_norm: float, norm_type: float, error_if_nonfinite: bool) -> None:
        self.max_norm, self.norm_type = max_norm, norm_type
        self.error_if_nonfinite, self.total = error_if_nonfinite, None

    def measure(self, opt) -> Tensor | None:
        """Measures ``opt``'s gradients: the clip coefficient for its step
        (None: nothing to clip). Gradients torchext's kernels do not serve
        are clipped in place by torch's function instead."""
        measured = opt._measure_clip(self.norm_type)
        if measured is None:
            self.total = _clip.clip_(opt._params(), self.max_norm, self.norm_type,
                                     self.error_if_nonfinite)
            return None
        if measured.total is None:
            self.total = torch.tensor(0.0)
            return None
        self.total = measured.total
        with torch.no_grad():
            _clip.check_nonfinite(measured.total, self.norm_type, self.error_if_nonfinite)
            return _clip.clip_coef(measured.total, self.max_norm)


class ASGD(GroupsAlias, Optimizer):
    r"""Averaged Stochastic Gradient Descent, as ``torch.optim.ASGD``, fused.

    Same arguments, same update and the same ``state_dict`` layout as
    :class:`torch.optim.ASGD` (checkpoints load both ways), plus:

    Args:
        fused (bool, optional): use the fused ``torch.ops.torchext.asgd_`` op.
            ``None`` (default) means fused whenever every parameter is on a
            device with kernels (CPU, CUDA, meta) and ``differentiable`` is
            False. ``foreach`` is accepted
            for compatibility and only matters when the op is not fused.
        capturable (bool): as torch: no host sync anywhere in the step.
            With a GradScaler it also means the overflow skip is decided on
            the device: ``scaler.step(opt)`` then always calls ``step()``
            (``_step_supports_amp_scaling`` is True, as for torch's fused
            optimizers). Default False: an overflowed step is one where
            ``step()`` is not called, exactly as with ``torch.optim.ASGD``.

        average_dtype (torch.dtype or None, keyword only): the dtype of the
            average ``ax`` of fp16/bf16 parameters. ``torch.float32``
            (default; param groups hold it as the string ``"float32"``,
            which distributed checkpoints take): a float32 average, which keeps moving where one in
            the parameter's dtype freezes (an update below half an ulp of
            ``ax`` is lost: 36% off the true mean in bf16); 4 B/element
            instead of 2, and a bf16 step moves 14 B/element instead of 10.
            ``None``: the parameter's dtype, torch's layout, for tight
            memory. fp32, fp64 and complex parameters keep ``ax`` in their
            own dtype either way (also under a float64 default dtype, where
            an fp16/bf16 parameter's average is still float32). ``ax``
            averages the parameters as stored (rounded to their dtype), as
            torch's does.
        stochastic_rounding (bool, keyword only): round the new value of
            fp16/bf16 parameters (computed in float32) stochastically instead
            of to nearest: up with probability its distance to the value
            below over the gap, so that updates below half an ulp still move
            the parameter on average (round to nearest drops them: pure-bf16
            training stalls). Default False. The random bits are a
            counter-based hash of ``rounding_seed``, the step, the
            parameter's place in the optimizer (group, index) and the
            element's index in the full tensor: deterministic, the same on
            the CPU and CUDA, in CUDA graphs and compiled steps, and across
            DCP resharding. A no-op for fp32/fp64/complex parameters. Needs
            the fused op (refused with ``fused=False`` or
            ``differentiable=True``).
        rounding_seed (int, keyword only): the seed of those bits (default 0,
            the same on every rank so that DDP replicas round alike). Kept
            in each param group, and so in checkpoints.

    Differences from torch, on purpose:

    * ``lambd`` and ``alpha`` are validated (``>= 0``) up front, and
      ``load_state_dict`` validates the whole checkpoint before it changes
      anything.
    * ``step``/``eta``/``mu`` stay float32 after ``load_state_dict`` even for
      fp16/bf16 parameters (torch casts them to the parameter dtype and its
      schedule drifts).
    * fp16/bf16 parameters are updated in float32 and rounded once.
    * The optimizer owns its state tensors (``torchext/optim/_state.py``):
      ``step``/``eta``/``mu`` are 0-d views of one packed tensor per group,
      device and t0. In-place writes (``opt.state[p]["step"].fill_(x)``) go
      to the packed tensor; assigning ``opt.state[p]["step"] = x`` is a
      structural change: the values are repacked before the next step, and
      a reference to a state tensor taken before it is a stale copy from
      then on (docs/optimizer.md).
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-2,
        lambd: float = 1e-4,
        alpha: float = 0.75,
        t0: float = 1e6,
        weight_decay: float = 0,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
        fused: bool | None = None,
        *,
        average_dtype: torch.dtype | None = torch.float32,
        stochastic_rounding: bool = False,
        rounding_seed: int = 0,
    ) -> None:
        _checkpoint.check_hyperparams(dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0,
                                           weight_decay=weight_decay, fused=fused,
                                           differentiable=differentiable,
                                           stochastic_rounding=stochastic_rounding,
                                           rounding_seed=rounding_seed), where=None)
        average_dtype = _checkpoint.normalize_average_dtype(average_dtype, where=None)
        F.check_flags(fused, differentiable, foreach)
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                        foreach=foreach, maximize=maximize, differentiable=differentiable,
                        capturable=capturable, fused=fused, average_dtype=average_dtype,
                        stochastic_rounding=stochastic_rounding, rounding_seed=rounding_seed)
        self._gen = Generation()
        self._slot_cache = None
        super().__init__(params, defaults)
        own_containers(self, self._gen)
        if fused:
            for group in self.param_groups:
                if not F.fused_supported(group["params"]):
                    raise RuntimeError(
                        "`fused=True` requires all the params to be on CPU or CUDA devices "
                        f"(or meta; devices with torchext kernels: {_devices.KERNEL_DEVICES})")

    # ------------------------------------------------------------ AMP protocol

    @property
    def _step_supports_amp_scaling(self) -> bool:
        """torch's flag for optimizers that unscale and skip by themselves
        (a GradScaler then always calls step()). True only when every group
        asked for ``capturable=True``: otherwise foreign scalers and training
        frameworks see a plain optimizer, as torch.optim.ASGD is."""
        groups = self.__dict__.get("param_groups")
        if not groups:
            return False
        for g in groups:  # (a loop: a generator costs a step ~0.5 us)
            if not g.get("capturable", False):
                return False
        return True

    #: torchext's GradScaler protocol (docs/scaler.md): step() honours the
    #: ``grad_scale``/``found_inf`` attributes a scaler sets (grads unscaled
    #: on the fly, nothing changed when found_inf != 0), whatever
    #: ``capturable`` says.
    _torchext_amp_step = True

    def _holder_slots(self):
        """The slot groups when every one can go through its C++ holder (the
        scaler's check and clip), else None: while torch.compile traces, or
        a group without a holder (DTensor, unfused, devices without kernels)
        or with params on meta. (The step that follows asks _slots() again:
        O(1) per group, and not reusable from here, since step pre-hooks run
        in between and may change the groups.)"""
        if torch.compiler.is_compiling():
            return None
        slots = self._slots()
        for pgs in slots:
            if not pgs.native_ok or pgs.on_meta:
                return None
        return slots

    def _torchext_amp_check(self, allow_fp16: bool = True) -> dict[torch.device, Tensor] | None:
        """The scaler's read-only inf/NaN check of every grad, through the
        C++ holders (no list from Python): found_inf per device (0-d
        float32), or None when a group has no holder (DTensor, unfused,
        devices without kernels), has params on meta, or while torch.compile
        traces: the scaler then gathers the grads itself. fp16 grads are
        refused unless ``allow_fp16`` (unscale_'s rule)."""
        slots = self._holder_slots()
        if slots is None:
            return None
        found: dict[torch.device, Tensor] = {}
        for pgs in slots:
            for sg in pgs.slot_groups:
                check = sg.native_check or sg.holder().check_finite
                device = sg.device
                # (a device's first check makes its found_inf, in C++; None
                # when none of its params has a grad)
                f = check(found.get(device), allow_fp16)
                if f is not None:
                    found[device] = f
        return found

    def _torchext_amp_norms(self, norm_type: float, inv_scale: Tensor | None,
                            allow_fp16: bool = True):
        """A clip's one read of every grad, through the C++ holders (no list
        from Python): (the per-tensor norms, one tensor per slot group, first
        the one holding the first param; found_inf per device from the same
        read, or None without ``inv_scale``), or None where
        ``_torchext_amp_check`` would be None (the caller then gathers the
        grads itself)."""
        slots = self._holder_slots()
        if slots is None:
            return None
        check = inv_scale is not None
        norms: list[Tensor] = []
        found: dict[torch.device, Tensor] = {}
        for pgs in slots:
            for sg in pgs.slot_groups:
                if sg.native_norms is None:
                    sg.holder()  # (made at first use; binds native_norms)
                out = sg.native_norms(
                    norm_type, _devices.on_device(inv_scale, sg.device), found.get(sg.device),
                    check, allow_fp16)
                if out:
                    norms.append(out[0])
                    if check:
                        found[sg.device] = out[1]
        return norms, (found if check else None)

    # -------------------------------------------------------------- clipping

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
        """``torch.nn.utils.clip_grad_norm_(params, ...)`` over every param of
        this optimizer, applied now: one fused read of the gradients gives
        the norms (through the C++ holders, no list from Python), one fused
        pass multiplies the gradients by the clip coefficient. Returns
        torch's total norm (dtype, device: the first grad's), no host sync
        unless ``error_if_nonfinite``. The gradients are left clipped, as
        torch's function leaves them (Note [Clip: applied when called,
        folded only inside one call], ``torchext/_clip.py``); to fold the
        clip into the step instead, use :meth:`clip_and_step`. With an
        enabled GradScaler call ``scaler.clip_grad_norm_(opt, ...)``
        instead: these grads are scaled."""
        norm_type = float(norm_type)
        measured = self._measure_clip(norm_type)
        if measured is None:  # (gradients torchext does not serve: torch's function)
            return _clip.clip_(self._params(), max_norm, norm_type, error_if_nonfinite, foreach)
        if measured.total is None:
            return torch.tensor(0.0)
        with torch.no_grad():
            _clip.check_nonfinite(measured.total, norm_type, error_if_nonfinite)
            _clip.apply_(self, measured.grads[0], None, _clip.clip_coef(measured.total, max_norm))
        return measured.total

    @gate_compiled_step  # (a torch that cannot trace a step: _compile_compat (6))
    def clip_and_step(self, max_norm: float, norm_type: float = 2.0,
                      error_if_nonfinite: bool = False, closure=None) -> _clip.ClipAndStep:
        """:meth:`clip_grad_norm_` then :meth:`step` in one call, the clip
        folded into the fused step (the gradients are read once for the
        norm, and the step multiplies them by the coefficient on the fly:
        they are left unclipped). Returns ``(total_norm, result)``: the norm
        :meth:`clip_grad_norm_` returns and the closure's loss (None
        without one).

        With a ``closure``, it runs first (inside the step, after torch's
        step pre-hooks, as in ``step(closure)``) and the clip measures the
        gradients it made. Without one, step pre-hooks would run between
        the two halves: the clip is then applied to the gradients first, so
        the hooks see torch's values. Post-hooks see the gradients after the
        step: unclipped where the clip was folded. Raises before anything is
        written (``error_if_nonfinite``, bad gradients): nothing changes.
        See Note [Clip: applied when called, folded only inside one call]
        in ``torchext/_clip.py``."""
        if closure is None and _clip.has_step_pre_hooks(self):
            total = self.clip_grad_norm_(max_norm, norm_type, error_if_nonfinite)
            return _clip.ClipAndStep(total, self.step())
        clip = _ClipCall(max_norm, float(norm_type), error_if_nonfinite)
        kwargs = {} if closure is None else {"closure": closure}

        def body(opt, closure=None):
            return opt._step_body(closure, clip)

        if (torch.compiler.is_compiling() or torch._C._autograd._profiler_enabled()
                or _has_hooks(self)):
            loss = _run_hooked(self, body, (self,), kwargs)
        else:
            loss = body(self, closure)
        return _clip.ClipAndStep(clip.total, loss)

    def _measure_clip(self, norm_type: float):
        """The clip's read of this optimizer's gradients (``_clip.measure``),
        or None for gradients torchext's kernels do not serve (DTensors
        without holders, devices without kernels): torch's function then."""
        if self._holder_slots() is None:
            grads = [g for p in self._params() if (g := p.grad) is not None]
            if grads and not _clip.torchext_serves(grads):
                return None
        return _clip.measure([(self, None)], norm_type, True)

    def _params(self) -> list[Tensor]:
        return [p for g in param_groups(self) for p in g["params"]]

    @gate_compiled_step  # (not traced by a torch that mistraces it: _compile_compat (6))
    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's ``Optimizer.zero_grad`` (traceable by torch.compile)."""
        super().zero_grad(set_to_none)

    # ------------------------------------------------------------------ step

    def step(self, closure=None):
        """Performs a single optimization step: all groups, or (when it
        raises) nothing at all, not even the state it would have created.

        Args:
            closure (Callable, optional): re-evaluates the model and returns the loss.
        """
        return self._step_body(closure, None)

    def _step_body(self, closure, clip: "_ClipCall | None"):
        """The step (and, from :meth:`clip_and_step`, its clip: measured
        after the closure, folded into the op as ``clip_coef``)."""
        if getattr(self, _averaging.FLAG, False):  # (a frame less a step when not)
            _averaging.check_not_averaging(self)  # raises, before anything changes
        # What torch's LR schedulers record (see _compile_compat (1)).
        self._opt_called = True
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Set by a GradScaler (torch's _step_supports_amp_scaling contract, or
        # torchext's _torchext_amp_step): unscale on the fly, skip on device;
        # and clip_and_step's coefficient (a second factor).
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        clip_coef = getattr(self, "clip_coef", None)
        if clip is not None:
            coef = clip.measure(self)  # (raises before anything is written)
            if coef is not None:
                clip_coef = coef if clip_coef is None else clip_coef * coef.to(
                    clip_coef.device, non_blocking=True)
        if clip_coef is not None and clip_coef.dtype not in (torch.float32, torch.float64):
            clip_coef = clip_coef.float()
        if torch.compiler.is_compiling():
            with torch.set_grad_enabled(self.defaults["differentiable"]):
                self._run_step(grad_scale, found_inf, clip_coef, eager=False, created=[])
        else:
            # Eager: set_grad_enabled without its context manager (~0.6 us a step).
            grad_was = torch.is_grad_enabled()
            torch._C._set_grad_enabled(self.defaults["differentiable"])
            created: list = []
            try:
                self._run_step(grad_scale, found_inf, clip_coef, True, created)
            except BaseException:
                self._forget_state(created)
                raise
            finally:
                torch._C._set_grad_enabled(grad_was)
        return loss

    step = mark_step_not_wrapped(gate_compiled_step(_hooked_step(step)))

    def _run_step(self, grad_scale, found_inf, clip_coef, eager: bool, created: list) -> None:
        """The one step path, in torch's adam.py shape: gather each slot group
        (a group's params on one device with one t0) into its op call, then
        run them all through ``functional.run_calls`` (validated before the
        first writes). State created for params stepped for the first time is
        recorded in ``created``."""
        slots = self._slots()
        if eager and len(slots) == 1 and slots[0].native_ok and len(slots[0].slot_groups) == 1:
            # The usual eager step: one holder call, which validates all of
            # its input before it writes (run_calls runs such a call alone
            # at once), made here without the call objects (~1 us a step).
            pgs = slots[0]
            sg = pgs.slot_groups[0]
            run = sg.holder().run if sg.native_run is None else sg.native_run
            if grad_scale is not None:
                grad_scale = _devices.on_device(grad_scale, sg.device)
            if found_inf is not None:
                found_inf = _devices.on_device(found_inf, sg.device)
            if clip_coef is not None:
                clip_coef = _devices.on_device(clip_coef, sg.device)
            lr_t, hyper = sg.holder_args(pgs.group)
            missing = run(False, lr_t, hyper, grad_scale, found_inf, clip_coef)
            if missing:  # (as HolderCall.run: nothing was done)
                self._create_state(sg, missing, pgs.group, created)
                run(False, lr_t, hyper, grad_scale, found_inf, clip_coef)
            return
        calls = []
        for pgs in slots:
            for sg in pgs.slot_groups:
                call = self._call(pgs, sg, eager, grad_scale, found_inf, clip_coef, created)
                if call is not None:
                    calls.append(call)
        F.run_calls(calls)

    def _call(self, pgs, sg, eager: bool, grad_scale, found_inf, clip_coef, created):
        """A slot group's op call: through its C++ holder (eager, fused,
        plain tensors: no list from Python), else from its gathered lists
        (None when no param has a grad)."""
        group = pgs.group
        lr = group["lr"]
        if eager and pgs.native_ok:
            lr_t, hyper = sg.holder_args(group)
            sg.holder()
            return F.HolderCall(sg.native_run, lr_t, hyper,
                                _devices.on_device(grad_scale, sg.device),
                                _devices.on_device(found_inf, sg.device),
                                _devices.on_device(clip_coef, sg.device),
                                make_state=lambda idx: self._create_state(sg, idx, group, created))
        lists, idx = self._gather(sg, group, created, pgs.fused)
        if lists is None:
            return None
        hyper = _op.hyper_of(group, t0=group["t0"] if sg.t0 is None else sg.t0)
        rounding = sg.rounding(group, idx) if group.get("stochastic_rounding") else None
        return F.list_call(lists, pgs.fused, lr, hyper, group["capturable"], grad_scale, found_inf,
                           clip_coef, rounding)

    def _with_grads(self, sg, group, created) -> list[int]:
        """Positions of sg's params that have a grad, their state created
        where missing: the gather of every path from Python lists."""
        idx = [i for i, p in enumerate(sg.params) if p.grad is not None]
        new = [i for i in idx if sg.axs[i] is None]
        if new:
            self._create_state(sg, new, group, created)
        return idx

    def _gather(self, sg, group, created, fused: bool) -> tuple[list | None, list[int]]:
        """The op's lists for a slot group without a C++ holder (None when
        no param has a grad), and the positions in the slot group they hold. Fused, plain tensors, every param with a grad:
        the whole slot group with the packed state, so a compiled step
        mutates the packed tensors themselves, not views of them. Else
        (params without grads, DTensors, the unfused reference): the params
        with a grad, their step/eta/mu as the 0-d views (local shards for
        DTensors, when fused)."""
        idx = self._with_grads(sg, group, created)
        if not idx:
            return None, idx
        params = sg.params
        if fused and sg.plain and len(idx) == len(params):
            return [params, [p.grad for p in params], sg.axs, sg.mus, sg.etas, sg.steps], idx
        lists = sg.lists(idx)
        return ([list(x) for x in _dtensor.to_local_lists(*lists)] if fused else lists), idx

    def _create_state(self, sg, idx: list[int], group, created: list) -> None:
        """torch.optim.ASGD's initial state (step 0, eta = lr, mu 1, ax zeros:
        float32 for fp16/bf16 params unless the group's ``average_dtype`` is
        None) for sg.params[i], i in idx; recorded in ``created``."""
        lr = group["lr"]
        with torch.no_grad():
            where = torch.tensor(idx, device=sg.device)
            sg.steps.index_fill_(0, where, 0.0)
            sg.mus.index_fill_(0, where, 1.0)
            if isinstance(lr, Tensor):
                sg.etas.index_copy_(0, where, lr.detach().reshape(1).to(
                    device=sg.device, dtype=sg.etas.dtype).expand(len(idx)))
            else:
                sg.etas.index_fill_(0, where, float(lr))
        views = sg.views
        for i in idx:
            p = sg.params[i]
            ax = torch.zeros_like(p, memory_format=torch.preserve_format,
                                  dtype=_checkpoint.average_dtype_of(p, group))
            st = ParamState(self._gen)
            for key in SCALAR_KEYS:
                dict.__setitem__(st, key, views[key][i])
            dict.__setitem__(st, "ax", ax)
            dict.__setitem__(self.state, p, st)  # owned: not a structural change
            sg.axs[i] = ax
            if sg.native is not None:
                sg.native.set_ax(i, ax)
            created.append((sg, i, p))

    def _forget_state(self, created: list) -> None:
        # A step that raised keeps nothing it created.
        for sg, i, p in reversed(created):
            dict.pop(self.state, p, None)
            sg.axs[i] = None
            if sg.native is not None:
                sg.native.set_ax(i, None)

    def _slots(self) -> list[ParamGroupSlots]:
        """Every group's slot groups, rebuilt where the group or the state
        changed structurally since they were built (O(1) per group)."""
        groups = param_groups(self)
        cache = self._slot_cache
        if (cache is None or cache[0] != self._gen.n or cache[1] is not self.state
                or len(cache[2]) != len(groups)):
            built = [ParamGroupSlots(g, self.state, k) for k, g in enumerate(groups)]
            self._slot_cache = (self._gen.n, self.state, built)
            return built
        slots = cache[2]
        for k, pgs in enumerate(slots):
            if not pgs.fresh(groups[k]):
                slots[k] = ParamGroupSlots(groups[k], self.state, k)
        return slots

    # torch.optim.ASGD's name for gathering a group, for code that calls it
    # (see _compile_compat (4) for why step() does not use this name).
    def _init_group(self, group, params, grads, mus, axs, etas, state_steps) -> bool:
        for pgs in self._slots():
            if pgs.group is not group:
                continue
            for sg in pgs.slot_groups:
                lists = sg.lists(self._with_grads(sg, group, []))
                for out, xs in zip((params, grads, axs, mus, etas, state_steps), lists):
                    out.extend(xs)
        return any(torch.is_complex(p) for p in params)  # torch's has_complex

    # ------------------------------------------------------- groups and state

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As torch's, after checking the group's hyperparameters (its own or
        the defaults) by the constructor's rules: nothing is added when one
        is refused."""
        if isinstance(param_group, dict) and "_gen" in self.__dict__:
            _checkpoint.check_hyperparams({**self.defaults, **param_group},
                                          where=f"param_groups[{len(self.param_groups)}]")
            if "average_dtype" in param_group:
                param_group = {**param_group, "average_dtype": _checkpoint.normalize_average_dtype(
                    param_group["average_dtype"], None)}
        super().add_param_group(param_group)
        if "_gen" in self.__dict__:  # (torch's __init__ adds the first groups)
            own_containers(self, self._gen)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("foreach", None)
            group.setdefault("maximize", False)
            group.setdefault("differentiable", False)
            group.setdefault("capturable", False)
            group.setdefault("fused", None)
            group.setdefault("average_dtype", _checkpoint.FLOAT32_AVERAGE)
            # (torch's load_state_dict ends here too: a checkpoint without
            # these keys, torch's or an older torchext's, keeps the
            # constructor's settings)
            group.setdefault("stochastic_rounding",
                             self.defaults.get("stochastic_rounding", False))
            group.setdefault("rounding_seed", self.defaults.get("rounding_seed", 0))
        self._gen = Generation()
        self._slot_cache = None
        own_containers(self, self._gen)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if getattr(self, _averaging.FLAG, False):
            # Pickled inside averaged_parameters() (AWD-LSTM saves the
            # optimizer there): the params hold the averages and the state's
            # ax the training weights; save the true averages as ax.
            state["state"] = _averaging.true_average_state(self)
        return state

    @torch._disable_dynamo
    def state_dict(self) -> dict[str, Any]:
        """As torch's, with every param's state a plain dict (loads with
        ``torch.load(weights_only=True)``)."""
        sd = super().state_dict()
        sd["state"] = {k: dict(v) if isinstance(v, dict) else v for k, v in sd["state"].items()}
        return sd

    @torch._disable_dynamo
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state_dict from this class or from ``torch.optim.ASGD``.

        Validates all of it first (structure, every group's hyperparameters
        with the constructor's rules, every state entry against its
        parameter); when it is refused, nothing changes. Keeps step/eta/mu in
        float32 on the parameter's device whatever the parameter dtype. The
        checks see the state_dict as the user's load_state_dict pre-hooks
        left it.
        """
        seen: dict[str, Any] = {}

        def validate(opt, sd):
            _checkpoint.validate_state_dict(self, sd)
            seen["sd"] = sd

        def restore(opt):
            _checkpoint.restore_scalar_state(self, seen["sd"])
            self._gen.n += 1

        # Registered now so that validate runs after the user's pre-hooks and
        # restore before the user's post-hooks.
        h_pre = self.register_load_state_dict_pre_hook(validate)
        h_post = self.register_load_state_dict_post_hook(restore, prepend=True)
        try:
            super().load_state_dict(state_dict)
        finally:
            h_pre.remove()
            h_post.remove()

    # --------------------------------------------------------- averaged weights

    def averaged_parameters(self):
        """Context manager: inside, every stepped parameter holds its average
        ``ax``, swapped in place; on exit both are restored bit for bit.
        See :func:`torchext.optim.averaging.averaged_parameters`."""
        return _averaging.averaged_parameters(self)

    def start_averaging(self) -> None:
        """Restarts the average with the next step (NT-ASGD). The exact rule:
        :func:`torchext.optim.averaging.start_averaging`."""
        _averaging.start_averaging(self)

