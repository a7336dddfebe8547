"""Shared pieces of the framework integration tests (tests/integrations).

Each scenario trains a tiny model twice or three times, with the same seeds:

* ``("torch", "torch")``: ``torch.optim.ASGD`` + ``torch.amp.GradScaler``,
  the reference;
* ``("torchext", "torch")``: ``torchext.optim.ASGD`` + torch's scaler;
* ``("torchext", "torchext")``: ``torchext.optim.ASGD`` +
  ``torchext.amp.GradScaler``, where the framework takes a scaler;

and compares, bit for bit, what the framework shows: the losses, the LR it
schedules, its own skip flag, the scale, how many times ``optimizer.step()``
ran, and at the end the parameters, the optimizer state and the scaler state.
Overflows come from a poisoned batch (an inf in the inputs), at known steps.
"""
from __future__ import annotations

import importlib
import math
import struct

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchext
from helpers import NoHostSync  # noqa: F401  (re-exported for the framework tests)

#: (optimizer, scaler) of the runs compared with the reference.
RUNS = [("torchext", "torch"), ("torchext", "torchext")]
REFERENCE = ("torch", "torch")
#: A small scale that moves both ways within a few steps.
SCALER_KW = dict(init_scale=2.0**8, growth_interval=3)
ASGD_KW = dict(lr=0.05, t0=3)
INSTALL = "pip install torchext[integrations]"


@pytest.fixture(autouse=True)
def keep_torch_globals():
    """Imported by every test module here: leaves torch's global settings as
    it found them (frameworks set seeds, thread counts, ...)."""
    rng = torch.random.get_rng_state()
    saved = (torch.get_default_dtype(), torch.get_num_threads(),
             torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled())
    yield
    torch.random.set_rng_state(rng)
    torch.set_default_dtype(saved[0])
    torch.set_num_threads(saved[1])
    torch.set_float32_matmul_precision(saved[2])
    torch.use_deterministic_algorithms(saved[3])


