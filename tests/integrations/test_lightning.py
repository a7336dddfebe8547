"""PyTorch Lightning: torchext's ASGD and GradScaler in a Trainer, against
torch.optim.ASGD + torch's scaler, bit for bit.

torchext's scaler goes where Lightning takes a scaler:
``plugins=[MixedPrecision("16-mixed", device, scaler=torchext.amp.GradScaler())]``
(on the CPU, ``precision="16-mixed"`` alone falls back to bf16; the plugin
keeps fp16 autocast and a scaler, as on a GPU). torchext's own plugin,
``torchext.integrations.lightning.MixedPrecision``, routes
``gradient_clip_val`` to the fused clip: its runs are compared bit for bit
but for the losses, parameters and ASGD state, within
``fw_common.FOLD_RTOL``.
"""
import logging
import warnings

import pytest
import torch

from fw_common import keep_torch_globals  # noqa: F401 (autouse)
from fw_common import (REFERENCE, RUNS, FusedClips, RecordOps, StepCalls, assert_close, assert_same,
                       assert_scale_moved_both_ways, mlp, need, optimizer, optimizer_state,
                       params, regression_data, scaler, scaler_state)

pl = need("pytorch_lightning")
from pytorch_lightning.plugins import MixedPrecision  # noqa: E402

import torchext  # noqa: E402
from torchext.integrations import lightning as torchext_lightning  # noqa: E402


POISON = (17, 44)  # rows: batches 2 and 5 of each epoch (batch size 8)
for _name in ("pytorch_lightning", "lightning", "lightning_fabric"):
    logging.getLogger(_name).setLevel(logging.ERROR)


class Module(pl.LightningModule):
    def __init__(self, opt_kind, capturable=False):
        super().__init__()
        self.net = mlp()
        self.opt_kind, self.capturable = opt_kind, capturable
        self.record = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self._loss = loss.detach()
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        opt = self.optimizers().optimizer
        sc = self.trainer.precision_plugin.scaler if hasattr(
            self.trainer.precision_plugin, "scaler") else None
        self.record.append(dict(
            loss=self._loss.float().item(), lr=opt.param_groups[0]["lr"],
            scale=None if sc is None else sc.get_scale(), calls=self.calls.take(),
            global_step=self.trainer.global_step))

    def configure_optimizers(self):
        kw = dict(capturable=True) if self.capturable else {}
        opt = optimizer(self.opt_kind, self.parameters(), **kw)
        self.calls = StepCalls(opt)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
        return [opt], [{"scheduler": sched, "interval": "step"}]


def train(opt_kind, scaler_kind, *, precision="16-mixed", clip=1.0, accum=1, epochs=2,
          poison=POISON, compile=False, checkpoint=None, resume=None, capturable=False,
          plugin="lightning", module_cls=None):
    """``checkpoint``: train one epoch and save a checkpoint there;
    ``resume``: fit from that checkpoint (``ckpt_path=``) to the end;
    ``plugin``: Lightning's MixedPrecision or torchext's. Returns the record
    of each step, the final state and the fused clips that ran."""
    module = (module_cls or Module)(opt_kind, capturable)
    sc = None if scaler_kind is None else scaler(scaler_kind)
    plugin_cls = MixedPrecision if plugin == "lightning" else torchext_lightning.MixedPrecision
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1 if checkpoint else epochs,
        plugins=[plugin_cls(precision, "cpu", scaler=sc)], gradient_clip_val=clip,
        accumulate_grad_batches=accum, enable_checkpointing=False, logger=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    dl = torch.utils.data.DataLoader(regression_data(poison=poison), batch_size=8)
    with warnings.catch_warnings(record=True) as caught, FusedClips() as fused:
        warnings.simplefilter("always")
        trainer.fit(torch.compile(module) if compile else module, dl, ckpt_path=resume)
    if checkpoint:
        trainer.save_checkpoint(checkpoint)
    opt = module.optimizers().optimizer
    # what torch's LR scheduler says about the optimizer (e.g. a first step skipped)
    sched_warnings = sorted({str(w.message) for w in caught
                             if "optimizer.step()" in str(w.message)})
    final = dict(params=params(module), opt=optimizer_state(opt), scaler=scaler_state(sc),
                 global_step=trainer.global_step, sched_warnings=sched_warnings)
    return module.record, final, (fused.scaler_fold, fused.scaler, fused.asgd)


