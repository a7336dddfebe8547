"""HF accelerate: torchext's ASGD (with accelerate's own scaler, or with
torchext's through ``torchext.integrations.accelerate.use_torchext_scaler``)
against torch.optim.ASGD + torch's scaler, bit for bit; where
``accelerator.clip_grad_norm_`` became torchext's fused clip, bit for bit
but for the losses, norms, parameters and ASGD state, within
``fw_common.FOLD_RTOL`` (one fp32 rounding per gradient).

On the CPU accelerate builds no scaler and no autocast for fp16;
``fp16_accelerator`` does what accelerate does on a GPU (autocast + its
``get_grad_scaler``), so the scenarios run here as they would there.
"""
import contextlib
import math

import pytest
import torch

from fw_common import keep_torch_globals  # noqa: F401 (autouse)
from fw_common import (REFERENCE, RUNS, SCALER_KW, FusedClips, NoHostSync, RecordOps,
                       StepCalls, assert_close, assert_same, assert_scale_moved_both_ways, mlp,
                       need, optimizer, optimizer_state, params, regression_data, scaler_state)

accelerate = need("accelerate")
from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from accelerate.utils import DistributedType, GradScalerKwargs, get_grad_scaler  # noqa: E402

import torchext  # noqa: E402
from torchext.integrations.accelerate import use_torchext_scaler  # noqa: E402

POISON = (17, 44)  # rows: batch 2 of each epoch and batch 5 (batch size 8)


@pytest.fixture(autouse=True)
def fresh_state():
    # accelerate's state is process-wide (one Accelerator per process).
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def make_accelerator(mixed_precision, scaler_kind=None, accum=1):
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    acc = Accelerator(mixed_precision=mixed_precision, cpu=True, gradient_accumulation_steps=accum,
                      kwargs_handlers=[GradScalerKwargs(**SCALER_KW)])
    if mixed_precision == "fp16":
        assert acc.scaler is None  # accelerate on the CPU; on a GPU it does this:
        acc.native_amp = True
        acc.scaler = get_grad_scaler(acc.distributed_type, **acc.scaler_handler.to_kwargs())
        if scaler_kind == "torchext":
            assert isinstance(use_torchext_scaler(acc), torchext.amp.GradScaler)
    return acc


def train(opt_kind, scaler_kind, *, mixed_precision="fp16", clip=1.0, accum=1, epochs=2,
          poison=POISON, checkpoint=None, resume=None):
    """A training loop as accelerate's examples write it. ``checkpoint``:
    save_state there after the first epoch; ``resume``: load_state from
    there and run the remaining epochs. Returns the record of each step,
    the final state and how many fused clips ran."""
    acc = make_accelerator(mixed_precision, scaler_kind, accum)
    model = mlp()
    opt = optimizer(opt_kind, model.parameters())
    calls = StepCalls(opt)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
    dl = torch.utils.data.DataLoader(regression_data(poison=poison), batch_size=8)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
    first = 0
    if resume is not None:
        acc.load_state(resume)
        first = 1
    record = []
    with FusedClips() as fused:
        for epoch in range(first, epochs):
            for x, y in dl:
                with acc.accumulate(model):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    acc.backward(loss)
                    norm = None
                    if clip is not None and acc.sync_gradients:
                        norm = acc.clip_grad_norm_(model.parameters(), clip).item()
                    opt.step()
                    sched.step()
                    opt.zero_grad()
                record.append(dict(
                    loss=loss.item(), norm=norm, skipped=acc.optimizer_step_was_skipped,
                    opt_skipped=opt.step_was_skipped, lr=sched.get_last_lr()[0],
                    scale=None if acc.scaler is None else acc.scaler.get_scale(),
                    calls=calls.take()))
            if checkpoint is not None and epoch == 0:
                acc.save_state(checkpoint)
    final = dict(params=params(model), opt=optimizer_state(opt), scaler=scaler_state(acc.scaler),
                 sched=sched.state_dict()["last_epoch"])
    return record, final, fused.scaler


def check(got, ref):
    """Bit for bit; within FOLD_RTOL where the fused clip ran."""
    compare = assert_close if got[2] else assert_same
    compare(got[0], ref[0], "per step")
    compare(got[1], ref[1], "final state")


def clips(record):
    return sum(r["norm"] is not None for r in record)


