"""TorchScript never drops a torchext op call: a scripted step whose mutated
lists are not used afterwards still updates its tensors (csrc/ops/schemas.cpp says
why the mutated lists are declared `Tensor(x! -> *)[]`)."""
import io
import warnings
from typing import List

import pytest
import torch

import torchext  # noqa: F401  (registers torch.ops.torchext.*)

ops = torch.ops.torchext
KW = dict(lr=0.05, lambd=1e-3, alpha=0.75, t0=2.0, weight_decay=1e-2, maximize=False)
LR = torch.tensor(KW["lr"], dtype=torch.float64)  # the op's lr is a 1-element tensor


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():  # TorchScript is deprecated upstream
        warnings.simplefilter("ignore")
        yield


def test_every_mutated_list_is_declared_so_torchscript_keeps_the_call():
    checked = 0
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("torchext::"):
            continue
        text = str(schema)
        for arg in schema.arguments:
            info = arg.alias_info
            if info is None or not info.is_write or not isinstance(arg.type, torch.ListType):
                continue
            checked += 1
            # Without the wildcard after-set, TorchScript's alias analysis
            # sees only a write to the list value, and DCE drops the call.
            # (The set sits on the list's element type, which Python's
            # AliasInfo does not expose: read it from the schema text.)
            assert f"! -> *)[] {arg.name}" in text, \
                f"{schema.name}: {arg.name} must be declared Tensor(x! -> *)[]"
    assert checked == 10  # asgd_ (5 lists), asgd_.packed (2), unscale_ (1), swap_ (2)


class ASGDStep(torch.nn.Module):
    """A training step whose asgd_ lists are built in place and never read
    afterwards: before the fix, TorchScript's DCE removed the call."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 3)
        for name, p in self.lin.named_parameters():
            self.register_buffer(f"ax_{name}", torch.zeros_like(p))
            self.register_buffer(f"mu_{name}", torch.ones(()))
            self.register_buffer(f"eta_{name}", torch.full((), KW["lr"]))
            self.register_buffer(f"step_{name}", torch.zeros(()))
        self.register_buffer("lr", LR.clone())

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = (self.lin(x) - y).pow(2).mean()
        grads = torch.autograd.grad([loss], [self.lin.weight, self.lin.bias])
        gs: List[torch.Tensor] = []
        for g in grads:
            assert g is not None
            gs.append(g)
        with torch.no_grad():
            torch.ops.torchext.asgd_(
                [self.lin.weight, self.lin.bias], gs, [self.ax_weight, self.ax_bias],
                [self.mu_weight, self.mu_bias], [self.eta_weight, self.eta_bias],
                [self.step_weight, self.step_bias], lr=self.lr, lambd=1e-3, alpha=0.75,
                t0=2.0, weight_decay=1e-2, maximize=False)
        return loss.detach()


def _run(module, steps=6):
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        module(torch.randn(8, 4, generator=gen), torch.randn(8, 3, generator=gen))
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_scripted_module_with_unused_lists_still_steps():
    eager = _run(ASGDStep())
    scripted_module = torch.jit.script(ASGDStep())
    assert "torchext::asgd_" in str(scripted_module.forward.graph)
    scripted = _run(scripted_module)  # the profiling executor optimizes after a few runs
    assert eager["step_weight"].item() == 6
    for name, want in eager.items():
        assert torch.equal(scripted[name], want), name
    # Also after a save/load round trip (what a C++ program runs).
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(ASGDStep()), buf)
    buf.seek(0)
    loaded = _run(torch.jit.load(buf))
    for name, want in eager.items():
        assert torch.equal(loaded[name], want), name


def test_scripted_function_with_a_list_built_at_the_call_site():
    @torch.jit.script
    def unscale(g: torch.Tensor, found_inf: torch.Tensor, inv_scale: torch.Tensor):
        torch.ops.torchext.unscale_([g], found_inf, inv_scale)

    @torch.jit.script
    def step(p: torch.Tensor, g: torch.Tensor, ax: torch.Tensor, mu: torch.Tensor,
             eta: torch.Tensor, s: torch.Tensor, lr: torch.Tensor):
        torch.ops.torchext.asgd_([p], [g], [ax], [mu], [eta], [s], lr=lr,
                                 lambd=1e-3, alpha=0.75, t0=2.0, weight_decay=1e-2,
                                 maximize=False)

    gen = torch.Generator().manual_seed(2)
    p0, g0 = torch.randn(5, generator=gen), torch.randn(5, generator=gen)
    state0 = [torch.zeros(5), torch.ones(()), torch.full((), 0.05), torch.zeros(())]
    p, (ax, mu, eta, s) = p0.clone(), [t.clone() for t in state0]
    pe, (axe, mue, etae, se) = p0.clone(), [t.clone() for t in state0]
    lr = torch.tensor(0.05)
    for _ in range(5):
        step(p, g0, ax, mu, eta, s, lr)
        ops.asgd_([pe], [g0], [axe], [mue], [etae], [se], lr=lr, lambd=1e-3,
                  alpha=0.75, t0=2.0, weight_decay=1e-2, maximize=False)
    assert s.item() == 5
    for got, want in ((p, pe), (ax, axe), (mu, mue), (eta, etae), (s, se)):
        assert torch.equal(got, want)

    g = torch.tensor([2.0, float("inf")])
    found = torch.zeros(())
    for _ in range(3):
        unscale(g, found, torch.tensor(0.5))
    assert g[0].item() == 0.25 and found.item() == 1.0
