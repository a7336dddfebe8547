"""Using ASGD's averaged weights: evaluate with them, export them, and start
averaging when validation stalls (NT-ASGD, Merity et al. 2017).

* :func:`averaged_parameters` puts every parameter's average ``ax`` in the
  parameter in place: the same tensors and ``data_ptr()`` (compiled
  functions do not recompile, captured CUDA graphs stay valid), and leaving
  restores both bit for bit. Where ``ax`` has the parameter's dtype the two
  are swapped (``torch.ops.torchext.swap_``: no copy of the model); where it
  is wider (the float32 average of fp16/bf16 parameters) the parameter is
  kept in a scratch copy of its own dtype for the block (2 B/element for
  bf16), allocated on entry, and receives ``ax`` rounded once to its dtype;
  ``ax`` is not touched.
* :func:`start_averaging` restarts the average with the next step.
* :class:`NonMonotonicTrigger` calls it when the validation metric stops
  improving (AWD-LSTM's rule).
* :func:`averaged_state_dict` is a model ``state_dict`` of the averages.

The ASGD methods ``averaged_parameters()`` and ``start_averaging()`` call the
functions here; they also accept a ``torch.optim.ASGD``.
"""
from __future__ import annotations

import contextlib
from collections import Counter, OrderedDict
from typing import Any, Iterator

import torch
from torch import Tensor

from .._devices import indices_by_device, pick
from .. import _dtensor

__all__ = ["averaged_parameters", "start_averaging", "NonMonotonicTrigger",
           "averaged_state_dict"]

FLAG = "_averaged_in"  # set on the optimizer while its parameters hold averages


def check_not_averaging(optimizer: Any) -> None:
    """Raises if ``optimizer``'s parameters currently hold their averages."""
    if getattr(optimizer, FLAG, False):
        raise RuntimeError(
            "ASGD.step() inside averaged_parameters(): the parameters hold their averages "
            "right now; leave the `with` block before stepping (nothing was changed)")


def _local_pairs(optimizer: Any):
    """(params, axs) per device whose ax has the parameter's dtype (swapped),
    and (param, ax) pairs whose ax is wider (copied); local shards for
    DTensor parameters."""
    cls = _dtensor._dtensor_cls()
    ps: list[Tensor] = []
    axs: list[Tensor] = []
    wider: list[tuple[Tensor, Tensor]] = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            ax = optimizer.state.get(p, {}).get("ax")
            if ax is None:
                continue  # never stepped: keeps its own value
            if cls is not None and (isinstance(p, cls) or isinstance(ax, cls)):
                if not (isinstance(p, cls) and isinstance(ax, cls)) or (
                        _dtensor._layout(p) != _dtensor._layout(ax)):
                    raise ValueError("averaged_parameters: a DTensor parameter and its 'ax' "
                                     "must be laid out alike (same mesh and placements)")
            p, ax = _dtensor.to_local(p), _dtensor.to_local(ax)
            if ax.dtype != p.dtype and is_wider_average(p, ax):
                wider.append((p, ax))
            else:
                ps.append(p)
                axs.append(ax)
    return ({device: (pick(ps, idx), pick(axs, idx))
             for device, idx in indices_by_device(ps).items()}, wider)


def is_wider_average(p: Tensor, ax: Tensor) -> bool:
    """Whether ``ax`` is a float32 average of an fp16/bf16 parameter."""
    return ax.dtype == torch.float32 and p.dtype in (torch.float16, torch.bfloat16)


def _swap(pairs: dict[torch.device, tuple[list[Tensor], list[Tensor]]]) -> None:
    """One swap_ per device (each validates before it swaps); all or nothing."""
    done = []
    with torch.no_grad():
        try:
            for ps, axs in pairs.values():
                torch.ops.torchext.swap_(ps, axs)
                done.append((ps, axs))
        except Exception:
            for ps, axs in done:
                torch.ops.torchext.swap_(ps, axs)
            raise


class _Entered:
    """What averaged_parameters() did on entry, undone on exit: the swapped
    pairs, and the parameters with a wider average with their scratch copies
    (allocated before anything was written, so that the exit, a swap back
    and copies into memory already held, cannot fail)."""

    def __init__(self, optimizer: Any) -> None:
        self.pairs, wider = _local_pairs(optimizer)
        self.copies = [(p, ax, p.detach().clone(memory_format=torch.preserve_format))
                       for p, ax in wider]  # (raises, with nothing written, when out of memory)
        _swap(self.pairs)  # raises with nothing swapped on bad state
        with torch.no_grad():
            for p, ax, _ in self.copies:
                p.copy_(ax)  # the average, rounded once to the parameter's dtype

    def exit(self) -> None:
        _swap(self.pairs)
        with torch.no_grad():
            for p, _, saved in self.copies:
                p.copy_(saved)