def test_bf16_clip():
    """bf16 (no scaler): prepare, backward, clip_grad_norm_, step."""
    ref = train(*REFERENCE, mixed_precision="bf16", poison=())
    check(train("torchext", None, mixed_precision="bf16", poison=()), ref)
    assert [r["calls"] for r in ref[0]] == [1] * len(ref[0])


@pytest.mark.parametrize("clip,accum", [(1.0, 1), (None, 1), (1.0, 2)],
                         ids=["clip", "noclip", "clip-accumulate2"])
@pytest.mark.parametrize("run", RUNS, ids="-".join)
def test_fp16_scaler_overflow_skips_like_torch(run, clip, accum):
    """fp16 + scaler, an overflow: optimizer_step_was_skipped, the prepared
    LR scheduler (which does not step on a skipped step), losses, scale."""
    ref = train(*REFERENCE, clip=clip, accum=accum)
    got = train(*run, clip=clip, accum=accum)
    check(got, ref)
    # torchext's scaler: every accelerator.clip_grad_norm_ was the fused clip
    assert got[2] == (clips(got[0]) if run[1] == "torchext" else 0)
    assert (clips(got[0]) > 0) == (clip is not None)
    skipped = [r["skipped"] for r in ref[0]]
    assert any(skipped) and not all(skipped)
    # a skipped step is one where optimizer.step() was not called
    calls = [r["calls"] for r in ref[0]]
    boundary = [(i + 1) % accum == 0 for i in range(len(calls))]
    assert calls == [int(b and not s) for b, s in zip(boundary, skipped)]
    assert_scale_moved_both_ways(ref[0])


