"""The main job's clipped training (examples/train_demo.py's model and data,
bf16 autocast, CPU, one thread): torchext's fused clip against torch's recipe,
next to the noise torch's own rounding choices make (torch's recipe with its
per-tensor norms in float64 instead of float32), at a growth interval that
takes the loss scale up to 2**127.

    python scripts/clip_noise.py [--clip 0.25] [--growth-interval 1] [--steps 300]

Prints, per setup, the loss at steps 100 and the last, the mean of the last
50 and the accuracy, and the largest and mean loss difference to torch's
recipe of each of the other two (docs/benchmarks.md has a run).
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import train_demo as demo  # noqa: E402  (the main job's model and data)

import torchext  # noqa: E402


def run(kind, clip, growth_interval, steps, batch=256, width=256):
    dim, classes = 32, 10
    x_all, y_all = demo.make_data(batch * 16, dim, classes, torch.device("cpu"))
    model = demo.make_model(dim, width, classes, torch.device("cpu"))
    hp = dict(lr=0.5, lambd=1e-4, alpha=0.75, t0=100, weight_decay=1e-4)
    skw = dict(init_scale=2.0 ** 12, growth_interval=growth_interval)
    if kind == "torchext":
        opt = torchext.optim.ASGD(model.parameters(), **hp)
        scaler = torchext.amp.GradScaler(**skw)
    else:
        opt = torch.optim.ASGD(model.parameters(), foreach=False, **hp)
        scaler = torch.amp.GradScaler("cpu", **skw)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses, top = [], 0.0
    for s in range(steps):
        i = s % 16 * batch
        x, y = x_all[i:i + batch], y_all[i:i + batch]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        if kind == "torchext":
            scaler.clip_grad_norm_(opt, clip)
        else:
            scaler.unscale_(opt)
            if kind == "torch":
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            else:  # torch's recipe, its per-tensor norms in float64
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                norms = torch.stack([torch.linalg.vector_norm(g.double()) for g in grads])
                coef = torch.clamp(clip / (torch.linalg.vector_norm(norms).float() + 1e-6),
                                   max=1.0)
                torch._foreach_mul_(grads, coef)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        top = max(top, scaler.get_scale())
    with torch.no_grad():
        acc = (model(x_all).argmax(1) == y_all).float().mean().item()
    return losses, top, acc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip", type=float, default=0.25)
    ap.add_argument("--growth-interval", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    res = {k: run(k, args.clip, args.growth_interval, args.steps)
           for k in ("torch", "torch, float64 norms", "torchext")}
    ref = res["torch"][0]
    print(f"max_norm {args.clip}, growth interval {args.growth_interval}: the largest scale "
          f"{max(r[1] for r in res.values()):.3g}")
    for k, (losses, _, acc) in res.items():
        diff = [abs(a - b) for a, b in zip(losses, ref)]
        print(f"  {k:21s} loss@100 {losses[min(99, len(losses) - 1)]:.5f} last {losses[-1]:.5f} "
              f"mean(last 50) {statistics.mean(losses[-50:]):.5f} acc {acc:.4f} "
              f"| vs torch: max {max(diff):.3g}, mean {statistics.mean(diff):.3g}")


if __name__ == "__main__":
    main()