def _refuse(what: str):
    def hook(*args, **kwargs):
        raise RuntimeError(f"optimizer.{what}() inside averaged_parameters(): the parameters "
                           "and 'ax' are swapped right now; call it outside the `with` block")
    return hook


@contextlib.contextmanager
def averaged_parameters(optimizer: Any) -> Iterator[None]:
    """Inside the block every parameter with ASGD state holds its average
    ``ax``, rounded once to the parameter's dtype; ``ax`` holds the training
    value where the two were swapped (``ax`` of the parameter's dtype), and
    is untouched where it is wider (the float32 average of fp16/bf16
    parameters: the training value waits in a scratch copy, 2 B/element for
    bf16, for the block's duration). On exit, even by an exception, the
    parameters and ``ax`` are back bit for bit. ``step()``, ``state_dict()`` and
    ``load_state_dict()`` are refused inside; nesting is refused.
    DTensor (FSDP2) parameters swap their local shards, with no communication.
    """
    if getattr(optimizer, FLAG, False):
        raise RuntimeError("averaged_parameters() is already active for this optimizer "
                           "(nested use is not supported)")
    entered = _Entered(optimizer)  # raises with nothing changed
    handles = [optimizer.register_state_dict_pre_hook(_refuse("state_dict")),
               optimizer.register_load_state_dict_pre_hook(_refuse("load_state_dict"))]
    setattr(optimizer, FLAG, True)
    try:
        yield
    finally:
        # Removed, not set to False: the optimizer is left exactly as before,
        # so a compiled step() guarding on it does not recompile.
        optimizer.__dict__.pop(FLAG, None)
        for h in handles:
            h.remove()
        entered.exit()


def _step_counts(optimizer: Any) -> dict[Tensor, float]:
    """Steps taken per parameter (0 if never stepped): one host read per device."""
    counts: dict[Tensor, float] = {}
    params: list[Tensor] = []
    steps: list[Tensor] = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            s = optimizer.state.get(p, {}).get("step")
            if s is None:
                counts[p] = 0.0
            elif not isinstance(s, Tensor):
                counts[p] = float(s)
            else:
                params.append(p)
                steps.append(_dtensor.to_local(s))
    for idx in indices_by_device(steps).values():
        values = torch.stack([steps[i].detach().reshape(()).double() for i in idx]).tolist()
        counts.update((params[i], v) for i, v in zip(idx, values))
    return counts


def start_averaging(optimizer: Any) -> None:
    r"""Restarts the average with the next step: after ``m`` more steps of a
    parameter, its ``ax`` is the mean of exactly those ``m`` iterates.

    The rule (torch.optim.ASGD's, which torchext follows bit for bit): after
    step ``k`` (counted from 1), ``mu = 1 / max(1, k - t0)``, and step ``k+1``
    updates ``ax += (param - ax) * mu`` with that *previous* ``mu`` (``mu == 1``
    copies ``param``). So for an integer ``t0 >= -1``, ``ax`` after step ``n`` is
    the mean of the iterates ``t0 + 2, ..., n``; with ``t0 = 0`` torch's
    average skips the first iterate. A parameter that took ``s`` steps gets
    ``t0 = s - 1`` and ``mu = 1``, so its average starts with iterate ``s + 1``.

    Recorded where ``state_dict()`` carries it: each group's ``t0`` is set
    (``torch.optim.ASGD`` loads and continues such a checkpoint with the same
    average). If the parameters of one group took different numbers of steps,
    the group also gets ``t0_per_param`` (one ``t0`` per parameter, in group
    order), which torchext's ASGD follows and ``torch.optim.ASGD`` ignores (it
    uses the group's ``t0``, the most common value).

    Reads the step counts (one host sync per device): call it between steps.
    """
    counts = _step_counts(optimizer)
    with torch.no_grad():
        for group in optimizer.param_groups:
            t0s = [counts[p] - 1.0 for p in group["params"]]
            if not t0s:
                continue
            group["t0"] = Counter(t0s).most_common(1)[0][0]
            if all(t == group["t0"] for t in t0s):
                group.pop("t0_per_param", None)
            else:
                group["t0_per_param"] = t0s
            for p in group["params"]:
                mu = optimizer.state.get(p, {}).get("mu")
                if isinstance(mu, Tensor):
                    mu.fill_(1.0)
                elif mu is not None:
                    optimizer.state[p]["mu"] = 1.0


