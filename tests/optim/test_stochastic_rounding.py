"""ASGD's stochastic rounding of fp16/bf16 parameters (issue 47):
``ASGD(..., stochastic_rounding=True, rounding_seed=S)``.

The contract (csrc/include/torchext/elementwise_math.h, "Stochastic
rounding"; docs/optimizer.md): the new value, computed in float32, is rounded
up (away from zero) with probability (|x| - lo) / (hi - lo), with 32 random
bits per element from a counter-based hash of the seed, the param's identity
(group << 32 | index), the step being taken and the element's index in the
full tensor. The tests pin that contract against a pure-Python model of it
(the bits and the rounding, bit for bit), check the expectation with 4M
draws, the edges (fp16 subnormals, overflow, inf, NaN), determinism, the
optimizer's paths (holder, lists, compiled, checkpoints), and the pinned
training experiment: a bf16 last iterate within 2% of fp32's.
"""
import copy
import io
import math

import pytest
import torch

import torchext
from helpers import needs_torch
from torchext._compile_compat import COMPILED_STEP
from torchext.optim import ASGD

M64, M32 = 2**64 - 1, 2**32 - 1
OP = torch.ops.torchext.asgd_.packed


# ------------------------------------------------- the contract, in Python

def _mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _hash32(x):
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def _bits(seed, ident, step, index):
    """The 16 random bits of one element: elements 2m and 2m+1 take the low
    and the high half of one hash of the pair index m."""
    stream = _mix64(_mix64(seed & M64) ^ (ident & M64))
    key = _mix64((stream + _mix64(step)) & M64)
    pair = index >> 1
    h = _hash32((pair & M32) ^ (key & M32))
    h = _hash32(h ^ (((key >> 32) + (pair >> 32)) & M32))
    return h >> 16 if index & 1 else h & 0xFFFF


_NMANT = {torch.bfloat16: 7, torch.float16: 10}  # stored mantissa bits


def _round(x: float, r: int, dtype) -> float:
    """x (a float32 value) rounded by the contract: down to lo = x rounded
    toward zero in dtype, up to the next value away from zero with
    probability (|x| - lo) / ulp, decided by the 16 bits r."""
    info = torch.finfo(dtype)
    if math.isnan(x) or math.isinf(x):
        return x
    a = abs(x)
    if dtype == torch.float16 and a >= 65536:
        return math.copysign(math.inf, x)
    if dtype == torch.float16 and a < 2.0**-14:
        # subnormals: through float32's |x| + 2**-14, rounded as a normal
        # value (ulp 2**-24), then the 2**-14 taken off
        y = (torch.tensor(a, dtype=torch.float32) + 2.0**-14).item()
        return math.copysign(_round(y, r, dtype) - 2.0**-14, x)
    # the spacing at a: fp16's subnormal step below its smallest normal
    e = max(math.frexp(a)[1] - 1, -14 if dtype == torch.float16 else -126) if a else (
        -14 if dtype == torch.float16 else -126)
    ulp = 2.0 ** (e - _NMANT[dtype])
    lo = math.floor(a / ulp) * ulp
    frac = (a - lo) / ulp
    if dtype == torch.bfloat16:
        up = r >= 2**16 - round(frac * 2**16) if frac else False
    else:
        up = (r >> 3) >= 2**13 - round(frac * 2**13) if frac else False
    v = lo + ulp if up else lo
    if v > info.max:
        v = math.inf
    return math.copysign(v, x)


def _step_op(p, g, *, scale=1.0, step=0.0, seed=0, ids=None, offsets=None, ax=None):
    """One asgd_ step with lambd 0 and eta 1, so that the new value is
    p - g / scale in float32 (two rounded operations, reproduced below)."""
    ax = torch.zeros(p.shape) if ax is None else ax
    OP([p], [g], [ax], torch.ones(1), torch.ones(1), torch.full((1,), float(step)),
       lr=torch.tensor(1.0, dtype=torch.float64), lambd=0.0, alpha=0.75, t0=1e6,
       weight_decay=0.0, maximize=False, grad_scale=torch.tensor(float(scale)),
       rounding_seed=seed, rounding_ids=ids, rounding_offsets=offsets)
    return p


