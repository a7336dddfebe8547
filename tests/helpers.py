"""Shared helpers for the tests."""
import copy

import torch


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