def need(module: str):
    """Imports a framework, or skips the calling test module with the reason."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.skip(f"{module} is not installed ({e}); the integration tests need "
                    f"`{INSTALL}`", allow_module_level=True)


def optimizer(kind: str, params, **kw) -> torch.optim.Optimizer:
    cls = torch.optim.ASGD if kind == "torch" else torchext.optim.ASGD
    return cls(params, **{**ASGD_KW, **kw})


def scaler(kind: str, device: str = "cpu") -> torch.amp.GradScaler:
    if kind == "torch":
        return torch.amp.GradScaler(device, **SCALER_KW)
    return torchext.amp.GradScaler(device, **SCALER_KW)


def regression_data(n: int = 96, poison=(), seed: int = 0) -> torch.utils.data.TensorDataset:
    """x (n, 8), y (n, 1); an inf in each row listed in ``poison`` (its
    batch's gradients overflow)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = torch.randn(n, 1, generator=g)
    for row in poison:
        x[row, 3] = float("inf")
    return torch.utils.data.TensorDataset(x, y)


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


class StepCalls:
    """Counts the calls of ``optimizer.step()`` (a step post hook: it runs
    only when step() was really called)."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.n = 0
        self._taken = 0
        opt.register_step_post_hook(self._hook)

    def _hook(self, opt, args, kwargs) -> None:
        self.n += 1

    def take(self) -> int:
        """Calls since the last take()."""
        new, self._taken = self.n - self._taken, self.n
        return new


def bits(x):
    """A value made comparable bit for bit: floats and tensors by their bytes
    (every NaN alike), containers element by element."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        if t.is_floating_point():
            t = torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t)
        return (str(t.dtype), tuple(t.shape), t.reshape(-1).contiguous().view(torch.uint8).tolist()
                if t.numel() else [])
    if isinstance(x, float):
        return "nan" if math.isnan(x) else struct.pack("<d", x).hex()
    if isinstance(x, dict):
        return {k: bits(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [bits(v) for v in x]
    return x


def assert_same(got, ref, what: str = "") -> None:
    """Bit-identical, with the first difference in the message."""
    b_got, b_ref = bits(got), bits(ref)
    if b_got == b_ref:
        return
    if isinstance(got, (list, tuple)) and isinstance(ref, (list, tuple)):
        if len(got) != len(ref):
            raise AssertionError(f"{what}: {len(got)} entries vs {len(ref)}")
        for i, (a, b) in enumerate(zip(got, ref)):
            if bits(a) != bits(b):
                raise AssertionError(f"{what}[{i}]: {a!r} != reference {b!r}")
    if isinstance(got, dict) and isinstance(ref, dict):
        for k in ref:
            if bits(got.get(k)) != bits(ref[k]):
                raise AssertionError(f"{what}[{k!r}]: {got.get(k)!r} != reference {ref[k]!r}")
    raise AssertionError(f"{what}: {got!r} != reference {ref!r}")


def optimizer_state(opt: torch.optim.Optimizer) -> list:
    """step/eta/mu/ax of every parameter, in order, and each group's lr:
    the ASGD state both classes share (torchext's groups add ``fused``)."""
    sd = opt.state_dict()
    state = [{k: sd["state"][i][k] for k in ("step", "eta", "mu", "ax")}
             for i in sorted(sd["state"])]
    return [state, [g["lr"] for g in sd["param_groups"]]]


def scaler_state(sc) -> dict | None:
    """torch's scaler keys (torchext's state_dict starts with the same five)."""
    if sc is None:
        return None
    sd = sc.state_dict()
    return {k: sd[k] for k in ("scale", "growth_factor", "backoff_factor", "growth_interval",
                               "_growth_tracker")}


def assert_scale_moved_both_ways(record) -> None:
    """The scale backed off (an overflow) and grew (growth_interval clean steps)."""
    scales = [r["scale"] for r in record]
    pairs = list(zip(scales, scales[1:]))
    assert any(b < a for a, b in pairs) and any(b > a for a, b in pairs), scales


class RecordOps(TorchDispatchMode):
    """Records the name of every op dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))

    def host_reads(self) -> int:
        return sum(op in ("aten._local_scalar_dense.default", "aten.item.default")
                   for op in self.ops)


def params(model: torch.nn.Module) -> list:
    return [p.detach().clone() for p in model.parameters()]


#: Fields of a run's record and final state that torchext's fused clip may
#: change: the norm is a sum in another order (so the coefficient can differ
#: in its last bit), and torch's fused optimizers divide by one folded
#: factor, scale / coef, where torch's recipe rounds twice (unscale, then
#: multiply): a clipped gradient can differ by one fp32 rounding (about
#: 1.2e-7 relative; test_accelerate checks one step to that). Under fp16
#: autocast a later forward can then round an activation the other way
#: (fp16: 4.9e-4 relative), so over a run single elements drift further: the
#: HF Trainer's GPT-2 ends with one parameter 1.25e-6 apart (1e-4 of it) and
#: a norm 8.7e-6 relative apart. Everything else (skips, step() calls,
#: scale, LR) stays bit for bit.
CLOSE_FIELDS = ("loss", "norm", "params", "opt")
FOLD_RTOL, FOLD_ATOL = 1e-4, 1e-5


def _assert_close_values(got, ref, what: str) -> None:
    if isinstance(ref, torch.Tensor) and ref.is_floating_point():
        torch.testing.assert_close(got, ref, rtol=FOLD_RTOL, atol=FOLD_ATOL, equal_nan=True,
                                   msg=lambda m: f"{what}: {m}")
    elif isinstance(ref, float) and isinstance(got, float):
        if not (got == ref or (math.isnan(got) and math.isnan(ref))
                or math.isclose(got, ref, rel_tol=FOLD_RTOL, abs_tol=FOLD_ATOL)):
            raise AssertionError(f"{what}: {got!r} != reference {ref!r} within {FOLD_RTOL}")
    elif isinstance(ref, dict):
        assert isinstance(got, dict) and got.keys() == ref.keys(), what
        for k in ref:
            _assert_close_values(got[k], ref[k], f"{what}[{k!r}]")
    elif isinstance(ref, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(ref), what
        for i, (a, b) in enumerate(zip(got, ref)):
            _assert_close_values(a, b, f"{what}[{i}]")
    else:
        assert_same(got, ref, what)


def assert_close(got, ref, what: str = "") -> None:
    """:func:`assert_same`, except that the CLOSE_FIELDS of dicts (a step's
    record, the final state) may differ within FOLD_RTOL/FOLD_ATOL (NaN
    equal to NaN, inf to inf): for runs with torchext's fused clip."""
    if isinstance(ref, dict):
        assert isinstance(got, dict) and got.keys() == ref.keys(), f"{what}: keys"
        for k in ref:
            check = _assert_close_values if k in CLOSE_FIELDS else assert_close
            check(got[k], ref[k], f"{what}[{k!r}]")
    elif isinstance(ref, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(ref), f"{what}: length"
        for i, (a, b) in enumerate(zip(got, ref)):
            assert_close(a, b, f"{what}[{i}]")
    else:
        assert_same(got, ref, what)


class FusedClips:
    """Counts torchext's clips while active, the call each framework used:
    the two-call clips, ``torchext.amp.GradScaler.clip_grad_norm_``
    (``scaler``) and ``torchext.optim.ASGD.clip_grad_norm_`` made by
    anything but the scaler (``asgd``), and the folds, ``clip_and_step`` of
    the scaler (``scaler_fold``) and of ASGD (``asgd_fold``). A call made
    inside another counted call is not counted."""

    METHODS = ((torchext.amp.GradScaler, "clip_grad_norm_", "scaler"),
               (torchext.optim.ASGD, "clip_grad_norm_", "asgd"),
               (torchext.amp.GradScaler, "clip_and_step", "scaler_fold"),
               (torchext.optim.ASGD, "clip_and_step", "asgd_fold"))

    def __enter__(self):
        self.scaler = self.asgd = self.scaler_fold = self.asgd_fold = 0
        self._saved = []
        for cls, method, name in self.METHODS:
            original = cls.__dict__[method]
            self._saved.append((cls, method, original))

            def counted(obj, *args, _original=original, _name=name, **kwargs):
                outer = not getattr(self, "_inside", False)
                if outer:
                    setattr(self, _name, getattr(self, _name) + 1)
                self._inside = True
                try:
                    return _original(obj, *args, **kwargs)
                finally:
                    if outer:
                        self._inside = False

            setattr(cls, method, counted)
        return self

    def __exit__(self, *exc):
        for cls, method, original in self._saved:
            setattr(cls, method, original)