def _target(p, g, scale):
    inv = torch.tensor(1.0 / scale, dtype=torch.float64).float()
    return p.float() - g.float() * inv


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_bits_and_the_rounding_follow_the_contract(dtype):
    """The op's results equal the contract computed in pure Python, element
    by element: the key (seed, id, step + 1, offset + index) and the
    rounding of each float32 value, normals and (fp16) subnormals."""
    g = torch.Generator().manual_seed(3)
    n = 300
    p = (torch.randn(n, generator=g) * torch.logspace(-6, 2, n)).to(dtype)
    grad = (torch.randn(n, generator=g)).to(dtype)
    scale = 2.0**13 if dtype == torch.float16 else 2.0**9
    if dtype == torch.float16:
        p[:40] = (torch.randn(40, generator=g) * 2**-16).to(dtype)  # subnormals
        grad[:40] = torch.randn(40, generator=g).to(dtype)
        scale = 2.0**20
    x = _target(p, grad, scale)
    out = _step_op(p.clone(), grad, scale=scale, step=41, seed=12345, ids=[(3 << 32) | 7],
                   offsets=[2**33 + 5])
    want = [_round(float(v), _bits(12345, (3 << 32) | 7, 42, 2**33 + 5 + i), dtype)
            for i, v in enumerate(x.tolist())]
    assert out.float().tolist() == want
    # and the stored values are neighbours of x, not all rounded to nearest
    assert not torch.equal(out, x.to(dtype))


@pytest.mark.parametrize("dtype,frac_bits", [(torch.bfloat16, 16), (torch.float16, 13)])
@pytest.mark.parametrize("frac", [1, 77, 0.5, -1])
def test_the_expectation_is_the_value(dtype, frac_bits, frac):
    """4M draws of one value: their mean is the value within 4 sigma, and
    sigma <= 0.5 ulp / 2000 = 2.5e-4 ulp (a 1e-3 ulp test)."""
    n = 4 * 1024 * 1024
    # (-1: the largest fraction whose k is exact in both dtypes, 255 / 256)
    k = {0.5: 2 ** (frac_bits - 1), -1: 255 * 2 ** (frac_bits - 8)}.get(frac, frac)
    # p = 1, g = -k, scale 2**(frac_bits + nmant): x = 1 + k ulp / 2**frac_bits
    nmant = _NMANT[dtype]
    p = torch.ones(n, dtype=dtype)
    grad = torch.full((n,), -float(k), dtype=dtype)
    out = _step_op(p, grad, scale=2.0 ** (frac_bits + nmant), seed=99)
    ulps = (out.double() - 1.0) * 2.0**nmant
    want = k / 2**frac_bits
    sigma = math.sqrt(want * (1 - want) / n)
    assert abs(ulps.mean().item() - want) <= 4 * sigma + 1e-12
    assert set(ulps.unique().tolist()) <= {0.0, 1.0}


def test_fp16_subnormals_and_overflow():
    n = 4 * 1024 * 1024
    zeros = torch.zeros(n, dtype=torch.float16)
    # 3 * 2**-26 = 0.75 of fp16's smallest subnormal: up 3/4 of the time
    out = _step_op(zeros.clone(), torch.full((n,), -3.0, dtype=torch.float16), scale=2.0**26)
    hits = (out.double() / 2.0**-24)
    assert set(hits.unique().tolist()) == {0.0, 1.0}
    assert abs(hits.mean().item() - 0.75) <= 4 * math.sqrt(0.75 * 0.25 / n)
    # 2**-37: 2**-13 of a step, rounded up in about 512 of 4M draws
    out = _step_op(zeros.clone(), torch.full((n,), -1.0, dtype=torch.float16), scale=2.0**37)
    ups = int((out != 0).sum())
    assert abs(ups - n * 2.0**-13) <= 4 * math.sqrt(n * 2.0**-13) + 1
    # the negative side rounds away from zero alike
    out = _step_op(zeros.clone(), torch.full((n,), 3.0, dtype=torch.float16), scale=2.0**26)
    assert abs((out.double() / -(2.0**-24)).mean().item() - 0.75) <= 4 * math.sqrt(0.75 * 0.25 / n)
    # 65504 + 8: inf with probability 8/32 (the next value fp16's ulp there would give)
    top = torch.full((n,), 65504.0, dtype=torch.float16)
    out = _step_op(top.clone(), torch.full((n,), -8.0, dtype=torch.float16))
    infs = torch.isinf(out).double().mean().item()
    assert set(out[~torch.isinf(out)].unique().tolist()) == {65504.0}
    assert abs(infs - 0.25) <= 4 * math.sqrt(0.25 * 0.75 / n)
    # past 65536: inf; inf and NaN stay
    small = 1024
    out = _step_op(torch.full((small,), 65504.0, dtype=torch.float16),
                   torch.full((small,), -64.0, dtype=torch.float16))
    assert torch.isinf(out).all() and (out > 0).all()
    p = torch.tensor([math.inf, -math.inf, math.nan, 1.0], dtype=torch.float16)
    out = _step_op(p, torch.zeros(4, dtype=torch.float16))
    assert out[0] == math.inf and out[1] == -math.inf and torch.isnan(out[2]) and out[3] == 1


