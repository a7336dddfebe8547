"""ASGD's state, owned by the optimizer from its creation: the step machine's
data.

``opt.state[p]`` holds torch.optim.ASGD's entries (``step``, ``eta``, ``mu``,
``ax``), so checkpoints move between torchext, torch and C++. Behind them:

* **Slot groups.** The params of a param group are split by device and t0
  (one op call each). A slot group packs its params' ``step``, ``eta`` and
  ``mu`` into one 1-D tensor each; the state entries are 0-d views of their
  elements, from the moment the state is created (the first step with a
  grad, as in torch). A step reads the slot group, never ``opt.state``.
* **Changes are counted, not searched for.** In-place writes to the state
  tensors (``.fill_``, ``.copy_``, ``averaged_parameters``) go straight to
  the packed tensors. Structural changes (an entry or a param's state dict
  assigned or deleted, ``opt.state`` replaced, a group's ``params`` list
  edited or replaced, groups added or replaced, ``fused``/
  ``differentiable``/``t0_per_param`` changed) make the optimizer rebuild
  the slot groups before its next step, packing the new values: the
  containers (:class:`StateMap`, :class:`ParamState`, :class:`ParamList`)
  count changes in a shared :class:`Generation`; the rest is compared per
  group, in O(1). No step sweeps the params or the state to look for
  changes. Re-pointing a state tensor in place (``.set_()``, ``.data =``)
  is not noticed (documented).
* **The C++ holder.** In eager mode a slot group of plain tensors on a
  device with kernels keeps its lists in ``torch.classes.torchext.ASGDHolder``
  (csrc/classes/asgd_holder.cpp), which reads the grads itself and calls
  ``asgd_.packed``: a step passes no list from Python. It is made anew with
  its slot group and holds nothing else.
"""
from __future__ import annotations

import collections
from typing import Any, Iterable

import torch
from torch import Tensor

from .. import _devices, _dtensor
from . import _op
from .functional import use_fused

__all__ = ["Generation", "ParamState", "StateMap", "ParamList", "SlotGroup", "ParamGroupSlots",
           "scalar_dtype"]

SCALAR_KEYS = ("step", "eta", "mu")
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def scalar_dtype() -> torch.dtype:
    # Same rule as torch.optim: float64 state when the default dtype is float64.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class Generation:
    """Counts structural changes to an optimizer's state and groups."""
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


def _counting(base: type, names: tuple[str, ...]):
    """Class decorator: each method of ``base`` named in ``names`` also
    counts a structural change in the instance's Generation."""
    def decorate(cls):
        for name in names:
            def method(self, *args, _base=getattr(base, name), **kwargs):
                self._gen.n += 1
                return _base(self, *args, **kwargs)
            method.__name__ = name
            setattr(cls, name, method)
        return cls
    return decorate


_DICT_MUTATORS = ("__setitem__", "__delitem__", "pop", "popitem", "clear", "setdefault", "update")


@_counting(dict, _DICT_MUTATORS)
class ParamState(dict):
    """One parameter's state (a dict, as torch keeps it); every change to it
    is structural (the slot groups are rebuilt, the new values packed)."""
    __slots__ = ("_gen",)

    def __init__(self, gen: Generation, *args: Any, **kwargs: Any) -> None:
        dict.__init__(self, *args, **kwargs)
        self._gen = gen

    def __reduce__(self):
        # Pickles (torch.save of the optimizer, deepcopy) as a plain dict:
        # the loader rebuilds ownership (ASGD.__setstate__).
        return (dict, (dict(self),))


@_counting(collections.defaultdict, _DICT_MUTATORS[1:])
class StateMap(collections.defaultdict):
    """``opt.state``: every change of a parameter's entry is structural."""

    def __init__(self, gen: Generation, *args: Any) -> None:
        super().__init__(lambda: ParamState(gen), *args)
        self._gen = gen

    def __setitem__(self, key: Any, value: Any) -> None:
        self._gen.n += 1
        if type(value) is dict:
            value = ParamState(self._gen, value)
        collections.defaultdict.__setitem__(self, key, value)

    def __reduce__(self):
        return (collections.defaultdict, (dict, dict(self)))


@_counting(list, ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend",
                  "insert", "pop", "remove", "clear", "sort", "reverse"))
class ParamList(list):
    """A param group's ``params``: any edit is structural."""
    __slots__ = ("_gen",)

    def __init__(self, gen: Generation, items: Iterable[Any] = ()) -> None:
        list.__init__(self, items)
        self._gen = gen

    def __reduce__(self):
        return (list, (list(self),))