_references = {}


def reference(**kw):
    """torch's run for these settings, trained once per session."""
    key = tuple(sorted(kw.items()))
    if key not in _references:
        _references[key] = train(*REFERENCE, **kw)
    return _references[key]


def check(got, ref):
    """Bit for bit; within FOLD_RTOL where the fused clip ran."""
    compare = assert_close if any(got[2]) else assert_same
    compare(got[0], ref[0], "per step")
    compare(got[1], ref[1], "final state")


@pytest.mark.parametrize("clip,accum", [(1.0, 1), (1.0, 2)], ids=["clip", "clip-accumulate2"])
@pytest.mark.parametrize("run", RUNS, ids="-".join)
def test_16_mixed_scaler_clipping_overflow(run, clip, accum):
    """fp16 + a scaler (torch's or torchext's) + gradient_clip_val, with
    overflows: Lightning used to refuse clipping for torchext's ASGD."""
    ref = reference(clip=clip, accum=accum)
    check(train(*run, clip=clip, accum=accum), ref)
    calls = [r["calls"] for r in ref[0]]
    assert 0 < sum(calls) < len(calls) // accum  # some steps skipped (step() not called)
    assert_scale_moved_both_ways(ref[0])


@pytest.mark.parametrize("run", RUNS, ids="-".join)
def test_first_step_skipped(run):
    """Lightning steps the LR scheduler after a skipped step too; when the
    very first step is skipped, torch's scheduler warns that it stepped
    before the optimizer did, for torchext's ASGD as for torch's."""
    ref = reference(poison=(0,), epochs=1)
    assert ref[0][0]["calls"] == 0
    assert any("before `optimizer.step()`" in w for w in ref[1]["sched_warnings"])
    check(train(*run, poison=(0,), epochs=1), ref)


def test_bf16_mixed_clipping():
    """bf16-mixed has no scaler; clipping works."""
    ref = train("torch", None, precision="bf16-mixed", poison=())
    check(train("torchext", None, precision="bf16-mixed", poison=()), ref)


