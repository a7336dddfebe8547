"""C++ -> Python: loads what the C++ tests saved with torchext::save_state_dict
(test_checkpoint.cpp, test_low_precision.cpp, test_stochastic_rounding.cpp) and
finishes the run in Python, in torchext.optim.ASGD
(bit for bit against the run that never left Python) and torch.optim.ASGD
(its for-loop kernel: ~1e-6), and the scaler in torchext.amp.GradScaler and
torch.amp.GradScaler. Run by ctest after the C++ tests:

    python cpp_tests/resume_in_python.py REF_DIR
"""
import glob
import os
import sys

import torch
import torch.jit._pickle  # noqa: F401  (restore_type_tag, for load_params)

HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(HERE)
if glob.glob(os.path.join(_ROOT, "torchext", "_C*.so")):
    sys.path.insert(0, _ROOT)  # a source tree built in place: use it
sys.path.insert(0, HERE)
import make_reference as mr  # noqa: E402
from torchext.amp import GradScaler  # noqa: E402
from torchext.optim import ASGD as TorchextASGD  # noqa: E402


def load(ref_dir, name):
    return torch.load(os.path.join(ref_dir, name), weights_only=True)


def load_params(ref_dir, name):
    # The params the C++ test wrote with torch::jit::pickle_save, which tags
    # its dict with a TorchScript type (torchext::save_state_dict does not).
    with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
        return load(ref_dir, name)


def check_asgd(ref_dir, dtype):
    name = str(dtype).split(".")[-1]
    ref = load(ref_dir, f"ckpt_ref_{name}.pt")
    sd = load(ref_dir, f"ckpt_cpp_{name}.pt")
    assert [len(g["params"]) for g in sd["param_groups"]] == [2, 1], sd["param_groups"]
    start = mr.PY_STEPS + mr.CPP_STEPS
    for cls, exact in ((TorchextASGD, True), (torch.optim.ASGD, False)):
        cpp_params = load_params(ref_dir, f"ckpt_cpp_params_{name}.pt")  # what C++ trained
        params = [cpp_params[f"param{i}"].clone().requires_grad_() for i in range(3)]
        # Other options than the file's: they must come from it.
        opt = mr.make_asgd(cls, params, lr=0.5)
        # A fresh copy each time: load_state_dict may keep the loaded tensors.
        opt.load_state_dict(load(ref_dir, f"ckpt_cpp_{name}.pt"))
        assert opt.param_groups[1]["lr"] == 0.01 and opt.param_groups[1]["maximize"]
        grads = [ref[f"grads{i}"] for i in range(3)]
        mr.run_steps(opt, params, grads, start, mr.CKPT_STEPS)
        for i, p in enumerate(params):
            for key, got in (("param", p.detach()), ("ax", opt.state[p]["ax"]),
                             ("step", opt.state[p]["step"])):
                want = ref[f"end_{key}{i}"]
                if exact:
                    assert torch.equal(got, want), (cls.__name__, name, key, i, got, want)
                else:
                    torch.testing.assert_close(got.to(want.dtype), want, rtol=1e-6, atol=1e-7)
    print(f"resume_in_python: ASGD {name}: torchext bit for bit, torch.optim.ASGD close")


def check_scaler(ref_dir):
    ref = load(ref_dir, "ckpt_scaler_ref.pt")
    sd_scaler = load(ref_dir, "ckpt_scaler_cpp.pt")
    w_cpp = load_params(ref_dir, "ckpt_scaler_w_cpp.pt")["param0"]
    start = mr.PY_STEPS + mr.CPP_STEPS
    for scaler_cls in (GradScaler, torch.amp.GradScaler):
        w = w_cpp.detach().clone().requires_grad_()
        opt = TorchextASGD([w], lr=0.5)
        opt.load_state_dict(load(ref_dir, "ckpt_scaler_opt_cpp.pt"))
        scaler = scaler_cls("cpu", init_scale=3.0)
        scaler.load_state_dict(sd_scaler)
        mr.scaler_train(scaler, opt, w, ref["xs"], start, mr.CKPT_STEPS)
        assert scaler.get_scale() == ref["end_scale"].item(), scaler_cls
        assert scaler._get_growth_tracker() == ref["end_growth_tracker"].item(), scaler_cls
        if scaler_cls is GradScaler:
            assert scaler.num_skipped_steps() == ref["end_skipped"].item()
            assert torch.equal(w.detach(), ref["end_w"])
    print("resume_in_python: GradScaler: torchext and torch.amp continue the C++ run")