def own_containers(opt: Any, gen: Generation) -> None:
    """Puts the optimizer's state and group lists into tracked containers
    (after construction, unpickling or load_state_dict)."""
    state = opt.__dict__.get("state")
    if not isinstance(state, StateMap) or state._gen is not gen:
        tracked = StateMap(gen)
        for p, st in (state or {}).items():
            collections.defaultdict.__setitem__(
                tracked, p, st if isinstance(st, ParamState) and st._gen is gen
                else ParamState(gen, st))
        opt.__dict__["state"] = tracked
    for group in opt.__dict__.get("param_groups", ()):
        params = group["params"]
        if not isinstance(params, ParamList) or params._gen is not gen:
            group["params"] = ParamList(gen, params)
    gen.n += 1


class SlotGroup:
    """The params of one param group on one device with one t0: what one op
    call steps. ``axs[i]`` is None while ``params[i]`` has no state."""
    __slots__ = ("device", "t0", "params", "ids", "axs", "mus", "etas", "steps", "views", "native",
                 "native_run", "native_check", "native_norms", "plain", "_args_key", "_args",
                 "_rounding", "_offsets")

    def __init__(self, device: torch.device, t0: float, params: list[Tensor],
                 ids: list[int]) -> None:
        self.device = device
        self.t0 = t0
        self.params = params
        # Each param's identity in the optimizer (_op.rounding_id: its group's
        # position and its own there), which keys its stochastic rounding.
        self.ids = ids
        self._rounding = (None, None, None)
        self._offsets = None  # each param's rounding offset, made at first use
        self.axs: list[Tensor | None] = [None] * len(params)
        self.native = self.native_run = self.native_check = self.native_norms = None
        self.plain = all(type(p) in _PLAIN for p in params)
        self._args_key = None
        self._args = None

    def pack(self, states: list[ParamState | None]) -> None:
        """Packs the existing states' step/eta/mu into new 1-D tensors and
        makes the entries views of their elements (values, dtype and device
        kept); params without state get fresh elements. Raises, having
        changed nothing, when an entry cannot be packed (not one float32/64
        number on the parameter's device): the step refuses such state."""
        n = len(self.params)
        have = [i for i, st in enumerate(states) if st and any(k in st for k in SCALAR_KEYS)]
        dtype = None
        for i in have:
            for k in SCALAR_KEYS:
                v = states[i].get(k)
                dtype = _check_packable(v, k, i, self.device, dtype)
        dtype = dtype or scalar_dtype()
        init = {"step": 0.0, "eta": 0.0, "mu": 1.0}
        bufs = {k: torch.full((n,), v, dtype=dtype, device=self.device) for k, v in init.items()}
        if have:
            idx = torch.tensor(have, device=self.device)
            with torch.no_grad():
                for k, buf in bufs.items():
                    values = [_as_scalar(states[i][k], dtype, self.device) for i in have]
                    buf.index_copy_(0, idx, torch.stack(values))
        self.mus, self.etas, self.steps = bufs["mu"], bufs["eta"], bufs["step"]
        self.views = {k: bufs[k].unbind(0) for k in SCALAR_KEYS}
        for i in have:
            st = states[i]
            for k in SCALAR_KEYS:
                dict.__setitem__(st, k, self.views[k][i])
            ax = st.get("ax")
            self.axs[i] = ax if isinstance(ax, Tensor) else None

    def lists(self, idx: list[int]) -> list[list]:
        """[params, grads, axs, mus, etas, steps] of the params at ``idx``,
        step/eta/mu as the 0-d views (torch.optim.ASGD's lists)."""
        views = self.views
        return [[self.params[i] for i in idx], [self.params[i].grad for i in idx],
                [self.axs[i] for i in idx], [views["mu"][i] for i in idx],
                [views["eta"][i] for i in idx], [views["step"][i] for i in idx]]

    def holder_args(self, group: dict[str, Any]) -> tuple[Tensor, list[float]]:
        """The holder's lr tensor and hyperparameter list (schema order, this
        slot group's t0), made again only when one of the group's values
        changed since the last step (an LR scheduler writes ``group["lr"]``
        between steps), and then the holder's rounding too. A tensor lr is
        passed as it is, so its in-place changes need nothing here."""
        lr = group["lr"]
        key = (("tensor", id(lr)) if isinstance(lr, Tensor) else float(lr),
               *map(group.__getitem__, _op.HYPER),  # (no listcomp: a frame less a step)
               group.get("stochastic_rounding"), group.get("rounding_seed"))
        if key != self._args_key:
            t0 = group["t0"] if self.t0 is None else self.t0
            # (lr kept in the tuple: its id in the key stays its own)
            self._args = (_op.lr_tensor(lr), _op.hyper_list(_op.hyper_of(group, t0=t0)), lr)
            rounding = self.rounding(group, range(len(self.params)))
            self._rounding = (rounding.get("rounding_seed"), rounding.get("rounding_ids"),
                              rounding.get("rounding_offsets"))
            if self.native is not None:
                self.native.set_rounding(*self._rounding)
            self._args_key = key
        return self._args[:2]

    def rounding(self, group: dict[str, Any], idx) -> dict[str, Any]:
        """The op's rounding_* keywords for the params at ``idx`` ({}: the
        group rounds to nearest)."""
        if not group.get("stochastic_rounding"):
            return {}
        if self._offsets is None:  # (a param's layout is fixed for the slot group's life)
            self._offsets = [_dtensor.flat_offset(p) for p in self.params]
        offsets = [self._offsets[i] for i in idx]
        return _op.rounding_args(group.get("rounding_seed", 0), [self.ids[i] for i in idx],
                                 offsets if any(offsets) else None)

    def holder(self):
        """The C++ holder of this slot group's lists (made at first use),
        its ``run`` and ``check_finite`` bound once as ``native_run`` and
        ``native_check`` (a torchbind method looked up costs ~1 us a step)."""
        if self.native is None:
            native = torch.classes.torchext.ASGDHolder(
                self.params, self.axs, self.mus, self.etas, self.steps)
            self.native_run, self.native_check = native.run, native.check_finite
            self.native_norms = native.norms
            if self._rounding[0] is not None:
                native.set_rounding(*self._rounding)
            self.native = native
        return self.native


