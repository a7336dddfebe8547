"""timm: torchext's ASGD under timm's NativeScaler, and torchext's
GradScaler through ``torchext.integrations.timm.NativeScaler``, in timm's
training loop (train.py's train_one_epoch: fp16 autocast, ``need_update``
gradient accumulation, ``clip_grad``, ``step_update``), with timm's
CheckpointSaver and resume_checkpoint; against torch.optim.ASGD + timm's
NativeScaler, bit for bit. torchext's NativeScaler clips by norm with
``clip_and_step`` (timm's ``__call__`` clips and steps in one call): its
runs with clipping are compared bit for bit but for the
losses, parameters and ASGD state, within ``fw_common.FOLD_RTOL``.
"""
import functools

import pytest
import torch

from fw_common import keep_torch_globals  # noqa: F401 (autouse)
from fw_common import (INSTALL, REFERENCE, RUNS, SCALER_KW, FusedClips, RecordOps, StepCalls,
                       assert_close, assert_same, assert_scale_moved_both_ways, optimizer,
                       optimizer_state, params, scaler_state)


def _need_timm():
    try:
        import timm
        return timm
    except Exception as e:  # noqa: BLE001 (ImportError, or a torchvision that does not load)
        missing = isinstance(e, ModuleNotFoundError) and e.name == "timm"
        if torch.version.cuda is None:
            pytest.skip(
                f"timm {'is not installed' if missing else f'does not import ({e})'}: with the "
                f"CPU-only torch {torch.__version__} it cannot run here (timm imports "
                "torchvision, and the torchvision wheels in reach are CUDA builds that do not "
                "load with a CPU-only torch). timm's tests run on the CUDA build of torch",
                allow_module_level=True)
        pytest.skip(f"timm {'is not installed' if missing else f'does not import ({e})'}; the "
                    f"integration tests need `{INSTALL}`", allow_module_level=True)


timm = _need_timm()
from timm.models import model_parameters, resume_checkpoint  # noqa: E402
from timm.scheduler import create_scheduler_v2  # noqa: E402
from timm.utils import CheckpointSaver  # noqa: E402
from timm.utils import NativeScaler as TimmNativeScaler  # noqa: E402

import torchext  # noqa: E402
from torchext.integrations.timm import NativeScaler  # noqa: E402

POISON = (5,)  # an image whose batch overflows (batch size 4: batch 1, an update)
EPOCHS = 2


def vit():
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16,
                             patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=3)


def loader(poison=POISON):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, 16, 16, generator=g)
    y = torch.randint(0, 3, (32,), generator=g)
    for i in poison:
        x[i, 0, 0, 0] = float("inf")
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


def loss_scaler(kind):
    if kind == "torch":
        sc = TimmNativeScaler(device="cpu")
        sc._scaler = torch.amp.GradScaler("cpu", **SCALER_KW)  # a scale that moves
        return sc
    return NativeScaler(device="cpu", **SCALER_KW)


def train(opt_kind, scaler_kind, *, accum=2, clip=1.0, clip_mode="norm", out, resume=None,
          poison=POISON):
    """timm's train.py, reduced to what meets the optimizer and the scaler.
    Returns the record of each batch, the final state and how many fused
    clips ran."""
    model = vit()
    opt = optimizer(opt_kind, model.parameters())
    calls = StepCalls(opt)
    scaler = loss_scaler(scaler_kind)
    dl = loader(poison)
    updates_per_epoch = (len(dl) + accum - 1) // accum
    sched, _ = create_scheduler_v2(opt, sched="cosine", num_epochs=EPOCHS, warmup_epochs=1,
                                   warmup_lr=0.01, step_on_epochs=False,
                                   updates_per_epoch=updates_per_epoch)
    out.mkdir(parents=True, exist_ok=True)
    saver = CheckpointSaver(model, opt, amp_scaler=scaler, checkpoint_dir=str(out),
                            recovery_dir=str(out), max_history=2)
    start_epoch = 0
    if resume is not None:
        start_epoch = resume_checkpoint(model, resume, optimizer=opt,
                                                    loss_scaler=scaler, log_info=False)
        sched.step_update(start_epoch * updates_per_epoch)
    autocast = functools.partial(torch.autocast, device_type="cpu", dtype=torch.float16)
    record = []
    with FusedClips() as fused:
        for epoch in range(start_epoch, EPOCHS):
            num_updates = epoch * updates_per_epoch
            last = len(dl) - 1
            for batch_idx, (x, y) in enumerate(dl):
                need_update = batch_idx == last or (batch_idx + 1) % accum == 0
                with autocast():
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                if accum > 1:
                    loss = loss / accum
                scaler(loss, opt, clip_grad=clip, clip_mode=clip_mode,
                       parameters=model_parameters(model), need_update=need_update)
                record.append(dict(loss=loss.item(), calls=calls.take(),
                                   scale=scaler._scaler.get_scale(),
                                   lr=opt.param_groups[0]["lr"]))
                if not need_update:
                    continue
                num_updates += 1
                opt.zero_grad()
                sched.step_update(num_updates=num_updates)
            sched.step(epoch + 1)
            saver.save_checkpoint(epoch, metric=None)
    final = dict(params=params(model), opt=optimizer_state(opt),
                 scaler=scaler_state(scaler._scaler))
    return record, final, (fused.scaler_fold, fused.scaler)


