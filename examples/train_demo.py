"""torchext's main job: train a model with the fused ASGD + GradScaler next to
torch.optim.ASGD + torch.amp.GradScaler, on the same data and initial weights.

Prints the losses side by side and the step-time ratio (both measured in this
process, so the ratio holds whatever the machine). Runs on CPU (bf16
autocast) or CUDA (fp16 autocast). The loop clips gradients as most AMP
loops do: torch's recipe (unscale_, clip_grad_norm_) on torch's side,
torchext's clip_and_step (the clip folded into the fused step) on the other; --clip 0 turns
clipping off.

    python examples/train_demo.py [--steps 300] [--device cpu|cuda] [--compile] [--clip 1.0]
"""
import argparse
import copy
import time

import torch

import torchext


def make_data(n, dim, classes, device, seed=0):
    """A teacher network labels random points: a learnable, non-trivial task."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.Tanh(),
                                  torch.nn.Linear(64, classes))
    with torch.no_grad():
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
        x = torch.randn(n, dim, generator=g)
        y = teacher(x).argmax(dim=1)
    return x.to(device), y.to(device)


def make_model(dim, width, classes, device, seed=0):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(dim, width), torch.nn.GELU()]
    for _ in range(3):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    layers += [torch.nn.Linear(width, classes)]
    return torch.nn.Sequential(*layers).to(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--clip", type=float, default=1.0,
                    help="max gradient norm (0: no clipping)")
    ap.add_argument("--compile", action="store_true",
                    help="each library's torch.compile recipe: torch's compiled model + "
                         "compiled opt.step; torchext's compiled model, eager step "
                         "(docs/compile.md)")
    args = ap.parse_args()
    device = torch.device(args.device)
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    dim, classes = 32, 10
    x_all, y_all = make_data(args.batch * 16, dim, classes, device)

    model_t = make_model(dim, args.width, classes, device)
    model_x = copy.deepcopy(model_t)
    hp = dict(lr=0.5, lambd=1e-4, alpha=0.75, t0=100, weight_decay=1e-4)
    opt_t = torch.optim.ASGD(model_t.parameters(), **hp)
    scaler_t = torch.amp.GradScaler(device.type, init_scale=2.0**12, growth_interval=50)
    opt_x = torchext.optim.ASGD(model_x.parameters(), **hp)
    scaler_x = torchext.amp.GradScaler(init_scale=2.0**12, growth_interval=50)
    loss_fn = torch.nn.CrossEntropyLoss()

    def make_step(model, opt, scaler):
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=amp_dtype):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            if args.clip and isinstance(scaler, torchext.amp.GradScaler):
                # one read of the grads, the clip folded into the fused step
                scaler.clip_and_step(opt, args.clip)
            else:
                if args.clip:
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                scaler.step(opt)
            scaler.update()
            return loss.detach()
        return step

    if args.compile:
        # torchext's recipe: the model compiled, its fused step run as it is.
        model_x_run = torch.compile(model_x)
        # torch's recipe: the model and opt.step compiled.
        model_t_run = torch.compile(model_t)
        opt_t.step = torch.compile(opt_t.step)
    else:
        model_t_run, model_x_run = model_t, model_x
    step_t = make_step(model_t_run, opt_t, scaler_t)
    step_x = make_step(model_x_run, opt_x, scaler_x)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    n_params = sum(p.numel() for p in model_t.parameters())
    print(f"device {device}, autocast {amp_dtype}, {n_params / 1e6:.2f}M parameters, "
          f"torch {torch.__version__}, torchext {torchext.__version__}, "
          f"gradient clipping {args.clip or 'off'}")
    print(f"{'step':>5}  {'torch.optim.ASGD loss':>22}  {'torchext ASGD loss':>19}")
    times_t, times_x = [], []
    for i in range(args.steps):
        j = (i % 16) * args.batch
        x, y = x_all[j:j + args.batch], y_all[j:j + args.batch]
        sync(); t0 = time.perf_counter()
        lt = step_t(x, y)
        sync(); t1 = time.perf_counter()
        lx = step_x(x, y)
        sync(); t2 = time.perf_counter()
        if i >= 5:  # skip warm-up (and compilation)
            times_t.append(t1 - t0)
            times_x.append(t2 - t1)
        if i % max(args.steps // 10, 1) == 0 or i == args.steps - 1:
            print(f"{i:>5}  {lt.item():>22.5f}  {lx.item():>19.5f}")
    with torch.no_grad(), torch.autocast(device.type, dtype=amp_dtype):
        acc_t = (model_t(x_all).argmax(1) == y_all).float().mean().item()
        acc_x = (model_x(x_all).argmax(1) == y_all).float().mean().item()
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    print(f"train accuracy: torch {acc_t:.3f}, torchext {acc_x:.3f}")
    print(f"scale: torch {scaler_t.get_scale():g}, torchext {scaler_x.get_scale():g}; "
          f"skipped steps (torchext): {scaler_x.num_skipped_steps()}")
    print(f"median train-step time: torch {med(times_t) * 1e3:.2f} ms, torchext "
          f"{med(times_x) * 1e3:.2f} ms -> torchext is {med(times_t) / med(times_x):.2f}x "
          f"the speed of torch (whole step: forward, backward, scaler, clip, optimizer)")


if __name__ == "__main__":
    main()