@pytest.mark.parametrize("run", RUNS, ids="-".join)
def test_ckpt_path_resume(run, tmp_path):
    """One epoch, save_checkpoint, fit(ckpt_path=...) to the end: equal to
    the uninterrupted run (optimizer, LR scheduler and scaler state)."""
    whole = train(*run)
    check(whole, reference(clip=1.0, accum=1))
    train(*run, checkpoint=tmp_path / "epoch1.ckpt")
    resumed = train(*run, resume=tmp_path / "epoch1.ckpt")
    assert_same(resumed[0], whole[0][len(whole[0]) // 2:], "per step after resume")
    assert_same(resumed[1], whole[1], "final state after resume")


def test_compiled_model():
    """trainer.fit(torch.compile(module)), fp16 + scaler + clipping +
    overflows: torchext's classes against torch's, both compiled."""
    ref = train(*REFERENCE, compile=True)
    for run in RUNS:
        check(train(*run, compile=True), ref)


def test_capturable_asks_for_the_fused_contract():
    """capturable=True makes torchext's ASGD a sync-free fused optimizer for
    every scaler (_step_supports_amp_scaling): Lightning then refuses
    clipping with a scaler, exactly as for torch's fused SGD."""
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
        train("torchext", "torchext", capturable=True)
    # without clipping it trains, skipping on the device
    got = train("torchext", "torchext", capturable=True, clip=None, epochs=1)
    assert all(r["calls"] == 1 for r in got[0])
    assert all(bool(p.isfinite().all()) for p in got[1]["params"])


@pytest.mark.parametrize("accum", [1, 2], ids=["clip", "clip-accumulate2"])
def test_torchext_plugin_fused_clip(accum):
    """torchext's MixedPrecision: after Lightning's unscale_, with the
    default configure_gradient_clipping, gradient_clip_val is folded into
    the step (scaler.clip_and_step), once per optimizer step, overflows
    included; against torch's classes under Lightning's plugin. With torch's
    scaler in it, Lightning's own clip, bit for bit."""
    ref = reference(clip=1.0, accum=accum)
    got = train("torchext", "torchext", clip=1.0, accum=accum, plugin="torchext")
    check(got, ref)
    assert got[2] == (len(ref[0]) // accum, 0, 0)
    got = train("torchext", "torch", clip=1.0, accum=accum, plugin="torchext")
    assert got[2] == (0, 0, 0)
    check(got, ref)


class ClipHookModule(Module):
    """Overrides configure_gradient_clipping (user code after the clip):
    Lightning's hook clips as the default one, then reads the gradients."""

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        self.clipped_norms = getattr(self, "clipped_norms", [])
        self.clipped_norms.append(torch.nn.utils.get_total_norm(
            [p.grad for p in self.parameters() if p.grad is not None]))


def test_torchext_plugin_overridden_clipping_hook_uses_the_two_call_clip():
    """User code runs after the clip in an overridden configure_gradient_clipping:
    the two-call clip, applied when called (the hook reads torch's clipped
    gradients), never the fold."""
    ref = train("torch", "torch", clip=1.0, module_cls=ClipHookModule)
    got = train("torchext", "torchext", clip=1.0, plugin="torchext", module_cls=ClipHookModule)
    assert got[2] == (0, len(ref[0]), 0)
    check(got, ref)


def test_torchext_plugin_bf16_fused_clip():
    """bf16-mixed (no scaler): torchext's ASGD clips through its own
    two-call clip_grad_norm_ (one read, one pass)."""
    ref = train("torch", None, precision="bf16-mixed", poison=())
    got = train("torchext", None, precision="bf16-mixed", poison=(), plugin="torchext")
    assert got[2] == (0, 0, len(ref[0]))
    check(got, ref)


def test_torchext_plugin_ckpt_path_resume(tmp_path):
    whole = train("torchext", "torchext", plugin="torchext")
    check(whole, reference(clip=1.0, accum=1))
    train("torchext", "torchext", plugin="torchext", checkpoint=tmp_path / "epoch1.ckpt")
    resumed = train("torchext", "torchext", plugin="torchext", resume=tmp_path / "epoch1.ckpt")
    assert_same(resumed[0], whole[0][len(whole[0]) // 2:], "per step after resume")
    assert_same(resumed[1], whole[1], "final state after resume")


def test_torchext_plugin_does_not_rewrite_the_gradients():
    """The folded clip reads the gradients once (tensor_norms) and never
    writes them: the only pass that writes is Lightning's unscale_, and
    torch's clip (_foreach_norm, _foreach_mul_) does not run."""
    with RecordOps() as rec:
        got = train("torchext", "torchext", plugin="torchext", epochs=1)
    steps = len(got[0])
    assert got[2] == (steps, 0, 0)
    assert rec.ops.count("torchext.tensor_norms.default") == steps
    assert rec.ops.count("torchext.unscale_.default") == steps
    assert not {"aten._foreach_norm.Scalar", "aten._foreach_mul_.Tensor"} & set(rec.ops)


def test_torchext_plugin_default_scaler():
    assert isinstance(torchext_lightning.MixedPrecision("16-mixed", "cpu").scaler,
                      torchext.amp.GradScaler)
    assert torchext_lightning.MixedPrecision("bf16-mixed", "cpu").scaler is None
    assert isinstance(torchext_lightning.MixedPrecision("16-mixed", "cpu"), MixedPrecision)


class ManualModule(Module):
    """Manual optimization: clip_gradients before the optimizer step, which
    is where Lightning's plugin unscales (so the gradients are still scaled)."""

    def __init__(self, opt_kind):
        super().__init__(opt_kind)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.manual_backward(loss)
        self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        opt.step()
        opt.zero_grad()
        self.record.append(loss.detach().float().item())

    def on_train_batch_end(self, outputs, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return optimizer(self.opt_kind, self.parameters())


def test_torchext_plugin_manual_optimization_keeps_lightnings_clip():
    """In manual optimization the gradients are not unscaled when the user
    clips: torchext's plugin leaves that to Lightning's own clip, so the run
    is bit for bit the one with Lightning's plugin."""
    runs = []
    for plugin_cls in (MixedPrecision, torchext_lightning.MixedPrecision):
        module = ManualModule("torchext")
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_epochs=1, logger=False,
            plugins=[plugin_cls("16-mixed", "cpu", scaler=scaler("torchext"))],
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        dl = torch.utils.data.DataLoader(regression_data(poison=POISON), batch_size=8)
        with FusedClips() as fused:
            trainer.fit(module, dl)
        runs.append((module.record, params(module), fused.scaler))
    assert runs[1][2] == 0
    assert_same(runs[1][:2], runs[0][:2], "manual optimization")