def compare(got, ref, what=""):
    """Bit for bit; within FOLD_RTOL where the fused clip ran (in either)."""
    check = assert_close if any(got[2]) or any(ref[2]) else assert_same
    check(got[0], ref[0], f"per batch{what}")
    check(got[1], ref[1], f"final state{what}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """torch's run for given settings, trained once per module."""
    runs = {}

    def get(**kw):
        key = tuple(sorted(kw.items()))
        if key not in runs:
            runs[key] = train(*REFERENCE, out=tmp_path_factory.mktemp("reference"), **kw)
        return runs[key]

    return get


@pytest.mark.parametrize("clip", [1.0, None], ids=["clip", "noclip"])
@pytest.mark.parametrize("run", RUNS, ids="-".join)
def test_native_scaler_accumulation_overflow(run, clip, tmp_path, reference):
    ref = reference(clip=clip)
    got = train(*run, clip=clip, out=tmp_path / "got")
    compare(got, ref)
    calls = [r["calls"] for r in ref[0]]
    updates = [(i + 1) % 2 == 0 for i in range(len(calls))]
    # torchext's NativeScaler: every update's clip was the fused one
    assert got[2] == ((sum(updates), 0) if run[1] == "torchext" and clip else (0, 0))
    assert 0 < sum(calls) < sum(updates)  # overflowed updates skipped: step() not called
    assert_scale_moved_both_ways(ref[0])


@pytest.mark.parametrize("run", RUNS, ids="-".join)
def test_checkpoint_saver_resume(run, tmp_path, reference):
    """resume_checkpoint (weights_only=True) of epoch 0's checkpoint, then
    epoch 1: equal to the uninterrupted run, also when the checkpoint is
    resumed with the other scaler (timm's NativeScaler <-> torchext's)."""
    whole = train(*run, out=tmp_path)
    compare(whole, reference(clip=1.0))
    resumed = train(*run, out=tmp_path / "resumed", resume=tmp_path / "checkpoint-0.pth.tar")
    assert_same(resumed[0], whole[0][len(whole[0]) // 2:], "per batch after resume")
    assert_same(resumed[1], whole[1], "final state after resume")
    other = "torch" if run[1] == "torchext" else "torchext"
    resumed = train(run[0], other, out=tmp_path / "other",
                    resume=tmp_path / "checkpoint-0.pth.tar")
    check = assert_close if any(resumed[2]) or any(whole[2]) else assert_same
    check(resumed[1], whole[1], f"final state after resume with {other}'s scaler")


def test_native_scaler_class():
    """torchext's NativeScaler is timm's class with torchext's GradScaler in
    it: same key, same attributes."""
    ours, theirs = NativeScaler(), TimmNativeScaler(device="cpu")
    assert isinstance(ours, TimmNativeScaler)
    assert ours.state_dict_key == theirs.state_dict_key == "amp_scaler"
    assert vars(ours).keys() == vars(theirs).keys()
    assert isinstance(ours._scaler, torchext.amp.GradScaler)
    assert ours._scaler._device is None  # from the first loss (timm's default: "cuda")
    assert NativeScaler("cpu", init_scale=8.0)._scaler.get_scale() == 8.0


@pytest.mark.parametrize("clip_mode", ["value", "agc"])
def test_other_clip_modes_stay_timms(clip_mode, tmp_path):
    """clip_mode "value" and "agc": timm's unscale_ and clip, bit for bit."""
    ref = train(*REFERENCE, clip=0.05, clip_mode=clip_mode, out=tmp_path / "ref")
    got = train("torchext", "torchext", clip=0.05, clip_mode=clip_mode, out=tmp_path / "got")
    assert got[2] == (0, 0)
    compare(got, ref)


def test_fused_clip_reads_once_and_only_for_the_optimizers_grads():
    """clip_mode="norm": one read gives the norm and the inf check
    (tensor_norms), the fused ASGD pass unscales and clips, the gradients
    are never rewritten; parameters other than the optimizer's: timm's clip."""
    model = vit()
    opt = optimizer("torchext", model.parameters())
    scaler = loss_scaler("torchext")
    x, y = next(iter(loader(poison=())))
    for _ in range(2):  # the second step goes through the optimizer's C++ state
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        with RecordOps() as rec:
            scaler(loss, opt, clip_grad=0.1, clip_mode="norm", parameters=model.parameters())
        opt.zero_grad()
    assert rec.ops.count("torchext.tensor_norms.default") == 1
    assert rec.ops.count("torchext.asgd_.packed") == 1
    other_passes = {"torchext.unscale_.default", "torchext.check_finite_.default",
                    "aten._foreach_mul_.Tensor", "aten._foreach_norm.Scalar"}
    assert not other_passes & set(rec.ops)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    with FusedClips() as fused:
        scaler(loss, opt, clip_grad=0.1, parameters=list(model.parameters())[1:])
    assert fused.scaler == fused.scaler_fold == 0
