"""The sync-free LR schedule recipe (the design note on device-side skips,
docs/frameworks.md): with ``capturable=True`` the scaler always calls
``step()`` and the step skips itself on the device, so a host-side
scheduler cannot know which steps ran. Counting them on the device and
computing the lr there from that count gives, with no host sync, exactly the
schedule of an eager loop that steps a torch scheduler only after steps that
ran."""
import torch

import torchext
from helpers import data, small_model
from helpers import NoHostSync

PEAK, WARMUP, TOTAL = 0.05, 4, 20
OVERFLOW = (1, 2, 9)  # iterations whose gradients hold an inf


def factor(t):
    """Linear warmup, then linear decay: a float for LambdaLR, a float64
    tensor for the device (the same operations, so the same bits)."""
    if isinstance(t, torch.Tensor):
        t = t.double()
        return torch.minimum((t + 1) / WARMUP, (TOTAL - t) / (TOTAL - WARMUP))
    return min((t + 1) / WARMUP, (TOTAL - t) / (TOTAL - WARMUP))


def iteration(model, opt, scaler, i):
    x, y = data()
    opt.zero_grad()
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    if i in OVERFLOW:
        next(model.parameters()).grad.view(-1)[0] = float("inf")


def test_device_clock_schedule_matches_host_schedule_without_a_sync():
    # eager: one host read per step; the scheduler steps only when the step ran
    m1 = small_model()
    o1 = torchext.optim.ASGD(m1.parameters(), lr=PEAK, t0=3)
    sched = torch.optim.lr_scheduler.LambdaLR(o1, factor)
    s1 = torchext.amp.GradScaler(init_scale=2.0**8, growth_interval=3)
    lrs1, skipped1 = [], []
    for i in range(TOTAL):
        iteration(m1, o1, s1, i)
        s1.step(o1)
        s1.update()
        skipped1.append(s1.was_step_skipped())
        if not skipped1[-1]:
            sched.step()
        lrs1.append(o1.param_groups[0]["lr"])

    # sync-free: the recipe
    m2 = small_model()
    lr = torch.tensor(PEAK * factor(0), dtype=torch.float64)
    o2 = torchext.optim.ASGD(m2.parameters(), lr=lr, t0=3, capturable=True)
    s2 = torchext.amp.GradScaler(init_scale=2.0**8, growth_interval=3)
    ran = torch.zeros((), dtype=torch.int64)  # steps that ran, counted on the device
    lrs2, skipped2 = [], []
    for i in range(TOTAL):
        iteration(m2, o2, s2, i)
        with NoHostSync():
            s2.step(o2)
            s2.update()
            ran += ~s2.last_step_skipped
            lr.copy_(PEAK * factor(ran))
        lrs2.append(lr.item())
        skipped2.append(bool(s2.last_step_skipped))

    assert skipped1 == skipped2 == [i in OVERFLOW for i in range(TOTAL)]
    assert lrs2 == lrs1  # bit for bit
    assert o2.param_groups[0]["lr"] is lr
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        for k in ("step", "eta", "mu", "ax"):
            assert torch.equal(o1.state[p1][k], o2.state[p2][k]), k
