"""``torchext.optim.ASGD``: a drop-in ``torch.optim.ASGD`` on one fused op."""
from __future__ import annotations

import functools
import operator
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import Optimizer, ParamsT

from .._compile_compat import GroupsAlias, mark_step_not_wrapped
from . import averaging as _averaging
from . import functional as F

__all__ = ["ASGD"]

_SCALAR_KEYS = ("step", "eta", "mu")


_is_none = functools.partial(operator.is_, None)
_get_ax, _get_mu, _get_eta, _get_step = (operator.itemgetter(k) for k in ("ax", "mu", "eta", "step"))


def _run_native(plan, hyper, validate_only: bool) -> bool:
    """One asgd_ call through a group's C++ plan (False: a param has no grad;
    nothing was done)."""
    lr = hyper["lr"]
    tensor_lr = isinstance(lr, Tensor)
    return plan.native.run(validate_only, lr if tensor_lr else None, 0.0 if tensor_lr else float(lr),
                      float(hyper["lambd"]), float(hyper["alpha"]), float(hyper["t0"]),
                      float(hyper["weight_decay"]), bool(hyper["maximize"]),
                      hyper["grad_scale"], hyper["found_inf"])


def _scalar_dtype() -> torch.dtype:
    # Same rule as torch.optim: float64 state when the default dtype is float64.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class ASGD(GroupsAlias, Optimizer):
    r"""Averaged Stochastic Gradient Descent, as ``torch.optim.ASGD``, fused.

    Same arguments, same update and the same ``state_dict`` layout as
    :class:`torch.optim.ASGD` (checkpoints load both ways), plus:

    Args:
        fused (bool, optional): use the fused ``torch.ops.torchext.asgd_`` op.
            ``None`` (default) means fused whenever every parameter is on
            CPU/CUDA and ``differentiable`` is False. ``foreach`` is accepted
            for compatibility and only matters when the op is not fused.

    Differences from torch, on purpose:

    * ``lambd`` and ``alpha`` are validated (``>= 0``) up front.
    * ``step``/``eta``/``mu`` stay float32 after ``load_state_dict`` even for
      fp16/bf16 parameters (torch casts them to the parameter dtype and its
      schedule drifts).
    * fp16/bf16 parameters are updated in float32 and rounded once.
    * It supports ``GradScaler``'s sync-free contract
      (``_step_supports_amp_scaling``): ``scaler.step(opt)`` unscales on the
      fly and skips overflowed steps on the device.
    """

    # GradScaler (torch's and ours) sets `grad_scale`/`found_inf` on the
    # optimizer and calls step(); the fused op unscales and skips on device.
    _step_supports_amp_scaling = True

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
    ) -> None:
        if isinstance(lr, Tensor):
            if lr.numel() != 1:
                raise ValueError("Tensor lr must be 1-element")
            if not lr.is_floating_point():
                raise ValueError(f"Tensor lr must be floating point, got {lr.dtype}")
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= lambd:
            raise ValueError(f"Invalid lambd value: {lambd}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if fused and differentiable:
            raise RuntimeError("`fused` does not support `differentiable`")
        if fused and foreach:
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                        foreach=foreach, maximize=maximize, differentiable=differentiable,
                        capturable=capturable, fused=fused)
        self._plans: dict[int, _GroupPlan] = {}
        super().__init__(params, defaults)
        if fused:
            for group in self.param_groups:
                if not F.fused_supported(group["params"]):
                    raise RuntimeError(
                        "`fused=True` requires all the params to be on CPU or CUDA devices")

    # torch.optim.ASGD's name for _gather_group, for code that calls it (see
    # _compile_compat (4) for why step() does not use this name).
    def _init_group(self, group, params, grads, mus, axs, etas, state_steps) -> bool:
        self._gather_group(group, params, grads, mus, axs, etas, state_steps)
        return any(torch.is_complex(p) for p in params)  # torch's has_complex

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("foreach", None)
            group.setdefault("maximize", False)
            group.setdefault("differentiable", False)
            group.setdefault("capturable", False)
            group.setdefault("fused", None)
        self._plans = {}
        for group in self.param_groups:
            for p in group["params"]:
                p_state = self.state.get(p, {})
                for key in _SCALAR_KEYS:
                    if key in p_state and not torch.is_tensor(p_state[key]):
                        # Old checkpoints stored step/eta/mu as Python floats.
                        p_state[key] = torch.tensor(float(p_state[key]), dtype=_scalar_dtype(),
                                                    device=p.device)

    def _gather_group(self, group, params, grads, mus, axs, etas, state_steps,
                      new_state: dict[Tensor, dict[str, Any]] | None = None) -> None:
        """Collects the params with grads and their state.

        State is created lazily, as torch does, into ``new_state`` when given
        (step() commits it only once the step succeeded), else into
        ``self.state``. No per-param checks here: the op validates sparse
        grads, devices, dtypes and shapes before anything is written."""
        all_state = self.state
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            state = all_state.get(p)
            if not state:
                state = {}
                self._init_state(p, state, group["lr"])
                if new_state is None:
                    all_state[p] = state
                else:
                    new_state[p] = state
            params.append(p)
            grads.append(grad)
            mus.append(state["mu"])
            axs.append(state["ax"])
            etas.append(state["eta"])
            state_steps.append(state["step"])

    @staticmethod
    def _init_state(p: Tensor, state: dict[str, Any], lr: float | Tensor) -> None:
        # As torch.optim.ASGD: created at the parameter's first step.
        state["step"] = torch.zeros((), device=p.device, dtype=_scalar_dtype())
        state["eta"] = torch.as_tensor(
            lr.detach() if isinstance(lr, Tensor) else lr,
            device=p.device, dtype=_scalar_dtype()).clone().reshape(())
        state["mu"] = torch.ones((), device=p.device, dtype=_scalar_dtype())
        state["ax"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def _group_lists(self, group, new_state, to_plan=None
                     ) -> tuple[F.Route, list[list[Tensor]], Any] | None:
        """(route, [params, grads, axs, mus, etas, steps], t0) of one group's
        step, or None when no param of the group has a grad. (The lists hold
        local shards for DTensor params; t0 is matched on the params.)

        When every param has a grad and its state, (group, route, lists) is
        appended to ``to_plan``: step() makes the group's plan once the
        step succeeded."""
        params = group["params"]
        compiling = torch.compiler.is_compiling()
        if not compiling:
            grads = [p.grad for p in params]
            plan = self._plans.get(id(group))
            if plan is not None and plan.matches(group, params, grads, self.state):
                return (plan.route, F.prepare(plan.route, [plan.params, grads, *plan.state_lists()]),
                        _averaging.group_t0(group, plan.params))
        lists: list[list[Tensor]] = [[], [], [], [], [], []]
        p_, g_, ax_, mu_, eta_, st_ = lists
        created = len(new_state)
        self._gather_group(group, p_, g_, mu_, ax_, eta_, st_, new_state)
        if not p_:
            return None
        r = F.route(p_, group["fused"], group["differentiable"])
        if (to_plan is not None and not compiling and len(p_) == len(params)
                and len(new_state) == created):
            to_plan.append((group, r, lists))
        return r, F.prepare(r, lists), _averaging.group_t0(group, p_)

    def step(self, closure=None):
        """Performs a single optimization step: all groups, or (when it
        raises) nothing at all, not even lazily created state.

        Args:
            closure (Callable, optional): re-evaluates the model and returns the loss.
        """
        _averaging.check_not_averaging(self)  # before anything changes
        # What torch's LR schedulers record (see _compile_compat (1)).
        self._opt_called = True
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Set by GradScaler.step() under the _step_supports_amp_scaling contract.
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            new_state: dict[Tensor, dict[str, Any]] = {}
            to_plan: list = []  # groups whose plan is made once the step succeeded
            compiling = torch.compiler.is_compiling()
            calls = []  # (route, lists, hyper), or (None, _GroupPlan with a C++ side, hyper)
            for group in self._current_groups():
                hyper = dict(lr=group["lr"], lambd=group["lambd"], alpha=group["alpha"],
                             t0=group["t0"], weight_decay=group["weight_decay"],
                             maximize=group["maximize"], capturable=group["capturable"],
                             grad_scale=grad_scale, found_inf=found_inf)
                plan = None if compiling else self._native_plan(group)
                if plan is not None:
                    calls.append((None, plan, hyper))
                    continue
                gathered = self._group_lists(group, new_state, to_plan)
                if gathered is not None:
                    calls.append((gathered[0], gathered[1], dict(hyper, t0=gathered[2])))
            # Validate every group before the first write: a single op call
            # validates itself before writing, anything more is checked first.
            if len(calls) > 1 or (calls and calls[0][0] is not None and (
                    calls[0][0].needs_check or isinstance(calls[0][2]["t0"], list))):
                checked = []
                for r, lists, hyper in calls:
                    if r is None and not _run_native(lists, hyper, validate_only=True):
                        # A param lost its grad: this group takes the general path.
                        gathered = self._group_lists(lists.group, new_state)
                        if gathered is None:
                            continue
                        r, lists, hyper = gathered[0], gathered[1], dict(hyper, t0=gathered[2])
                    if r is not None:
                        F.check(r, lists, **hyper)
                    checked.append((r, lists, hyper))
                calls = checked
            for r, lists, hyper in calls:
                if r is None:
                    if _run_native(lists, hyper, validate_only=False):
                        continue
                    # Only a lone call gets here (checked calls had grads):
                    # nothing was written, take the general path.
                    gathered = self._group_lists(lists.group, new_state)
                    if gathered is None:
                        continue
                    r, lists, t0 = gathered
                    hyper = dict(hyper, t0=t0)
                F.run(r, lists, **hyper)
            for p, state in new_state.items():
                self.state[p] = state
            for group, r, lists in to_plan:
                self._plans[id(group)] = _GroupPlan(group, group["params"], self.state, r, lists)
        return loss

    mark_step_not_wrapped(step)

    def _native_plan(self, group) -> _GroupPlan | None:
        """The group's plan when its C++ side (torch.classes.torchext.ASGDPlan)
        still holds for this step, else None."""
        plan = self._plans.get(id(group))
        if plan is None or plan.native is None:
            return None
        return plan if plan.native_matches(group, group["params"], self.state) else None

    def _check_finite_grads(self) -> dict[torch.device, Tensor] | None:
        """For torchext's GradScaler: its read-only inf/NaN check of every
        grad (found_inf per device, 0-d float32), through the groups' C++
        plans, so no list crosses from Python. None, having written nothing
        the caller sees, when a group has no plan that holds (or while
        torch.compile traces): the scaler then gathers the grads itself."""
        if torch.compiler.is_compiling():
            return None
        plans = []
        for group in self._current_groups():
            plan = self._native_plan(group)
            if plan is None:
                return None
            plans.append(plan)
        found: dict[torch.device, Tensor] = {}
        for plan in plans:
            device = plan.params[0].device
            f = found.get(device)
            if f is None:
                f = found[device] = torch.zeros((), dtype=torch.float32, device=device)
            if not plan.native.check_finite(f):
                return None
        return found

    def averaged_parameters(self):
        """Context manager: inside, every stepped parameter holds its average
        ``ax``, swapped in place; on exit both are restored bit for bit.
        See :func:`torchext.optim.averaging.averaged_parameters`."""
        return _averaging.averaged_parameters(self)

    def start_averaging(self) -> None:
        """Restarts the average with the next step (NT-ASGD). The exact rule:
        :func:`torchext.optim.averaging.start_averaging`."""
        _averaging.start_averaging(self)

    @torch._disable_dynamo
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state_dict from this class or from ``torch.optim.ASGD``.

        Validates it first (nothing changes when it is wrong), and keeps
        step/eta/mu in float32 on the parameter's device whatever the
        parameter dtype. The checks see the state_dict as the user's
        load_state_dict pre-hooks left it.
        """
        seen: dict[str, Any] = {}

        def validate(opt, sd):
            self._validate_state_dict(sd)
            seen["sd"] = sd

        def restore(opt):
            self._restore_scalar_state(seen["sd"])

        # Registered now so that validate runs after the user's pre-hooks and
        # restore before the user's post-hooks.
        h_pre = self.register_load_state_dict_pre_hook(validate)
        h_post = self.register_load_state_dict_post_hook(restore, prepend=True)
        try:
            super().load_state_dict(state_dict)
        finally:
            h_pre.remove()
            h_post.remove()

    def _saved_id_to_param(self, state_dict) -> dict[Any, Tensor]:
        saved_groups = state_dict.get("param_groups")
        if not isinstance(saved_groups, list) or not isinstance(state_dict.get("state"), dict):
            raise ValueError("loaded state dict must have a 'state' dict and a 'param_groups' list")
        if len(self.param_groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        id_to_param = {}
        for g, sg in zip(self.param_groups, saved_groups):
            if len(g["params"]) != len(sg["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
            id_to_param.update(zip(sg["params"], g["params"]))
        return id_to_param

    def _validate_state_dict(self, state_dict) -> None:
        id_to_param = self._saved_id_to_param(state_dict)
        for pid, st in state_dict["state"].items():
            p = id_to_param.get(pid)
            if p is None:
                continue
            ax = st.get("ax")
            if isinstance(ax, Tensor) and ax.shape != p.shape:
                raise ValueError(f"loaded state dict: 'ax' of parameter {pid} has shape "
                                 f"{tuple(ax.shape)} but the parameter has shape {tuple(p.shape)}")
            for key in _SCALAR_KEYS:
                v = st.get(key)
                if isinstance(v, Tensor) and v.numel() != 1:
                    raise ValueError(f"loaded state dict: '{key}' of parameter {pid} must hold "
                                     f"one element, got shape {tuple(v.shape)}")

    def _restore_scalar_state(self, state_dict) -> None:
        # torch.optim casts eta/mu to the parameter dtype (bf16 loses the
        # schedule); take them again from the saved values, in float32/64.
        id_to_param = self._saved_id_to_param(state_dict)
        for pid, st in state_dict["state"].items():
            p = id_to_param.get(pid)
            if p is None:
                continue
            for key in _SCALAR_KEYS:
                if key not in st:
                    continue
                v = st[key]
                dtype = v.dtype if isinstance(v, Tensor) and v.dtype in (
                    torch.float32, torch.float64) else _scalar_dtype()
                self.state[p][key] = torch.as_tensor(
                    v.detach() if isinstance(v, Tensor) else float(v)
                ).to(device=p.device, dtype=dtype, copy=True).reshape(())


class _GroupPlan:
    """A group's gathered lists, reused by eager steps while they still hold.

    Made after a step in which every param of the group had a grad and
    state. Reused while the group holds the very same param objects (checked
    one by one, so a param swapped in place of another is noticed), every
    param has a grad, and ``state`` is the same mapping (load_state_dict
    replaces it). Grads and the state tensors are read again at every step,
    and the op validates dtypes, devices and shapes of everything at every
    step, so swapped grads, ``p.data`` moved to another dtype or device, or
    replaced ``ax`` tensors are never missed. Not used while torch.compile
    traces.

    Fused steps of plain tensors on one device with one t0 get a C++ side
    (``native``, csrc/asgd_plan.cpp): the step then passes no list from
    Python at all, and the group's step/eta/mu are packed into one 1-D
    tensor each, the state entries becoming 0-d views of their elements
    (same values, dtype and device; torch.optim.ASGD reads such state as
    its own). Replacing a state entry, or the state, is noticed by
    ``native_matches``; re-pointing a packed view in place (``.set_()``,
    ``.data =``) is not, and is not supported."""

    __slots__ = ("group", "params_list", "params", "state_map", "states", "route", "flags",
                 "native", "state_tensors")

    def __init__(self, group, params_list, state_map, route, lists):
        self.group = group
        self.params_list = params_list
        self.params = list(params_list)
        self.state_map = state_map
        self.states = [state_map[p] for p in self.params]
        self.route = route
        self.flags = (group["fused"], group["differentiable"])  # what route() read
        self.native = None
        self.state_tensors = None
        if (route.fused and route.by_device is None and route.plain
                and "t0_per_param" not in group):
            packed = self._pack_schedule_state()
            if packed is not None:
                axs = list(map(_get_ax, self.states))
                self.native = torch.classes.torchext.ASGDPlan(self.params, axs, *packed)

    def _pack_schedule_state(self) -> list[Tensor] | None:
        """[mus, etas, steps], each one 1-D tensor, with every param's state
        entries replaced by views of their elements (None, and nothing
        changed, when the entries are not all one-element tensors of one
        float dtype on the params' device: the op then names the problem)."""
        packed = []
        device = self.params[0].device
        for key in ("mu", "eta", "step"):
            values = [st.get(key) for st in self.states]
            if not all(type(v) is Tensor and v.numel() == 1 for v in values):
                return None
            dtypes = {v.dtype for v in values}
            if len(dtypes) != 1 or dtypes.pop() not in (torch.float32, torch.float64) or any(
                    v.device != device for v in values):
                return None
            packed.append(torch.stack([v.detach().reshape(()) for v in values]))
        for key, buf in zip(("mu", "eta", "step"), packed):
            for st, view in zip(self.states, buf.unbind(0)):
                st[key] = view
        # What native_matches() checks: the state still holds these.
        st = self.states
        self.state_tensors = [list(map(get, st)) for get in (_get_ax, _get_mu, _get_eta, _get_step)]
        return packed

    def native_matches(self, group, params_list, state_map) -> bool:
        axs, mus, etas, steps = self.state_tensors
        st = self.states
        return (self.matches_params(group, params_list, state_map)
                and "t0_per_param" not in group
                and all(map(operator.is_, map(_get_ax, st), axs))
                and all(map(operator.is_, map(_get_step, st), steps))
                and all(map(operator.is_, map(_get_eta, st), etas))
                and all(map(operator.is_, map(_get_mu, st), mus)))

    def matches_params(self, group, params_list, state_map) -> bool:
        return (group is self.group and params_list is self.params_list
                and state_map is self.state_map and len(params_list) == len(self.params)
                and (group["fused"], group["differentiable"]) == self.flags
                and all(map(operator.is_, params_list, self.params)))

    def matches(self, group, params_list, grads, state_map) -> bool:
        return (self.matches_params(group, params_list, state_map)
                and not any(map(_is_none, grads)))

    def state_lists(self) -> list[list[Tensor]]:
        """[axs, mus, etas, steps], read from the state dicts again."""
        st = self.states
        return [list(map(_get_ax, st)), list(map(_get_mu, st)), list(map(_get_eta, st)),
                list(map(_get_step, st))]
