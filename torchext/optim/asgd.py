"""``torchext.optim.ASGD``: a drop-in ``torch.optim.ASGD`` on one fused op."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import Optimizer, ParamsT

from . import averaging as _averaging
from . import functional as F

__all__ = ["ASGD"]

_SCALAR_KEYS = ("step", "eta", "mu")


def _scalar_dtype() -> torch.dtype:
    # Same rule as torch.optim: float64 state when the default dtype is float64.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class ASGD(Optimizer):
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
        self._groups: list[dict[str, Any]] = []
        super().__init__(params, defaults)
        if fused:
            for group in self.param_groups:
                if not F.fused_supported(group["params"]):
                    raise RuntimeError(
                        "`fused=True` requires all the params to be on CPU or CUDA devices")

    # torch.optim.ASGD's name for _gather_group, for code that calls it.
    def _init_group(self, group, params, grads, mus, axs, etas, state_steps) -> bool:
        return self._gather_group(group, params, grads, mus, axs, etas, state_steps)

    def _refresh_views(self) -> None:
        # step/zero_grad (and torchext's GradScaler) walk `_groups`, the very
        # same list object as `param_groups`, under another name. Dynamo
        # intercepts the attribute `param_groups` of optimizers: it flips
        # `capturable` to True in the user's groups on CUDA, and in a
        # fullgraph step with an in-graph backward, clearing grads through
        # it silently hands the next step no gradients (nothing updates).
        self._groups = self.param_groups

    def _current_groups(self) -> list[dict[str, Any]]:
        if not torch.compiler.is_compiling() and self._groups is not self.param_groups:
            self._refresh_views()  # the user replaced the list itself
        return self._groups

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        self._refresh_views()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Resets the gradients of all optimized tensors, as torch's
        ``Optimizer.zero_grad``, but traceable by ``torch.compile`` (torch's
        is marked ``_disable_dynamo``)."""
        for group in self._current_groups():
            for p in group["params"]:
                self._zero_one_grad(p, set_to_none)

    @staticmethod
    def _zero_one_grad(p: Tensor, set_to_none: bool) -> None:
        if p.grad is not None:
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("foreach", None)
            group.setdefault("maximize", False)
            group.setdefault("differentiable", False)
            group.setdefault("capturable", False)
            group.setdefault("fused", None)
        self._refresh_views()
        for group in self.param_groups:
            for p in group["params"]:
                p_state = self.state.get(p, {})
                for key in _SCALAR_KEYS:
                    if key in p_state and not torch.is_tensor(p_state[key]):
                        # Old checkpoints stored step/eta/mu as Python floats.
                        p_state[key] = torch.tensor(float(p_state[key]), dtype=_scalar_dtype(),
                                                    device=p.device)

    def _gather_group(self, group, params, grads, mus, axs, etas, state_steps) -> bool:
        """Collects the params with grads and their state (created lazily).

        Deliberately not named ``_init_group``: Dynamo intercepts that name on
        optimizers and forces a graph break when the same compiled function
        ran ``backward()`` (a "pending mutation" on the params' grads), so
        torch's own optimizers cannot share a graph with the backward pass.
        Traced normally, this loop compiles into the same graph."""
        # Hot loop (1000 params cost ~0.5 ms of Python): no per-param checks
        # that the op repeats anyway (sparse grads, devices, dtypes are
        # validated in C++ before anything is written).
        all_state = self.state
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            state = all_state[p]
            if len(state) == 0:
                self._init_state(p, state, group["lr"])
            params.append(p)
            grads.append(grad)
            mus.append(state["mu"])
            axs.append(state["ax"])
            etas.append(state["eta"])
            state_steps.append(state["step"])
        has_complex = False  # not needed: the fused op and the reference path handle complex
        return has_complex

    @staticmethod
    def _init_state(p: Tensor, state: dict[str, Any], lr: float | Tensor) -> None:
        # As torch.optim.ASGD: created at the parameter's first step.
        state["step"] = torch.zeros((), device=p.device, dtype=_scalar_dtype())
        state["eta"] = torch.as_tensor(
            lr.detach() if isinstance(lr, Tensor) else lr,
            device=p.device, dtype=_scalar_dtype()).clone().reshape(())
        state["mu"] = torch.ones((), device=p.device, dtype=_scalar_dtype())
        state["ax"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def step(self, closure=None):
        """Performs a single optimization step.

        Args:
            closure (Callable, optional): re-evaluates the model and returns the loss.
        """
        _averaging.check_not_averaging(self)  # before anything changes
        # What torch's LR schedulers record to warn about a scheduler stepped
        # before its optimizer (see `_wrapped_by_lr_sched` below).
        self._opt_called = True
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Set by GradScaler.step() under the _step_supports_amp_scaling contract.
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            for group in self._current_groups():
                params: list[Tensor] = []
                grads: list[Tensor] = []
                mus: list[Tensor] = []
                axs: list[Tensor] = []
                etas: list[Tensor] = []
                state_steps: list[Tensor] = []
                has_complex = self._gather_group(group, params, grads, mus, axs, etas,
                                                 state_steps)
                F.asgd(params, grads, axs, mus, etas, state_steps,
                       foreach=group["foreach"], maximize=group["maximize"],
                       differentiable=group["differentiable"], capturable=group["capturable"],
                       has_complex=has_complex, lambd=group["lambd"], lr=group["lr"],
                       t0=_averaging.group_t0(group, params), alpha=group["alpha"],
                       weight_decay=group["weight_decay"], fused=group["fused"],
                       grad_scale=grad_scale, found_inf=found_inf)
        return loss

    # torch's LR schedulers wrap `optimizer.step` with a function of
    # torch/optim/lr_scheduler.py that sets `_opt_called`; Dynamo refuses to
    # trace that file, so a compiled step would break (and the wrapper's
    # weakref hides the grad_scale/found_inf GradScaler sets in the same
    # graph). step() records `_opt_called` itself, and this marker tells the
    # schedulers there is nothing to wrap.
    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]

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
