"""The HF Trainer: ``optimizers=(torchext.optim.ASGD(...), scheduler)``, with the
Trainer's own scaler (accelerate's torch.amp.GradScaler) or torchext's
(``use_torchext_scaler(trainer.accelerator)``), against torch.optim.ASGD,
bit for bit: losses, the LR schedule (the Trainer does not step it when
``optimizer_step_was_skipped``), skip flags, checkpoints and
``resume_from_checkpoint``. A 2-layer GPT-2 built from a config. With
torchext's scaler the Trainer's ``accelerator.clip_grad_norm_`` (on every
step: ``max_norm=inf`` when it does not clip) is torchext's fused clip: the
logged grad_norm, losses, parameters and ASGD state are then compared
within ``fw_common.FOLD_RTOL``, the rest bit for bit.

On the CPU accelerate builds no scaler and no autocast for fp16; the fp16
runs do what accelerate does on a GPU (see test_accelerate.py).
"""
import logging
import math

import pytest
import torch

from fw_common import keep_torch_globals  # noqa: F401 (autouse)
from fw_common import (REFERENCE, RUNS, SCALER_KW, FusedClips, StepCalls, assert_close,
                       assert_same, assert_scale_moved_both_ways, need, optimizer,
                       optimizer_state, params, scaler_state)

transformers = need("transformers")
need("accelerate")
from accelerate.utils import get_grad_scaler  # noqa: E402
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)

from torchext.integrations.accelerate import use_torchext_scaler  # noqa: E402

transformers.utils.logging.set_verbosity_error()
logging.getLogger("accelerate").setLevel(logging.ERROR)
POISON_STEPS = (1, 5)  # optimizer steps whose gradients overflow
MAX_STEPS, SAVE_STEPS = 8, 4


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Record(TrainerCallback):
    def __init__(self, calls):
        self.calls, self.record, self.scaler, self.norms = calls, [], None, []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "grad_norm" in logs:
            self.norms.append(logs["grad_norm"])

    def on_step_end(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        self.record.append(dict(
            step=state.global_step, skipped=optimizer.step_was_skipped,
            lr=lr_scheduler.get_last_lr()[0], calls=self.calls.take(),
            scale=None if self.scaler is None else self.scaler.get_scale()))


class RecordingTrainer(Trainer):
    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self.losses.append(loss.item())
        return loss


def train(opt_kind, scaler_kind, *, precision, out, resume=None, max_grad_norm=1.0):
    """The record of each step, the final state, how many fused clips ran."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2,
                                       n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0))
    opt = optimizer(opt_kind, model.parameters())
    calls = StepCalls(opt)
    # bf16: the Trainer's own (linear) schedule; fp16: the user's
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.8) if precision == "fp16" else None
    record = Record(calls)
    args = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=4, max_steps=MAX_STEPS,
        save_steps=SAVE_STEPS, logging_steps=1, max_grad_norm=max_grad_norm, seed=0, use_cpu=True,
        fp16=precision == "fp16", bf16=precision == "bf16", report_to=[], disable_tqdm=True)
    trainer = RecordingTrainer(model=model, args=args, train_dataset=Tokens(),
                               optimizers=(opt, sched), callbacks=[record])
    trainer.losses = []
    acc = trainer.accelerator
    if precision == "fp16":
        assert acc.scaler is None  # accelerate on the CPU; on a GPU it does this:
        acc.native_amp = True
        acc.scaler = get_grad_scaler(acc.distributed_type, **SCALER_KW)
        if scaler_kind == "torchext":
            use_torchext_scaler(trainer.accelerator)  # the user's one line

        def poison(grad):
            if trainer.state.global_step in POISON_STEPS:
                grad = grad.clone()
                grad.view(-1)[0] = float("inf")
            return grad

        model.transformer.h[0].mlp.c_fc.weight.register_hook(poison)
    record.scaler = acc.scaler
    with FusedClips() as fused:
        trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    assert len(record.norms) == len(record.record) == len(trainer.losses)
    for r, loss, norm in zip(record.record, trainer.losses, record.norms):
        r["loss"], r["norm"] = loss, norm
    final = dict(params=params(model), opt=optimizer_state(opt), scaler=scaler_state(acc.scaler))
    return record.record, final, fused.scaler


def check_resume(run, precision, tmp_path, ref, **kw):
    whole = train(*run, precision=precision, out=tmp_path / "whole", **kw)
    # torchext's scaler: the Trainer's every clip_grad_norm_ was the fused clip
    assert whole[2] == (len(whole[0]) if run[1] == "torchext" else 0)
    compare = assert_close if whole[2] else assert_same
    compare(whole[0], ref[0], "per step")
    compare(whole[1], ref[1], "final state")
    resumed = train(*run, precision=precision, out=tmp_path / "resumed",
                    resume=tmp_path / "whole" / f"checkpoint-{SAVE_STEPS}", **kw)
    assert_same(resumed[0], whole[0][SAVE_STEPS:], "per step after resume")
    assert_same(resumed[1], whole[1], "final state after resume")
    return whole


def test_bf16_resume(tmp_path):
    ref = train(*REFERENCE, precision="bf16", out=tmp_path / "ref")
    assert [r["calls"] for r in ref[0]] == [1] * MAX_STEPS
    check_resume(("torchext", None), "bf16", tmp_path, ref)


@pytest.fixture(scope="module")
def fp16_reference(tmp_path_factory):
    refs = {}

    def get(max_grad_norm):
        if max_grad_norm not in refs:
            refs[max_grad_norm] = train(*REFERENCE, precision="fp16",
                                        out=tmp_path_factory.mktemp("ref"),
                                        max_grad_norm=max_grad_norm)
        return refs[max_grad_norm]

    return get


@pytest.mark.parametrize("max_grad_norm", [0.75, 0.0], ids=["clip", "noclip"])
@pytest.mark.parametrize("run", RUNS, ids="-".join)
def test_fp16_scaler_overflow_resume(run, max_grad_norm, tmp_path, fp16_reference):
    """A skipped step: step() not called, optimizer_step_was_skipped True,
    the LR not advanced; then resume_from_checkpoint (scaler.pt included).
    max_grad_norm=0: the Trainer asks for the norm only (max_norm=inf), and
    the fused path folds in nothing: parameters bit for bit torch's."""
    ref = fp16_reference(max_grad_norm)
    norms = [r["norm"] for r in ref[0]]
    assert [not math.isfinite(n) for n in norms] == [i in POISON_STEPS for i in range(MAX_STEPS)]
    if max_grad_norm > 0:  # clipping active on some steps, not all
        assert 0 < sum(max_grad_norm < n < math.inf for n in norms) < MAX_STEPS - len(POISON_STEPS)
    assert [r["skipped"] for r in ref[0]] == [i in POISON_STEPS for i in range(MAX_STEPS)]
    assert [r["calls"] for r in ref[0]] == [int(i not in POISON_STEPS) for i in range(MAX_STEPS)]
    lrs = [r["lr"] for r in ref[0]]
    assert all(lrs[i] == lrs[i - 1] for i in POISON_STEPS)
    assert_scale_moved_both_ways(ref[0])
    whole = check_resume(run, "fp16", tmp_path, ref, max_grad_norm=max_grad_norm)
    if max_grad_norm == 0:
        assert_same(whole[1], ref[1], "final state, norm only")
