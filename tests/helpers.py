"""Shared helpers for the tests."""
import copy
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchext

# The checkout these tests come from (examples/, scripts/, csrc/),
# and the directory that holds the torchext under test: the same checkout for
# an in-place build, site-packages for an installed wheel (scripts/test_wheel.sh).
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(torchext.__file__)))
INSTALLED = not os.path.samefile(SRC, PKG_PARENT)
# scripts/test_wheel.sh runs the suite with no compiler reachable (torch.compile
# gets g++ by absolute path, see conftest.py), then the tests that build C++
# themselves with its C++ step.
NO_COMPILER = os.environ.get("TORCHEXT_TEST_NO_COMPILER") == "1"
_no_toolchain = pytest.mark.skipif(
    NO_COMPILER, reason="builds C++ (cmake + a compiler), and this run has no compiler "
    "reachable (TORCHEXT_TEST_NO_COMPILER=1): scripts/test_wheel.sh runs it in its C++ step")


def needs_toolchain(test):
    """A test that builds C++ itself: marked `toolchain` (test_wheel.sh's C++
    step selects them with -m toolchain) and skipped where no compiler is."""
    return pytest.mark.toolchain(_no_toolchain(test))


def needs_torch(feature):
    """Skips a test where the running torch lacks ``feature`` (a
    ``torchext._compile_compat.TorchFeature``), with the message torchext
    gives its users."""
    return pytest.mark.skipif(not feature.available(), reason=feature.message())


def subprocess_env(**extra):
    """os.environ for a Python subprocess that must import the torchext under
    test (run it with cwd=PKG_PARENT, never from the checkout of an installed
    run, whose torchext/ would shadow the installed one)."""
    path = os.pathsep.join(filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |a - e| / max |e|: relative error at the tensor's scale (robust to
    elements that pass through zero)."""
    actual = torch.view_as_real(actual) if actual.is_complex() else actual
    expected = torch.view_as_real(expected) if expected.is_complex() else expected
    a, e = actual.detach().double(), expected.detach().double()
    scale = e.abs().max().clamp_min(1e-30)
    return ((a - e).abs().max() / scale).item()


def small_model(dtype=torch.float32, seed=0, device="cpu"):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3)
    ).to(device=device, dtype=dtype)


def twin(model):
    return copy.deepcopy(model)


def data(dtype=torch.float32, seed=1, n=16, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    y = torch.randn(n, 3, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    return x, y


def train(model, opt, x, y, steps, sign=1.0, closure=False):
    """Runs `steps` optimizer steps on an MSE loss (times `sign`); returns losses."""
    losses = []
    for _ in range(steps):
        def loss_fn():
            opt.zero_grad()
            loss = sign * torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        if closure:
            losses.append(opt.step(loss_fn).item())
        else:
            losses.append(loss_fn().item())
            opt.step()
    return losses


def all_state(opt):
    """Every state tensor of an optimizer, in parameter order."""
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            for key in ("step", "eta", "mu", "ax"):
                if key in st:
                    out.append((key, st[key]))
    return out


class NoHostSync(TorchDispatchMode):
    """Fails on anything that reads a tensor value on the host."""
    BANNED = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default,
              torch.ops.aten.is_nonzero.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.BANNED:
            raise AssertionError(f"host sync: {func}")
        return func(*args, **(kwargs or {}))


# Methods of torch.amp.GradScaler that torchext's overrides, and why. A reason
# that starts with COMPILED_STEP means a compiled train step calls it (Dynamo
# skips torch/amp/grad_scaler.py: tests/compile/test_compile_compat.py checks each
# one); the others carry torchext's extensions. Everything else must be
# torch's own function (tests/amp/test_amp_dropin.py).
COMPILED_STEP = "compiled step"
SCALER_OVERRIDES = {
    "__init__": "hysteresis, clamps, allow_fp16, process_group",
    "_check_scale_growth_tracker": "compiled step",
    "_lazy_init_scale_growth_tracker": "compiled step; device inferred; extra trackers",
    "scale": "compiled step",
    "_unscale_grads_": "compiled step; torchext::unscale_, all-or-nothing",
    "unscale_": "compiled step",
    "step": "compiled step; fused-step protocol; no _maybe_opt_step",
    "update": "compiled step; update(optimizer); hysteresis and clamps",
    "_check_inf_per_device": "apex's capturable FusedAdam/FusedLAMB call it from "
                             "step(grad_scaler=...); a read-only check (torch's unscales by 1)",
    "state_dict": "torch's keys plus torchext's",
    "load_state_dict": "validated whole first, then torch's",
    "__getstate__": "torch's, plus torchext's trackers as numbers",
}


def amp_train_step(model, opt, scaler, x, y, device_type="cpu", dtype=torch.bfloat16,
                   clip=None, around_step=None):
    """The AMP loop people write, one iteration: zero_grad, an autocast
    forward, scaled backward, step (with ``clip``: clip_and_step, the clip
    folded into the step in one call), update. Returns the
    loss, detached. ``around_step``: a context manager around step and
    update (NoHostSync, sync-debug modes). The compile tests trace it whole
    (test_compile.make_train_step) or call it around a compiled model
    (test_compiled_model.train). scripts/wheel_smoke.py keeps its own copy:
    it runs against installed wheels, without this folder."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = torch.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    step = ((lambda: scaler.step(opt)) if clip is None
            else (lambda: scaler.clip_and_step(opt, clip)))
    if around_step is None:
        step()
        scaler.update()
    else:
        with around_step:
            step()
            scaler.update()
    return loss.detach()