def _check_packable(v: Any, key: str, i: int, device: torch.device,
                    dtype: torch.dtype | None) -> torch.dtype | None:
    """The rules the op applies to list state, for a state entry about to be
    packed (a Python number, from old checkpoints, is converted)."""
    if v is None:
        raise ValueError(f"ASGD: the state of a parameter lacks '{key}' (it has "
                         f"{sorted(k for k in SCALAR_KEYS)} or nothing)")
    if not isinstance(v, Tensor):
        float(v)
        return dtype
    v = _dtensor.to_local(v)
    if v.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"ASGD: state '{key}' must be a float32 or float64 tensor, got {v.dtype}")
    if v.numel() != 1:
        raise ValueError(f"ASGD: state '{key}' must hold exactly one element, got shape "
                         f"{tuple(v.shape)}")
    if v.device != device:
        raise RuntimeError(f"ASGD: state '{key}' is on {v.device} but its parameter is on "
                           f"{device}; optimizer state must live on the parameter's device")
    if dtype is not None and v.dtype != dtype:
        raise TypeError(f"ASGD: step, eta and mu must all share one dtype (float32, or float64 "
                        f"when the default dtype is float64); got {dtype} and {v.dtype}")
    return v.dtype


def _as_scalar(v: Any, dtype: torch.dtype, device: torch.device) -> Tensor:
    if isinstance(v, Tensor):
        return _dtensor.to_local(v).detach().reshape(()).to(device=device, dtype=dtype)
    return torch.tensor(float(v), dtype=dtype, device=device)


class ParamGroupSlots:
    """One param group's slot groups, and what they were built from (the
    group, its params list and the flags that decide the route): compared
    at every step in O(1); any difference rebuilds them."""
    __slots__ = ("group", "params_list", "fused_flag", "differentiable", "t0_per_param", "fused",
                 "slot_groups", "on_meta", "native_ok")

    def __init__(self, group: dict[str, Any], state: StateMap, index: int) -> None:
        self.group = group
        self.params_list = group["params"]
        self.fused_flag = group["fused"]
        self.differentiable = group["differentiable"]
        self.t0_per_param = group.get("t0_per_param")
        params = list(self.params_list)
        self.fused = use_fused(params, self.fused_flag, self.differentiable)
        t0s = self.t0_per_param
        if t0s is not None and len(t0s) != len(params):
            raise ValueError(f"ASGD: the group's t0_per_param has {len(t0s)} values but the "
                             f"group has {len(params)} params")
        keys = _devices.indices_by_device_and_key(
            (_dtensor.to_local(p) for p in params), None if t0s is None else [float(t) for t in t0s])
        self.slot_groups = []
        for (device, t0), idx in keys.items():
            sg = SlotGroup(device, t0, [params[i] for i in idx],
                           [_op.rounding_id(index, i) for i in idx])
            sg.pack([_state_of(state, params[i]) for i in idx])
            self.slot_groups.append(sg)
        # Meta grads hold no values: the scaler's inf check cannot use them.
        self.on_meta = any(sg.device.type == "meta" for sg in self.slot_groups)
        # Whether eager steps may go through the C++ holders.
        self.native_ok = self.fused and all(sg.plain and _devices.has_kernels(sg.device)
                                            for sg in self.slot_groups)

    def fresh(self, group: dict[str, Any]) -> bool:
        return (self.group is group and group["params"] is self.params_list
                and group["fused"] == self.fused_flag
                and group["differentiable"] == self.differentiable
                and group.get("t0_per_param") is self.t0_per_param)


def _state_of(state: StateMap, p: Tensor) -> ParamState | None:
    st = dict.get(state, p)  # no insertion (state is a defaultdict)
    return st if st else None