@pytest.mark.parametrize("run", RUNS, ids="-".join)
def test_save_state_load_state_continues_exactly(run, tmp_path):
    """save_state after epoch 1, load_state into fresh objects, epoch 2:
    equal to the uninterrupted run (and to torch's)."""
    whole = train(*run, checkpoint=tmp_path / "ckpt")
    check(whole, train(*REFERENCE))
    resumed = train(*run, resume=tmp_path / "ckpt")
    assert_same(resumed[0], whole[0][len(whole[0]) // 2:], "per step after resume")
    assert_same(resumed[1], whole[1], "final state after resume")


def test_checkpoints_move_between_the_scalers(tmp_path):
    """A checkpoint of accelerate's scaler resumes with torchext's and back."""
    whole = train(*REFERENCE, checkpoint=tmp_path / "torch")
    made = train("torchext", "torchext", checkpoint=tmp_path / "torchext")
    for ckpt, run in (("torch", ("torchext", "torchext")), ("torchext", ("torchext", "torch"))):
        resumed = train(*run, resume=tmp_path / ckpt)
        # (a checkpoint the fused clip made carries its rounding: FOLD_RTOL)
        fused = resumed[2] or (ckpt == "torchext" and made[2])
        compare = assert_close if fused else assert_same
        compare(resumed[1], whole[1], f"{ckpt} checkpoint resumed by {run}")


def test_use_torchext_scaler():
    # settings and state carry over; prepared optimizers are switched
    acc = make_accelerator("fp16")
    old = acc.scaler
    model = mlp()
    opt = acc.prepare(optimizer("torchext", model.parameters()))
    old.scale(torch.ones(()))
    old.update(1024.0)  # a state of its own to carry over
    new = use_torchext_scaler(acc, hysteresis=2)
    assert acc.scaler is new and opt.scaler is new and new is not old
    assert new.state_dict()["hysteresis"] == 2
    assert scaler_state(new) == scaler_state(old)
    assert new.get_growth_interval() == SCALER_KW["growth_interval"]
    assert use_torchext_scaler(acc) is new  # again: the one in place
    # no scaler (bf16, or fp16 on the CPU as accelerate sets it up): nothing changes
    AcceleratorState._reset_state(True)
    acc = Accelerator(mixed_precision="bf16", cpu=True)
    assert use_torchext_scaler(acc) is None and acc.scaler is None
    # not in the middle of an iteration
    acc = make_accelerator("fp16")
    model = mlp()
    opt = acc.prepare(optimizer("torchext", model.parameters()))
    acc.backward(model(torch.ones(2, 8)).sum())
    acc.scaler.unscale_(opt.optimizer)
    with pytest.raises(RuntimeError, match="between iterations"):
        use_torchext_scaler(acc)
    # scalers other than torch's plain one stay

    class OtherScaler(torch.amp.GradScaler):
        pass

    acc.scaler = OtherScaler("cpu")
    with pytest.raises(TypeError, match="OtherScaler"):
        use_torchext_scaler(acc)


@pytest.mark.parametrize("clip", [None, 1.0, float("inf")], ids=["noclip", "clip", "norm-only"])
def test_torchext_scaler_steps_in_one_fused_pass(clip):
    """What torchext's scaler is for, inside accelerate: without clipping,
    a read-only inf check and one fused ASGD pass that unscales on the fly
    (no unscale pass), one host read of found_inf. With clipping, the
    two-call clip (accelerate runs user code and callbacks between its
    clip_grad_norm_ and the step, so nothing may wait for the step): one
    read gives the norm and the inf check (tensor_norms), one pass writes
    the unscaled, clipped gradients (unscale_), then the fused step. With
    the norm only (the HF Trainer's max_norm=inf) that pass only unscales."""
    acc = make_accelerator("fp16", "torchext")
    model = mlp()
    model, opt = acc.prepare(model, optimizer("torchext", model.parameters()))
    x, y = regression_data(n=8)[:]
    for _ in range(2):  # the second step goes through the optimizer's C++ state
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        with RecordOps() as rec:
            if clip is not None:
                acc.clip_grad_norm_(model.parameters(), clip)
            opt.step()
        opt.zero_grad()
    assert rec.ops.count("torchext.asgd_.packed") == 1
    assert rec.ops.count("torchext.tensor_norms.default") == (clip is not None)
    assert ("torchext.check_finite_.default" in rec.ops) == (clip is None)
    assert rec.ops.count("torchext.unscale_.default") == (clip is not None)
    assert not {"aten._foreach_mul_.Tensor", "aten.mul_.Tensor"} & set(rec.ops)
    assert rec.host_reads() == 1  # found_inf, read once (torch's scaler reads it too)
    assert not acc.optimizer_step_was_skipped


def test_norm_only_steps_as_without_clipping():
    """max_norm=inf (the HF Trainer's call when it does not clip): the norm
    of the unscaled gradients, and a step bit for bit torch's."""
    inf = float("inf")
    ref = train(*REFERENCE, clip=inf)
    got = train("torchext", "torchext", clip=inf)
    assert got[2] == clips(got[0]) > 0
    assert_same(got[1], ref[1], "final state")
    assert_close({"norm": [r["norm"] for r in got[0]]}, {"norm": [r["norm"] for r in ref[0]]})
    assert_same([{**r, "norm": None} for r in got[0]], [{**r, "norm": None} for r in ref[0]],
                "per step")
    assert any(math.isnan(r["norm"]) for r in got[0])  # the overflow steps, as torch's


def test_norm_only_does_not_clip_an_overflowing_norm():
    """A norm that overflows while every gradient is finite: accelerate does
    not clip with max_norm=inf, so neither does the fused path (torch's
    clip_grad_norm_ would multiply by inf/inf = NaN)."""
    results = []
    for kind in ("torch", "torchext"):
        acc = make_accelerator("fp16", kind)
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1, bias=False)
        opt = acc.prepare(optimizer("torchext", model.parameters(), lr=1e-30))
        acc.scaler.scale(torch.ones(()))
        acc.scaler.update(1.0)
        acc.backward(model(torch.full((1, 2), 2.5e38)).sum())  # fp32 grads 2.5e38: norm inf
        with FusedClips() as fused:
            norm = acc.clip_grad_norm_(model.parameters(), float("inf"))
        assert fused.scaler == (kind == "torchext")
        opt.step()
        assert not acc.optimizer_step_was_skipped
        results.append((norm, params(model)))
    assert results[0][0].isinf() and results[1][0].isinf()
    assert_same(results[1][1], results[0][1], "params")
    assert all(p.isfinite().all() for p in results[1][1])


def test_fused_clip_only_where_it_is_accelerates_clip(monkeypatch):
    """accelerator.clip_grad_norm_ unscales every optimizer and clips the
    given parameters: fused only when those are exactly one optimizer's
    gradients (the others unscaled, as accelerate does); accelerate's own
    clip otherwise, with its errors."""
    def setup(n_opts=1):
        acc = make_accelerator("fp16", "torchext")
        models = [mlp(seed=i) for i in range(n_opts)]
        opts = [acc.prepare(optimizer("torchext", m.parameters())) for m in models]
        x, y = regression_data(n=8)[:]
        acc.backward(sum(torch.nn.functional.mse_loss(m(x), y) for m in models))
        return acc, models, [o.optimizer for o in opts]

    def stage(acc, opt):
        return acc.scaler.stage(opt).name

    # two optimizers: the one whose gradients are clipped is fused, the
    # other unscaled
    acc, (m0, m1), (o0, o1) = setup(2)
    with FusedClips() as fused:
        acc.clip_grad_norm_(m1.parameters(), 1.0)
    assert fused.scaler == 1 and stage(acc, o0) == "UNSCALED"
    assert stage(acc, o1) == "UNSCALED"  # (clipped: nothing waits)
    # a part of an optimizer's parameters, or parameters twice: accelerate's clip
    for pick in (lambda m: list(m.parameters())[:2], lambda m: [*m.parameters(), *m.parameters()]):
        acc, (m0,), (o0,) = setup()
        with FusedClips() as fused:
            acc.clip_grad_norm_(pick(m0), 1.0)
        assert fused.scaler == 0 and stage(acc, o0) == "UNSCALED"
    # already unscaled: accelerate's error, as with torch's scaler
    acc, (m0,), (o0,) = setup()
    acc.unscale_gradients()
    with pytest.raises(RuntimeError, match="already been called"):
        acc.clip_grad_norm_(m0.parameters(), 1.0)
    # already clipped (so unscaled, as torch's recipe has it): accelerate's
    # clip unscales again, and raises as with torch's scaler, for any parameters
    acc, (m0,), (o0,) = setup()
    acc.scaler.clip_grad_norm_(o0, 1.0)
    for given in (m0.parameters(), list(m0.parameters())[:1]):
        with pytest.raises(RuntimeError, match="already been called"):
            acc.clip_grad_norm_(given, 1.0)
    # DeepSpeed, FSDP, XLA: accelerate's own method stays
    for kind in (DistributedType.DEEPSPEED, DistributedType.FSDP, DistributedType.XLA):
        acc = make_accelerator("fp16")
        monkeypatch.setattr(type(acc), "distributed_type", property(lambda self, k=kind: k))
        bound = acc.clip_grad_norm_
        use_torchext_scaler(acc)
        assert acc.clip_grad_norm_ == bound
        monkeypatch.undo()


@pytest.mark.parametrize("fused", ["torchext-capturable", "torch-sgd-fused"])
def test_device_side_skip_when_asked(fused):
    """capturable=True asks for no host sync: the scaler always calls step()
    and the step skips itself on the device, as torch's fused optimizers do
    with torch's scaler. accelerate then cannot see the skip
    (step_was_skipped stays False); the scaler reports it on the device."""
    acc = make_accelerator("fp16", "torchext" if fused.startswith("torchext") else "torch")
    model = mlp()
    if fused == "torchext-capturable":
        opt = optimizer("torchext", model.parameters(), capturable=True)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, fused=True)
    calls = StepCalls(opt)
    model, opt = acc.prepare(model, opt)
    x, y = regression_data(n=8, poison=(3,))[:]
    before = params(model)
    acc.backward(torch.nn.functional.mse_loss(model(x), y))
    with NoHostSync() if fused == "torchext-capturable" else contextlib.nullcontext():
        opt.step()
    assert calls.n == 1 and not acc.optimizer_step_was_skipped
    assert_same(params(model), before, "params after a device-side skip")
    if fused == "torchext-capturable":
        assert bool(acc.scaler.last_step_skipped)


def test_one_fused_clip_step_is_torchs_within_fp32_rounding():
    """One clipped step (max_norm far below the norm): torchext's fused clip
    and step against torch's recipe (torch.optim.ASGD, accelerate's scaler:
    unscale_, clip, step): the norm within 1e-6, the parameters within
    fp32 rounding (the clipped gradient is rounded once, not twice)."""
    results = []
    for run in (REFERENCE, ("torchext", "torchext")):
        acc = make_accelerator("fp16", run[1])
        model = mlp()
        model, opt = acc.prepare(model, optimizer(run[0], model.parameters()))
        x, y = regression_data(n=8)[:]
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        with FusedClips() as fused:
            norm = acc.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        results.append((norm, params(model), fused.scaler))
    (ref_norm, ref_params, _), (norm, got, fused) = results
    assert fused == 1 and ref_norm > 1.0  # clipped to a tenth or less
    torch.testing.assert_close(norm, ref_norm, rtol=1e-6, atol=0)
    torch.testing.assert_close(got, ref_params, rtol=2.5e-7, atol=1e-9)