def test_bf16_overflow_and_specials():
    n = 1 << 20
    big = torch.full((n,), torch.finfo(torch.bfloat16).max, dtype=torch.bfloat16)
    # max + half its ulp (2**119): inf half of the time
    out = _step_op(big, torch.full((n,), -(2.0**119), dtype=torch.bfloat16))
    assert abs(torch.isinf(out).double().mean().item() - 0.5) <= 4 * math.sqrt(0.25 / n)
    p = torch.tensor([math.inf, -math.inf, math.nan, -2.0], dtype=torch.bfloat16)
    out = _step_op(p, torch.zeros(4, dtype=torch.bfloat16))
    assert out[0] == math.inf and out[1] == -math.inf and torch.isnan(out[2]) and out[3] == -2


def _noisy(dtype=torch.bfloat16, n=4096):
    g = torch.Generator().manual_seed(5)
    return (torch.randn(n, generator=g).to(dtype), (torch.randn(n, generator=g) * 1e-3).to(dtype))


def test_determinism_and_what_keys_the_bits():
    """Same seed, id, step, index: the same bits; any of them changed:
    other bits. Splitting a tensor into parts with their offsets (a shard)
    rounds every element as the whole tensor does."""
    p, g = _noisy()
    run = lambda **kw: _step_op(p.clone(), g, scale=1.0, **kw)  # noqa: E731
    base = run(seed=1, step=3)
    assert torch.equal(base, run(seed=1, step=3))
    for other in (dict(seed=2, step=3), dict(seed=1, step=4), dict(seed=1, step=3, ids=[1]),
                  dict(seed=1, step=3, offsets=[1])):
        assert not torch.equal(base, run(**other)), other
    # two shards with their offsets == the whole tensor
    halves = [p[:1000].clone(), p[1000:].clone()]
    OP(halves, [g[:1000], g[1000:]], [torch.zeros(1000), torch.zeros(p.numel() - 1000)],
       torch.ones(2), torch.ones(2), torch.full((2,), 3.0),
       lr=torch.tensor(1.0, dtype=torch.float64), lambd=0.0, alpha=0.75, t0=1e6,
       weight_decay=0.0, maximize=False, grad_scale=torch.tensor(1.0),
       rounding_seed=1, rounding_ids=[0, 0], rounding_offsets=[0, 1000])
    assert torch.equal(torch.cat(halves), base)


def test_float32_and_wider_ignore_the_flag():
    for dtype in (torch.float32, torch.float64, torch.complex64):
        p = torch.randn(64, dtype=dtype)
        g = torch.randn(64, dtype=dtype) * 1e-3
        a = p.clone()
        b = p.clone()
        for t, kw in ((a, {}), (b, dict(rounding_seed=7))):
            ax = torch.zeros_like(t)
            OP([t], [g], [ax], torch.ones(1), torch.full((1,), 0.1), torch.zeros(1),
               lr=torch.tensor(0.1, dtype=torch.float64), lambd=1e-4, alpha=0.75, t0=1e6,
               weight_decay=0.0, maximize=False, **kw)
        assert torch.equal(a, b), dtype


def test_bad_rounding_arguments_are_refused_before_anything_changes():
    p, g = _noisy(n=8)
    before = p.clone()
    for kw, msg in ((dict(rounding_seed=1, rounding_ids=[1, 2]), "rounding_ids"),
                    (dict(rounding_seed=1, rounding_offsets=[-1]), "rounding_offsets"),
                    (dict(rounding_ids=[1]), "need rounding_seed")):
        with pytest.raises(ValueError, match=msg):
            OP([p], [g], [torch.zeros(8)], torch.ones(1), torch.ones(1), torch.zeros(1),
               lr=torch.tensor(1.0, dtype=torch.float64), lambd=0.0, alpha=0.75, t0=1e6,
               weight_decay=0.0, maximize=False, **kw)
        assert torch.equal(p, before)