def true_average_state(optimizer: Any) -> dict:
    """The optimizer's state as it is outside averaged_parameters(), taken
    while inside: each swapped ``ax`` is a copy of its parameter (which
    holds the average right now); a wider ``ax`` (float32 for fp16/bf16
    parameters) was not swapped and is the average itself. For pickling
    inside the block."""
    out = {}
    for p, st in optimizer.state.items():
        st = dict(st)
        ax = st.get("ax")
        if isinstance(ax, Tensor) and not is_wider_average(_dtensor.to_local(p),
                                                           _dtensor.to_local(ax)):
            st["ax"] = p.detach().clone()
        out[p] = st
    return out


class NonMonotonicTrigger:
    """AWD-LSTM's switch to averaging (NT-ASGD): watches a validation metric
    and fires once, when it is worse than the best of all but the last
    ``nonmono`` values.

    ``step(val)`` returns True exactly once: at the first call where
    ``len(history) > nonmono and val > min(history[:-nonmono])`` (``mode="min"``;
    ``mode="max"`` mirrors it with ``<`` and ``max``), checked before ``val`` is
    appended to ``history``. When it fires it calls ``on_trigger()``, by
    default ``optimizer.start_averaging()``.

    Any optimizer can be watched: AWD-LSTM's own script trains with SGD and
    switches to a new ASGD when the trigger fires; pass that switch as
    ``on_trigger`` (``optimizer`` may then be None)::

        trigger = NonMonotonicTrigger(on_trigger=switch_to_asgd, nonmono=5)
    """

    def __init__(self, optimizer: Any = None, nonmono: int = 5, mode: str = "min",
                 on_trigger: Any = None) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"NonMonotonicTrigger: mode must be 'min' or 'max', got {mode!r}")
        if not isinstance(nonmono, int) or nonmono < 0:
            raise ValueError(f"NonMonotonicTrigger: nonmono must be an int >= 0, got {nonmono!r}")
        if on_trigger is None:
            if not callable(getattr(optimizer, "start_averaging", None)):
                raise TypeError("NonMonotonicTrigger: give on_trigger=, or an optimizer with "
                                "start_averaging() (torchext.optim.ASGD) to call when it fires")
            on_trigger = optimizer.start_averaging
        elif not callable(on_trigger):
            raise TypeError(f"NonMonotonicTrigger: on_trigger must be callable, got {on_trigger!r}")
        self.optimizer = optimizer
        self.on_trigger = on_trigger
        self.nonmono = nonmono
        self.mode = mode
        self.history: list[float] = []
        self.triggered = False

    def step(self, val_metric: float | Tensor) -> bool:
        val = float(val_metric)
        fire = False
        if not self.triggered and len(self.history) > self.nonmono:
            older = self.history[:-self.nonmono] if self.nonmono else self.history
            fire = val > min(older) if self.mode == "min" else val < max(older)
        self.history.append(val)
        if fire:
            self.triggered = True
            self.on_trigger()
        return fire

    def state_dict(self) -> dict[str, Any]:
        return {"nonmono": self.nonmono, "mode": self.mode, "history": list(self.history),
                "triggered": self.triggered}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.nonmono = int(state_dict["nonmono"])
        self.mode = state_dict["mode"]
        self.history = [float(v) for v in state_dict["history"]]
        self.triggered = bool(state_dict["triggered"])


def averaged_state_dict(model: torch.nn.Module, optimizer: Any,
                        dtype: torch.dtype | None = None) -> "OrderedDict[str, Any]":
    """``model.state_dict()`` with each parameter replaced by its average
    (parameters never stepped keep their value; buffers are as they are), in
    the model's dtypes. ``dtype=torch.float32`` exports the averages in
    float32 instead: a float32 average (fp16/bf16 parameters) unrounded, any
    other parameter's converted. Every tensor is a copy, ready for
    ``torch.save``, ``torch.export`` or deployment; the model and the
    optimizer are left as they were."""
    averages = {}
    if dtype is not None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                ax = optimizer.state.get(p, {}).get("ax")
                if isinstance(ax, Tensor):
                    averages[id(p)] = ax
    with averaged_parameters(optimizer):
        sd = model.state_dict(keep_vars=dtype is not None)
        out = OrderedDict()
        for k, v in sd.items():
            if isinstance(v, Tensor):
                ax = averages.get(id(v)) if dtype is not None else None
                src = ax if ax is not None and ax.dtype != v.dtype else v
                v = src.detach().clone() if dtype is None or not v.is_floating_point() \
                    else src.detach().to(dtype, copy=True)
            out[k] = v
    metadata = getattr(sd, "_metadata", None)
    if metadata is not None:
        out._metadata = metadata  # type: ignore[attr-defined]
    return out
