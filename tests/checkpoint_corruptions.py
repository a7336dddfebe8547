"""The table of corrupted checkpoints, the one source both languages are
tested on (issue #18: "checkpoints refused whole").

Each case takes a good state_dict (Python's format: what
``torchext.optim.ASGD.state_dict()`` / ``torchext.amp.GradScaler.state_dict()``
return) and damages one thing. Every case must be refused by
``load_state_dict`` with an error whose message contains every string of
``names`` (it names the entry), leaving the optimizer or scaler exactly as it
was:

* Python: tests/checkpoints/test_checkpoint_corruptions.py;
* C++: cpp_tests/make_reference.py writes each corrupted dict with
  torch.save into ``corrupt/`` (and ``corrupt/index.txt``: kind, name, names),
  and cpp_tests/test_checkpoint.cpp loads each with
  ``torchext::load_state_dict`` (CorruptCheckpoints.*).

``ALLOWED`` lists changes that must load (extra unknown keys, as torch allows
them; ``t0_per_param`` None).

The good checkpoints come from :func:`asgd_problem` / :func:`scaler_problem`
(the C++ test builds the same shapes and groups: ``SHAPES``, ``GROUPS``).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["Corruption", "ASGD_CASES", "SCALER_CASES", "ASGD_ALLOWED", "SCALER_ALLOWED",
           "SHAPES", "GROUPS", "asgd_problem", "scaler_problem", "train_asgd", "train_scaler"]

# The good ASGD checkpoint: three params in two groups, a few steps.
SHAPES = [(4, 3), (3,), (2, 2)]
GROUPS = [dict(idx=(0, 1), lr=0.03, lambd=1e-3, alpha=0.75, t0=3.0, weight_decay=1e-2),
          dict(idx=(2,), lr=0.01, lambd=1e-2, alpha=0.6, t0=0.0, weight_decay=0.0,
               maximize=True)]
# The good scaler checkpoint: torchext's GradScaler with these options.
SCALER_OPTIONS = dict(init_scale=2.0 ** 10, growth_factor=2.0, backoff_factor=0.5,
                      growth_interval=3, hysteresis=2)

NAN, INF = float("nan"), float("inf")


# C++ reads torch.save files with torch::jit::pickle_load, which knows no
# sparse or meta tensors: it refuses such a file whole before any rule runs,
# with this message (naming the tensor type it does not know, not the entry).
CPP_UNREADABLE = ("not a readable torch.save file",)


@dataclass(frozen=True)
class Corruption:
    name: str                       # a file-safe identifier
    names: tuple[str, ...]          # substrings the error message must contain
    apply: Callable[[dict], Any]    # takes a deep copy of a good dict, returns the bad one
    cpp_names: tuple[str, ...] | None = None  # what C++'s message contains, if not `names`


def _set(path: tuple, value: Any) -> Callable[[dict], Any]:
    def apply(sd):
        d = sd
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value() if callable(value) else value
        return sd
    return apply


def _del(path: tuple) -> Callable[[dict], Any]:
    def apply(sd):
        d = sd
        for k in path[:-1]:
            d = d[k]
        del d[path[-1]]
        return sd
    return apply


def _whole(value: Any) -> Callable[[dict], Any]:
    return lambda sd: value


# ---- ASGD -------------------------------------------------------------------
# Entries of group 1 / param 2 (the later group): a refusal there must not
# leave group 0 half loaded.

G1 = ("param_groups", 1)
G0 = ("param_groups", 0)
S2 = ("state", 2)


def _asgd_cases() -> list[Corruption]:
    c: list[Corruption] = []

    def add(name, names, apply, cpp_names=None):
        c.append(Corruption(name, tuple(names), apply, cpp_names))

    # structure
    add("not_a_dict", ("dict",), _whole([1, 2]))
    add("no_state", ("'state'",), _del(("state",)))
    add("no_param_groups", ("'param_groups'",), _del(("param_groups",)))
    add("state_not_a_dict", ("'state'",), _set(("state",), lambda: [1, 2]))
    add("param_groups_not_a_list", ("'param_groups'",), _set(("param_groups",), lambda: {"a": 1}))
    add("one_group_missing", ("parameter groups",), lambda sd: {**sd, "param_groups": sd[
        "param_groups"][:1]})
    add("extra_group", ("parameter groups",), lambda sd: {**sd, "param_groups": sd[
        "param_groups"] + [copy.deepcopy(sd["param_groups"][1])]})
    add("group_short_of_a_param", ("param_groups[0]", "params"),
        _set(G0 + ("params",), lambda: [0]))
    add("group_with_an_extra_param", ("param_groups[1]", "params"),
        _set(G1 + ("params",), lambda: [2, 3]))
    add("group_not_a_dict", ("param_groups[1]",), _set(G1, lambda: [2]))
    add("group_params_not_a_list", ("param_groups[1]", "params"), _set(G1 + ("params",), 2))
    add("group_params_missing", ("param_groups[1]", "params"), _del(G1 + ("params",)))
    add("param_id_a_float", ("param_groups[1]", "params"), _set(G1 + ("params",),
                                                                 lambda: [2.5]))
    add("param_id_twice", ("param_groups[0]", "params"), _set(G0 + ("params",), lambda: [0, 0]))
    # state entries
    add("entry_not_a_dict", ("state[2]",), _set(S2, 5.0))
    for key in ("step", "eta", "mu", "ax"):
        add(f"entry_lacks_{key}", ("state[2]", key), _del(S2 + (key,)))
    add("ax_wrong_shape", ("state[2]", "ax"), _set(S2 + ("ax",), lambda: torch.zeros(4)))
    add("ax_transposed_shape", ("state[0]", "ax"), _set(("state", 0, "ax"),
                                                        lambda: torch.zeros(3, 4)))
    add("ax_int", ("state[2]", "ax"), _set(S2 + ("ax",), lambda: torch.zeros(2, 2,
                                                                              dtype=torch.int64)))
    add("ax_bool", ("state[2]", "ax"), _set(S2 + ("ax",), lambda: torch.zeros(2, 2,
                                                                               dtype=torch.bool)))
    add("ax_complex", ("state[2]", "ax"), _set(S2 + ("ax",), lambda: torch.zeros(
        2, 2, dtype=torch.complex64)))
    add("ax_sparse", ("state[2]", "ax"), _set(S2 + ("ax",), lambda: torch.zeros(2, 2).to_sparse()),
        CPP_UNREADABLE)
    add("ax_not_a_tensor", ("state[2]", "ax"), _set(S2 + ("ax",), lambda: [[0.0, 0.0],
                                                                          [0.0, 0.0]]))
    add("ax_none", ("state[2]", "ax"), _set(S2 + ("ax",), None))
    add("ax_on_meta", ("state[2]", "ax"), _set(S2 + ("ax",), lambda: torch.zeros(2, 2,
                                                                               device="meta")),
        CPP_UNREADABLE)
    add("ax_number", ("state[2]", "ax"), _set(S2 + ("ax",), 0.0))
    for key in ("step", "eta", "mu"):
        add(f"{key}_nan", ("state[2]", key), _set(S2 + (key,), lambda: torch.tensor(NAN)))
        add(f"{key}_inf", ("state[2]", key), _set(S2 + (key,), lambda: torch.tensor(INF)))
        add(f"{key}_negative", ("state[2]", key), _set(S2 + (key,), lambda: torch.tensor(-1.0)))
        add(f"{key}_two_elements", ("state[2]", key), _set(S2 + (key,), lambda: torch.ones(2)))
        add(f"{key}_empty", ("state[2]", key), _set(S2 + (key,), lambda: torch.ones(0)))
        add(f"{key}_complex", ("state[2]", key), _set(S2 + (key,), lambda: torch.tensor(1 + 0j)))
        add(f"{key}_bool", ("state[2]", key), _set(S2 + (key,), lambda: torch.tensor(True)))
        add(f"{key}_none", ("state[2]", key), _set(S2 + (key,), None))
        add(f"{key}_string", ("state[2]", key), _set(S2 + (key,), "1"))
        add(f"{key}_on_meta", ("state[2]", key), _set(S2 + (key,), lambda: torch.zeros(
            (), device="meta")), CPP_UNREADABLE)
    # old checkpoints keep step/eta/mu as Python numbers: the same rules
    add("step_number_nan", ("state[2]", "step"), _set(S2 + ("step",), NAN))
    add("eta_number_negative", ("state[2]", "eta"), _set(S2 + ("eta",), -0.5))
    add("mu_number_inf", ("state[2]", "mu"), _set(S2 + ("mu",), INF))
    add("step_number_bool", ("state[2]", "step"), _set(S2 + ("step",), True))
    # hyperparameters, with the constructor's rules
    for key in ("lr", "lambd", "alpha", "weight_decay"):
        add(f"{key}_nan", ("param_groups[1]", key), _set(G1 + (key,), NAN))
        add(f"{key}_inf", ("param_groups[1]", key), _set(G1 + (key,), INF))  # NaN at step 1
        add(f"{key}_negative", ("param_groups[1]", key), _set(G1 + (key,), -0.1))
        add(f"{key}_none", ("param_groups[1]", key), _set(G1 + (key,), None))
        add(f"{key}_string", ("param_groups[1]", key), _set(G1 + (key,), "0.1"))
        add(f"{key}_bool", ("param_groups[1]", key), _set(G1 + (key,), True))
        add(f"{key}_missing", ("param_groups[1]", key), _del(G1 + (key,)))
    # issue 47: the average's dtype is "float32" (torch.float32) or None
    add("average_dtype_other_string", ("param_groups[1]", "average_dtype"),
        _set(G1 + ("average_dtype",), "float64"))
    add("average_dtype_other_dtype", ("param_groups[1]", "average_dtype"),
        _set(G1 + ("average_dtype",), torch.bfloat16))
    # issue 47: stochastic rounding's flag is a bool, its seed an int64
    add("stochastic_rounding_int", ("param_groups[1]", "stochastic_rounding"),
        _set(G1 + ("stochastic_rounding",), 1))
    add("rounding_seed_float", ("param_groups[1]", "rounding_seed"),
        _set(G1 + ("rounding_seed",), 1.5))
    add("rounding_seed_string", ("param_groups[1]", "rounding_seed"),
        _set(G1 + ("rounding_seed",), "7"))
    # issue 25: a non-finite hyperparameter in the FIRST group too (inf lambd
    # loaded without a word and turned the next step NaN)
    for key in ("lr", "lambd", "alpha", "weight_decay"):
        add(f"{key}_inf_group0", ("param_groups[0]", key), _set(G0 + (key,), INF))
        add(f"{key}_nan_group0", ("param_groups[0]", key), _set(G0 + (key,), NAN))
        add(f"{key}_negative_inf", ("param_groups[1]", key), _set(G1 + (key,), -INF))
    add("t0_nan", ("param_groups[1]", "t0"), _set(G1 + ("t0",), NAN))
    add("t0_nan_group0", ("param_groups[0]", "t0"), _set(G0 + ("t0",), NAN))
    add("t0_none", ("param_groups[1]", "t0"), _set(G1 + ("t0",), None))
    add("t0_string", ("param_groups[1]", "t0"), _set(G1 + ("t0",), "3"))
    add("t0_missing", ("param_groups[1]", "t0"), _del(G1 + ("t0",)))
    add("lr_tensor_two_elements", ("param_groups[1]", "lr"), _set(G1 + ("lr",),
                                                                  lambda: torch.ones(2)))
    add("lr_tensor_int", ("param_groups[1]", "lr"), _set(G1 + ("lr",), lambda: torch.tensor(1)))
    add("lr_tensor_complex", ("param_groups[1]", "lr"), _set(G1 + ("lr",),
                                                             lambda: torch.tensor(0.1 + 0j)))
    add("lr_tensor_nan", ("param_groups[1]", "lr"), _set(G1 + ("lr",), lambda: torch.tensor(NAN)))
    add("lr_tensor_inf", ("param_groups[1]", "lr"), _set(G1 + ("lr",), lambda: torch.tensor(INF)))
    add("lr_tensor_negative", ("param_groups[1]", "lr"), _set(G1 + ("lr",),
                                                              lambda: torch.tensor(-0.1)))
    add("lr_tensor_inf_group0", ("param_groups[0]", "lr"),
        _set(G0 + ("lr",), lambda: torch.tensor(INF)))
    add("lr_tensor_float64_nan", ("param_groups[1]", "lr"),
        _set(G1 + ("lr",), lambda: torch.tensor(NAN, dtype=torch.float64)))
    for key in ("maximize", "capturable", "differentiable"):
        add(f"{key}_not_a_bool", ("param_groups[1]", key), _set(G1 + (key,), 1))
    add("maximize_none", ("param_groups[1]", "maximize"), _set(G1 + ("maximize",), None))
    add("foreach_not_a_bool", ("param_groups[1]", "foreach"), _set(G1 + ("foreach",), "yes"))
    add("fused_not_a_bool", ("param_groups[1]", "fused"), _set(G1 + ("fused",), 0))
    add("fused_and_differentiable", ("param_groups[1]", "fused", "differentiable"),
        lambda sd: (sd["param_groups"][1].update(fused=True, differentiable=True), sd)[1])
    # t0_per_param (start_averaging with params at different step counts)
    add("t0_per_param_too_short", ("param_groups[0]", "t0_per_param"),
        _set(G0 + ("t0_per_param",), lambda: [2.0]))
    add("t0_per_param_too_long", ("param_groups[1]", "t0_per_param"),
        _set(G1 + ("t0_per_param",), lambda: [2.0, 2.0]))
    add("t0_per_param_nan", ("param_groups[0]", "t0_per_param"),
        _set(G0 + ("t0_per_param",), lambda: [2.0, NAN]))
    add("t0_per_param_not_a_list", ("param_groups[0]", "t0_per_param"),
        _set(G0 + ("t0_per_param",), 2.0))
    add("t0_per_param_string_entry", ("param_groups[0]", "t0_per_param"),
        _set(G0 + ("t0_per_param",), lambda: [2.0, "2"]))
    return c


def _asgd_allowed() -> list[Corruption]:
    def extra(sd):
        sd["extra_top_level_key"] = 1
        sd["param_groups"][0]["param_names"] = ["a", "b"]
        sd["param_groups"][1]["user_key"] = "kept"
        sd["state"][2]["momentum_buffer"] = torch.ones(2, 2)
        sd["state"][99] = {"unrelated": 1}  # an id no group names: kept aside, as torch
        return sd
    return [Corruption("extra_unknown_keys", (), extra),
            Corruption("t0_per_param_none", (), _set(G0 + ("t0_per_param",), None)),
            Corruption("t0_inf", (), _set(G1 + ("t0",), INF)),  # never average: allowed
            Corruption("t0_inf_group0", (), _set(G0 + ("t0",), INF)),
            Corruption("t0_tensor_inf", (), _set(G1 + ("t0",), lambda: torch.tensor(INF))),
            Corruption("t0_per_param_inf", (), _set(G0 + ("t0_per_param",),
                                                    lambda: [INF, 1.0])),
            Corruption("t0_per_param_valid", (), _set(G0 + ("t0_per_param",),
                                                      lambda: [2.0, 1.0]))]


# ---- GradScaler -------------------------------------------------------------

def _scaler_cases() -> list[Corruption]:
    c: list[Corruption] = []

    def add(name, names, apply):
        c.append(Corruption(name, tuple(names), apply))

    add("not_a_dict", ("dict",), _whole([1.0]))
    add("empty", ("empty",), _whole({}))
    for key in ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker",
                "hysteresis", "_hysteresis_tracker", "min_scale", "max_scale", "skipped_steps"):
        add(f"no_{key.lstrip('_')}", (key,), _del((key,)))
    for name, v in (("zero", 0.0), ("negative", -8.0), ("nan", NAN), ("inf", INF),
                    ("string", "1024"), ("none", None), ("bool", True)):
        add(f"scale_{name}", ("scale",), _set(("scale",), v))
    add("scale_tensor_two_elements", ("scale",), _set(("scale",), lambda: torch.ones(2)))
    for name, v in (("one", 1.0), ("below_one", 0.5), ("nan", NAN), ("inf", INF),
                    ("none", None)):
        add(f"growth_factor_{name}", ("growth_factor",), _set(("growth_factor",), v))
    for name, v in (("zero", 0.0), ("one", 1.0), ("above_one", 1.5), ("negative", -0.5),
                    ("nan", NAN), ("inf", INF)):
        add(f"backoff_factor_{name}", ("backoff_factor",), _set(("backoff_factor",), v))
    for name, v in (("zero", 0), ("negative", -1), ("fraction", 1.5), ("string", "3"),
                    ("inf", INF)):
        add(f"growth_interval_{name}", ("growth_interval",), _set(("growth_interval",), v))
    add("growth_tracker_negative", ("_growth_tracker",), _set(("_growth_tracker",), -1))
    add("growth_tracker_fraction", ("_growth_tracker",), _set(("_growth_tracker",), 0.5))
    add("growth_interval_nan", ("growth_interval",), _set(("growth_interval",), NAN))
    add("hysteresis_zero", ("hysteresis",), _set(("hysteresis",), 0))
    add("hysteresis_inf", ("hysteresis",), _set(("hysteresis",), INF))
    add("min_scale_inf", ("min_scale",),
        lambda sd: (sd.update(min_scale=INF, max_scale=INF), sd)[1])
    add("min_scale_nan", ("min_scale",), _set(("min_scale",), NAN))
    add("hysteresis_negative", ("hysteresis",), _set(("hysteresis",), -2))
    add("hysteresis_tracker_negative", ("_hysteresis_tracker",),
        _set(("_hysteresis_tracker",), -1))
    add("hysteresis_tracker_above_hysteresis", ("_hysteresis_tracker",),
        _set(("_hysteresis_tracker",), 3))
    add("min_scale_negative", ("min_scale",), _set(("min_scale",), -1.0))
    add("min_above_max", ("min_scale", "max_scale"),
        lambda sd: (sd.update(min_scale=100.0, max_scale=10.0), sd)[1])
    add("max_scale_nan", ("max_scale",), _set(("max_scale",), NAN))
    # issue 25: nothing non-finite where the scale or a count would become so
    add("scale_negative_inf", ("scale",), _set(("scale",), -INF))
    add("scale_tensor_inf", ("scale",), _set(("scale",), lambda: torch.tensor(INF)))
    add("scale_tensor_nan", ("scale",), _set(("scale",), lambda: torch.tensor(NAN)))
    add("backoff_factor_negative_inf", ("backoff_factor",), _set(("backoff_factor",), -INF))
    add("growth_interval_negative_inf", ("growth_interval",), _set(("growth_interval",), -INF))
    add("growth_tracker_inf", ("_growth_tracker",), _set(("_growth_tracker",), INF))
    add("growth_tracker_nan", ("_growth_tracker",), _set(("_growth_tracker",), NAN))
    add("hysteresis_nan", ("hysteresis",), _set(("hysteresis",), NAN))
    add("hysteresis_tracker_inf", ("_hysteresis_tracker",), _set(("_hysteresis_tracker",), INF))
    add("hysteresis_tracker_nan", ("_hysteresis_tracker",), _set(("_hysteresis_tracker",), NAN))
    add("min_scale_negative_inf", ("min_scale",), _set(("min_scale",), -INF))
    add("max_scale_negative_inf", ("max_scale",), _set(("max_scale",), -INF))
    add("skipped_steps_inf", ("skipped_steps",), _set(("skipped_steps",), INF))
    add("skipped_steps_nan", ("skipped_steps",), _set(("skipped_steps",), NAN))
    add("skipped_steps_negative", ("skipped_steps",), _set(("skipped_steps",), -1))
    for name, v in (("too_new", 99), ("negative", -1), ("string", "1"), ("bool", True),
                    ("float", 1.0)):
        add(f"version_{name}", ("_torchext_version",), _set(("_torchext_version",), v))

    def torch_format(key, v):
        def apply(sd):
            sd = {k: sd[k] for k in ("scale", "growth_factor", "backoff_factor",
                                     "growth_interval", "_growth_tracker")}
            sd[key] = v
            return sd
        return apply
    add("torch_format_scale_zero", ("scale",), torch_format("scale", 0.0))
    add("torch_format_growth_interval_zero", ("growth_interval",),
        torch_format("growth_interval", 0))
    return c


def _scaler_allowed() -> list[Corruption]:
    def extra(sd):
        sd["user_key"] = "kept"
        return sd

    def torch_format(sd):
        return {k: sd[k] for k in ("scale", "growth_factor", "backoff_factor", "growth_interval",
                                   "_growth_tracker")}
    return [Corruption("extra_unknown_key", (), extra),
            Corruption("torch_format", (), torch_format),
            # max_scale = inf is "no clamp", as None (issue 25)
            Corruption("max_scale_inf", (), _set(("max_scale",), INF))]


ASGD_CASES = _asgd_cases()
ASGD_ALLOWED = _asgd_allowed()
SCALER_CASES = _scaler_cases()
SCALER_ALLOWED = _scaler_allowed()
assert len({c.name for c in ASGD_CASES}) == len(ASGD_CASES)
assert len({c.name for c in SCALER_CASES}) == len(SCALER_CASES)


# ---- the good checkpoints ---------------------------------------------------

def asgd_problem(cls=None, seed: int = 0):
    """(params, optimizer) of the good ASGD checkpoint, before training."""
    if cls is None:
        from torchext.optim import ASGD as cls
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen).requires_grad_() for s in SHAPES]
    groups = [dict(params=[params[i] for i in g["idx"]],
                   **{k: v for k, v in g.items() if k != "idx"}) for g in GROUPS]
    return params, cls(groups)


def train_asgd(params, opt, steps: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()


def scaler_problem(cls=None):
    if cls is None:
        from torchext.amp import GradScaler as cls
    return cls("cpu", **SCALER_OPTIONS)


def train_scaler(scaler, steps: int, seed: int = 2) -> None:
    """A few scaled steps of a tiny SGD problem, one of them overflowing."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(3, generator=gen).requires_grad_()
    opt = torch.optim.SGD([w], lr=0.1)
    for s in range(steps):
        x = torch.randn(3, generator=gen)
        if s == 1:
            x[0] = INF
        opt.zero_grad()
        scaler.scale((w * x).sum()).backward()
        scaler.step(opt)
        scaler.update()