def test_opcheck():
    p, g = _noisy(n=37)
    for packed in (False, True):
        for kw in (dict(rounding_seed=3), dict(rounding_seed=-5, rounding_ids=[2**40],
                                               rounding_offsets=[11])):
            if packed:
                op, state = OP, (torch.ones(1), torch.full((1,), 0.1), torch.zeros(1))
            else:
                op = torch.ops.torchext.asgd_.default
                state = ([torch.ones(())], [torch.full((), 0.1)], [torch.zeros(())])
            torch.library.opcheck(op, ([p.clone()], [g], [torch.zeros(37)], *state), dict(
                lr=torch.tensor(0.1, dtype=torch.float64), lambd=1e-4, alpha=0.75, t0=1.0,
                weight_decay=0.0, maximize=False, **kw))


# --------------------------------------------------------- the optimizer

def _model(dtype=torch.bfloat16):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 4)).to(dtype)


def _grads(model, k):
    g = torch.Generator().manual_seed(100 + k)
    for p in model.parameters():
        p.grad = (torch.randn(p.shape, generator=g) * 1e-3).to(p.dtype)


def _train(model, opt, steps, start=0, step=None):
    for k in range(start, start + steps):
        _grads(model, k)
        (step or opt.step)()
    return [p.detach().clone() for p in model.parameters()]


def test_the_optimizer_keys_params_by_group_and_index():
    """ASGD's bits: the group's seed, id (group << 32 | index), the step
    being taken; one step checked against the contract for every param of
    two groups (one on the holder path)."""
    model = _model()
    params = list(model.parameters())
    opt = ASGD([{"params": params[:2]}, {"params": params[2:]}], lr=0.5, lambd=0.0, t0=1e6,
               stochastic_rounding=True, rounding_seed=2**62 + 3)
    _train(model, opt, 2)
    before = [p.detach().clone() for p in params]
    _grads(model, 2)
    grads = [p.grad.clone() for p in params]
    opt.step()
    pos = [(0, 0), (0, 1), (1, 0), (1, 1)]
    for (gi, i), p, b, g in zip(pos, params, before, grads):
        # eta = 0.5 (lambd 0): x = p + g * -0.5 fused: both rounding-free here
        x = (b.float() - g.float() * 0.5).flatten().tolist()
        want = [_round(v, _bits(2**62 + 3, (gi << 32) | i, 3, j), torch.bfloat16)
                for j, v in enumerate(x)]
        assert p.detach().float().flatten().tolist() == want, (gi, i)


def _run_holder_or_compiled(compiled, drop):
    model = _model()
    opt = ASGD(model.parameters(), lr=0.05, t0=3, stochastic_rounding=True, rounding_seed=9)
    step = torch.compile(opt.step, fullgraph=True, backend="eager") if compiled else opt.step
    for k in range(5):
        _grads(model, k)
        if drop:
            list(model.parameters())[1].grad = None
        step()
    params = list(model.parameters())
    return ([p.detach().clone() for p in params],
            [opt.state[p]["ax"].clone() for p in params if p in opt.state])


def test_a_params_bits_do_not_depend_on_another_stepping():
    """A param without a grad leaves the others' keys alone: the eager step
    then takes the lists path with a subset of the group, keyed by places
    in the group, not in the lists."""
    full, dropped = _run_holder_or_compiled(False, False), _run_holder_or_compiled(False, True)
    assert all(torch.equal(full[0][k], dropped[0][k]) for k in (0, 2, 3))
    assert not torch.equal(full[0][1], dropped[0][1])


@needs_torch(COMPILED_STEP)
def test_holder_lists_and_compiled_steps_round_alike():
    """The eager holder path and a compiled step (the lists path) give the
    same bits, also when a param has no grad (the lists then hold a subset
    of the group, keyed by their places in the group, not in the lists)."""
    for drop in (False, True):
        eager, compiled = _run_holder_or_compiled(False, drop), _run_holder_or_compiled(True, drop)
        for a, b in zip(eager[0] + eager[1], compiled[0] + compiled[1]):
            assert torch.equal(a, b), drop


