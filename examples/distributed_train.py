"""Distributed training with FSDP2 + torchext's fused ASGD and GradScaler.

    torchrun --nproc_per_node=2 examples/distributed_train.py
    torchrun --nproc_per_node=2 examples/distributed_train.py --ckpt-dir /tmp/ckpt
    torchrun --nproc_per_node=2 examples/distributed_train.py --ckpt-dir /tmp/ckpt --resume

Runs on CPU with gloo, and on GPUs with NCCL (one GPU per process, fp16
autocast) when CUDA is available. Nothing torchext-specific is needed for
distribution: torch's ``fully_shard`` shards the parameters (DTensors),
torchext's ASGD updates each rank's shard in one fused op, and the
GradScaler all-reduces its inf/NaN flag over ``process_group`` so that all
ranks skip an overflowed step together. Checkpoints use
``torch.distributed.checkpoint`` (each rank writes its shards).
"""
import argparse
import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import torchext


def build_model(device):
    torch.manual_seed(0)  # same initial weights on every rank
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(),
        torch.nn.Linear(64, 64), torch.nn.GELU(),
        torch.nn.Linear(64, 1),
    ).to(device)


def batch(step, rank, world, device, per_rank=32):
    """This rank's slice of a global batch that is the same for any world size."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(per_rank * world, 32, generator=g)
    y = torch.tanh(x[:, :8].sum(dim=1, keepdim=True) / 4)  # a function to learn
    sl = slice(rank * per_rank, (rank + 1) * per_rank)
    return x[sl].to(device), y[sl].to(device)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--ckpt-dir", default=None,
                        help="save model + optimizer + scaler here at the end")
    parser.add_argument("--resume", action="store_true", help="start from --ckpt-dir")
    args = parser.parse_args(argv)

    use_cuda = torch.cuda.is_available() and dist.is_nccl_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    mesh = init_device_mesh(device.type, (world,))
    model = build_model(device)
    for layer in model:  # one FSDP unit per Linear, then the root
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    # Parameters are DTensors sharded on dim 0; ASGD keeps `ax` sharded the
    # same way and step/eta/mu as plain per-parameter scalars.
    optimizer = torchext.optim.ASGD(model.parameters(), lr=args.lr, t0=20)
    # Each rank only sees its own gradient shards: process_group makes the
    # inf/NaN check global (an all-reduce MAX on the device, no host sync).
    scaler = torchext.amp.GradScaler(process_group=dist.group.WORLD)

    start = 0
    if args.resume:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "scaler": scaler.state_dict(),
                 "step": 0}
        dcp.load(state, checkpoint_id=args.ckpt_dir)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        scaler.load_state_dict(state["scaler"])
        start = int(state["step"])

    for step in range(start, start + args.steps):
        x, y = batch(step, rank, world, device)
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=torch.float16, enabled=use_cuda):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # only needed for the clipping below
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        scaler.step(optimizer)  # fused: skipped on the device if any rank overflowed
        scaler.update()
        if step % 10 == 0 or step == start + args.steps - 1:
            loss = loss.detach().float()
            dist.all_reduce(loss)  # SUM (gloo has no AVG)
            mean_loss = loss.item() / world
            if rank == 0:
                print(f"step {step:4d}  loss {mean_loss:.5f}  scale {scaler.get_scale():g}"
                      f"  skipped {scaler.num_skipped_steps()}", flush=True)

    if args.ckpt_dir:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
        dcp.save({"model": model_sd, "optim": optim_sd, "scaler": scaler.state_dict(),
                  "step": start + args.steps},
                 storage_writer=dcp.FileSystemWriter(args.ckpt_dir, overwrite=True))
        if rank == 0:
            print(f"saved {args.ckpt_dir}", flush=True)
    dist.destroy_process_group()
    return mean_loss  # of the last step, over all ranks


if __name__ == "__main__":
    main()
