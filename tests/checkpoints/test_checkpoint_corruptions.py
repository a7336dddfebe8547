"""Checkpoints refused whole (issue #18): every corruption of
tests/checkpoint_corruptions.py (the table the C++ tests use too) is refused
by load_state_dict with an error naming the entry, and the optimizer or scaler
is exactly as it was: every tensor and group value, and the next step equals
an untouched twin's."""
import copy

import pytest
import torch

import checkpoint_corruptions as cc
from torchext.amp import GradScaler
from torchext.optim import ASGD


def _same(a, b) -> bool:
    """Nested equality: tensors by dtype, device, shape and value."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and (a.dtype, a.device, a.shape) == (b.dtype, b.device, b.shape)
                and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _asgd_snapshot(params, opt):
    return ([p.detach().clone() for p in params],
            {id_: copy.deepcopy(dict(st)) for id_, st in enumerate(
                opt.state.get(p, {}) for p in params)},
            [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
             for g in opt.param_groups],
            [[id(p) for p in g["params"]] for g in opt.param_groups])


@pytest.fixture(scope="module")
def good_asgd():
    params, opt = cc.asgd_problem()
    cc.train_asgd(params, opt, 3)
    return copy.deepcopy(opt.state_dict())


def _asgd_pair(good):
    """An optimizer loaded with the good checkpoint, and its untouched twin."""
    out = []
    for _ in range(2):
        params, opt = cc.asgd_problem(seed=5)
        opt.load_state_dict(copy.deepcopy(good))
        cc.train_asgd(params, opt, 1, seed=7)  # state tensors in use by a step
        out.append((params, opt))
    return out


@pytest.mark.parametrize("case", cc.ASGD_CASES, ids=lambda c: c.name)
def test_asgd_corruption_is_refused_whole(case, good_asgd):
    (params, opt), (tparams, twin) = _asgd_pair(good_asgd)
    before = _asgd_snapshot(params, opt)
    bad = case.apply(copy.deepcopy(good_asgd))
    with pytest.raises(Exception) as info:
        opt.load_state_dict(bad)
    msg = str(info.value)
    for s in case.names:
        assert s in msg, f"{case.name}: {s!r} not in the error: {msg}"
    assert _same(_asgd_snapshot(params, opt), before), case.name
    # and it still steps exactly as its twin
    cc.train_asgd(params, opt, 2, seed=9)
    cc.train_asgd(tparams, twin, 2, seed=9)
    assert _same(_asgd_snapshot(params, opt)[:3], _asgd_snapshot(tparams, twin)[:3]), case.name


@pytest.mark.parametrize("case", cc.ASGD_ALLOWED, ids=lambda c: c.name)
def test_asgd_allowed_changes_load(case, good_asgd):
    (params, opt), (tparams, twin) = _asgd_pair(good_asgd)
    sd = case.apply(copy.deepcopy(good_asgd))
    opt.load_state_dict(sd)
    twin.load_state_dict(copy.deepcopy(good_asgd))
    if case.name == "t0_per_param_valid":
        assert opt.param_groups[0]["t0_per_param"] == [2.0, 1.0]
        return
    cc.train_asgd(params, opt, 2, seed=9)
    cc.train_asgd(tparams, twin, 2, seed=9)
    for p, q in zip(params, tparams):
        assert torch.equal(p, q)
    if case.name == "extra_unknown_keys":  # kept, as torch keeps them
        assert opt.param_groups[1]["user_key"] == "kept"
    if case.name.startswith("t0_inf"):  # never averages: mu stays 1, ax follows the param
        p = params[0] if case.name.endswith("group0") else params[2]
        assert opt.state[p]["mu"].item() == 1.0 and torch.equal(opt.state[p]["ax"], p)


def test_asgd_good_checkpoint_loads_and_continues(good_asgd):
    (params, opt), _ = _asgd_pair(good_asgd)
    assert opt.state[params[2]]["step"].item() == 4


# ---- GradScaler ---------------------------------------------------------------

def _scaler_snapshot(s):
    return (s.state_dict(), None if s._scale is None else s._scale.clone(),
            None if s._growth_tracker is None else s._growth_tracker.clone(),
            None if s._hysteresis_tracker is None else s._hysteresis_tracker.clone(),
            s._init_hysteresis_tracker, s._init_skipped_steps,
            s._growth_factor, s._backoff_factor, s._growth_interval, s._hysteresis,
            s._min_scale, s._max_scale)


@pytest.fixture(scope="module")
def good_scaler():
    s = cc.scaler_problem()
    cc.train_scaler(s, 4)
    return s.state_dict()


@pytest.mark.parametrize("started", [False, True], ids=["before_scale", "after_scale"])
@pytest.mark.parametrize("case", cc.SCALER_CASES, ids=lambda c: c.name)
def test_scaler_corruption_is_refused_whole(case, started, good_scaler):
    pair = []
    for _ in range(2):
        s = cc.scaler_problem()
        s.load_state_dict(dict(good_scaler))
        if started:
            cc.train_scaler(s, 1, seed=3)
        pair.append(s)
    s, twin = pair
    before = _scaler_snapshot(s)
    bad = case.apply(copy.deepcopy(good_scaler))
    with pytest.raises(Exception) as info:
        s.load_state_dict(bad)
    msg = str(info.value)
    for n in case.names:
        assert n in msg, f"{case.name}: {n!r} not in the error: {msg}"
    assert _same(_scaler_snapshot(s), before), case.name
    cc.train_scaler(s, 3, seed=4)
    cc.train_scaler(twin, 3, seed=4)
    assert _same(_scaler_snapshot(s), _scaler_snapshot(twin))


@pytest.mark.parametrize("case", cc.SCALER_ALLOWED, ids=lambda c: c.name)
def test_scaler_allowed_changes_load(case, good_scaler):
    s = cc.scaler_problem()
    s.load_state_dict(case.apply(copy.deepcopy(good_scaler)))
    assert s.get_scale() == good_scaler["scale"]
    assert s._get_growth_tracker() == good_scaler["_growth_tracker"]