def test_checkpoints_carry_the_seed_and_resume_the_same_bits():
    def fresh(**kw):
        model = _model()
        return model, ASGD(model.parameters(), lr=0.05, t0=3, **kw)

    model, opt = fresh(stochastic_rounding=True, rounding_seed=11)
    straight = _train(model, opt, 8)
    model, opt = fresh(stochastic_rounding=True, rounding_seed=11)
    _train(model, opt, 4)
    buf = io.BytesIO()
    torch.save({"m": model.state_dict(), "o": opt.state_dict()}, buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    assert sd["o"]["param_groups"][0]["rounding_seed"] == 11
    assert sd["o"]["param_groups"][0]["stochastic_rounding"] is True
    # a fresh optimizer with other settings: the checkpoint's win
    model2, opt2 = fresh()
    model2.load_state_dict(sd["m"])
    opt2.load_state_dict(sd["o"])
    assert opt2.param_groups[0]["rounding_seed"] == 11
    resumed = _train(model2, opt2, 4, start=4)
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))
    # torch's ASGD loads it (the extra keys are kept, unused)
    tmodel = _model()
    topt = torch.optim.ASGD(tmodel.parameters(), lr=0.05, t0=3)
    topt.load_state_dict(sd["o"])
    # a checkpoint without the keys (torch's, older torchext): the constructor's stay
    old = copy.deepcopy(sd["o"])
    for g in old["param_groups"]:
        del g["stochastic_rounding"], g["rounding_seed"]
    model3, opt3 = fresh(stochastic_rounding=True, rounding_seed=11)
    model3.load_state_dict(sd["m"])
    opt3.load_state_dict(old)
    assert opt3.param_groups[0]["stochastic_rounding"] is True
    assert opt3.param_groups[0]["rounding_seed"] == 11
    assert all(torch.equal(a, b) for a, b in zip(straight, _train(model3, opt3, 4, start=4)))


def test_bad_settings_are_refused():
    p = [torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))]
    for kw, msg in ((dict(stochastic_rounding=1), "must be a bool"),
                    (dict(stochastic_rounding=True, rounding_seed=1.5), "must be an int"),
                    (dict(stochastic_rounding=True, rounding_seed=2**63), "must be an int"),
                    (dict(stochastic_rounding=True, fused=False), "fused=False"),
                    (dict(stochastic_rounding=True, differentiable=True), "differentiable")):
        with pytest.raises(ValueError, match=msg):
            ASGD(p, **kw)
    opt = ASGD(p)
    with pytest.raises(ValueError, match="fused=False"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))],
                             "stochastic_rounding": True, "fused": False})
    assert len(opt.param_groups) == 1
    sd = opt.state_dict()
    sd["param_groups"][0]["rounding_seed"] = "x"
    with pytest.raises(ValueError, match="rounding_seed"):
        opt.load_state_dict(sd)
    # turned on later by hand, on a group whose step then takes the unfused path
    opt.param_groups[0]["fused"] = False
    opt.param_groups[0]["stochastic_rounding"] = True
    p[0].grad = torch.ones(3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="unfused path"):
        opt.step()
    assert not opt.state  # nothing created, nothing stepped
    assert torch.equal(p[0].detach(), torch.zeros(3, dtype=torch.bfloat16))


def test_the_flag_changed_between_steps_takes_effect():
    model = _model()
    opt = ASGD(model.parameters(), lr=0.05, t0=3)
    _train(model, opt, 2)
    ref = copy.deepcopy(model)
    ref_opt = ASGD(ref.parameters(), lr=0.05, t0=3)
    ref_opt.load_state_dict(opt.state_dict())
    for g in opt.param_groups:
        g["stochastic_rounding"] = True
    a = _train(model, opt, 3, start=2)
    b = _train(ref, ref_opt, 3, start=2)
    assert not all(torch.equal(x, y) for x, y in zip(a, b))


# ------------------------------------------------- the pinned experiment

@pytest.mark.experiment
def test_bf16_training_with_stochastic_rounding_comes_within_2_percent_of_fp32():
    """The issue's experiment (tests/optim/test_low_precision.py's task,
    model, data and seeds): the bf16 last iterate's validation loss with
    stochastic rounding within 2% of the fp32 run's (round to nearest: 8.5%
    worse on this run)."""
    import test_low_precision as lp  # (tests/optim: on sys.path under pytest)
    task = lp._task()
    xv, yv = task[2], task[3]
    fp32, _, _ = lp._train(torch.float32, task)
    sr, _, _ = lp._train(torch.bfloat16, task, stochastic_rounding=True)
    loss32 = lp._val_loss(fp32, list(fp32.parameters()), xv, yv)
    loss_sr = lp._val_loss(sr, list(sr.parameters()), xv, yv)
    assert loss_sr <= 1.02 * loss32, (loss_sr, loss32)
