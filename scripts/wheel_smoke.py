"""A short training run with the installed torchext wheel, against torch's
classes (scripts/test_pythons.sh runs it on every Python): the same steps,
an overflow skipped, the same bits. Prints one line and exits 0 when all
agree."""
import copy
import sys

import torch

import torchext


def train(model, opt, scaler, data):
    for x, y in data:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    twin = copy.deepcopy(model)
    data = [(torch.randn(32, 8), torch.randn(32, 1)) for _ in range(12)]
    data[5][0][0, 0] = float("inf")  # an overflow: both skip this step
    hp = dict(lr=0.05, lambd=1e-4, alpha=0.75, t0=4, weight_decay=1e-4)
    ref = (torch.optim.ASGD(model.parameters(), foreach=False, **hp),
           torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3))
    ours = (torchext.optim.ASGD(twin.parameters(), **hp),
            torchext.amp.GradScaler(init_scale=2.0**8, growth_interval=3))
    train(model, *ref, data)
    train(twin, *ours, data)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q), "params differ from torch's"
        for k in ("step", "eta", "mu", "ax"):
            assert torch.equal(ref[0].state[p][k], ours[0].state[q][k]), k
    assert ref[1].get_scale() == ours[1].get_scale() and ours[1].num_skipped_steps() == 1
    print(f"wheel smoke test: Python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"torchext {torchext.__version__}: 12 steps, 1 skipped, bit for bit with torch")


if __name__ == "__main__":
    main()