def check_t0_per_param(ref_dir):
    """The run whose group 0 has t0_per_param (start_averaging at different
    step counts), saved by C++: torchext continues it bit for bit."""
    ref = load(ref_dir, "ckpt_t0pp_ref.pt")
    sd = load(ref_dir, "ckpt_t0pp_cpp.pt")
    assert sd["param_groups"][0]["t0_per_param"] == ref["t0_per_param0"].tolist(), sd
    assert "t0_per_param" not in sd["param_groups"][1]
    cpp_params = load_params(ref_dir, "ckpt_t0pp_cpp_params.pt")
    params = [cpp_params[f"param{i}"].clone().requires_grad_() for i in range(3)]
    opt = mr.make_asgd(TorchextASGD, params, lr=0.5)
    opt.load_state_dict(sd)
    grads = [ref[f"grads{i}"] for i in range(3)]
    mr.t0pp_steps(opt, params, grads, mr.PY_STEPS + mr.CPP_STEPS, mr.CKPT_STEPS)
    for i, p in enumerate(params):
        for key, got in (("param", p.detach()), ("ax", opt.state[p]["ax"]),
                         ("mu", opt.state[p]["mu"]), ("step", opt.state[p]["step"])):
            want = ref[f"end_{key}{i}"]
            assert torch.equal(got, want), ("t0_per_param", key, i, got, want)
    print("resume_in_python: t0_per_param saved by C++ continues bit for bit")


def check_tensor_lr(ref_dir):
    sd = load(ref_dir, "ckpt_tensor_lr_cpp.pt")
    ref = load(ref_dir, "tensor_lr_ref.pt")
    lr = sd["param_groups"][0]["lr"]
    assert isinstance(lr, torch.Tensor) and torch.equal(lr, ref["lr"]), lr
    print("resume_in_python: tensor lr saved by C++ loads as a tensor")


def check_low_precision(ref_dir):
    """The bf16 run C++ continued and saved (test_low_precision.cpp): its
    groups' average_dtype ("float32" and None, as Python's groups hold them)
    and the float32 ax load unchanged into torchext.optim.ASGD."""
    ref = load(ref_dir, "lowp_ref.pt")
    sd = load(ref_dir, "lowp_cpp_bfloat16.pt")
    assert [g["average_dtype"] for g in sd["param_groups"]] == ["float32", None], sd
    cpp_params = load_params(ref_dir, "lowp_cpp_params_bfloat16.pt")
    params = [cpp_params[f"param{i}"].clone().requires_grad_() for i in range(3)]
    opt = TorchextASGD([dict(params=params[:2]), dict(params=params[2:])], lr=0.5)
    opt.load_state_dict(sd)
    assert [g["average_dtype"] is None for g in opt.param_groups] == [False, True]
    for i, p in enumerate(params):
        for key in ("param", "ax", "step", "eta", "mu"):
            got = p.detach() if key == "param" else opt.state[p][key]
            want = ref[f"bfloat16/fused/{key}{i}"]
            assert got.dtype == want.dtype and torch.equal(got, want), ("lowp", key, i, got, want)
    print("resume_in_python: bf16 with a float32 ax saved by C++ loads bit for bit")


def check_stochastic_rounding(ref_dir):
    """The runs C++ continued from Python's halfway checkpoint and saved
    (test_stochastic_rounding.cpp): loaded into an optimizer with other
    settings, the file's flag and seeds win, and torchext finishes each run
    with the bits of the run that never left Python."""
    ref = load(ref_dir, "sr_ref.pt")
    for name in ("bfloat16", "float16"):
        sd = load(ref_dir, f"sr_cpp_{name}.pt")
        seeds = [mr.SR_DEFAULT_SEED, -7]
        assert [g["stochastic_rounding"] for g in sd["param_groups"]] == [True, True], sd
        assert [g["rounding_seed"] for g in sd["param_groups"]] == seeds, sd
        cpp_params = load_params(ref_dir, f"sr_cpp_params_{name}.pt")
        params = [cpp_params[f"param{i}"].clone().requires_grad_()
                  for i in range(len(mr.SR_SHAPES))]
        # Other options (rounding off, seed 0): they must come from the file.
        opt = TorchextASGD([dict(params=params[:3]), dict(params=params[3:])], lr=0.5)
        opt.load_state_dict(sd)
        assert [g["rounding_seed"] for g in opt.param_groups] == seeds
        grads = [ref[f"{name}/grads{i}"] for i in range(len(params))]
        mr.sr_steps(opt, params, grads, mr.SR_CPP_STOP, mr.SR_STEPS)
        for i, p in enumerate(params):
            for key in ("param", "ax", "step", "eta", "mu"):
                got = p.detach() if key == "param" else opt.state[p][key]
                want = ref[f"{name}/final_{key}{i}"]
                assert got.dtype == want.dtype and torch.equal(got, want), ("sr", name, key, i)
    print("resume_in_python: stochastic rounding saved by C++ finishes bit for bit")


def main(ref_dir):
    check_asgd(ref_dir, torch.float32)
    check_asgd(ref_dir, torch.float64)
    check_scaler(ref_dir)
    check_t0_per_param(ref_dir)
    check_tensor_lr(ref_dir)
    check_low_precision(ref_dir)
    check_stochastic_rounding(ref_dir)


if __name__ == "__main__":
    main(sys.argv[1])
