"""torchext under torch.distributed: DDP, FSDP2 (DTensor parameters), found_inf
synchronised across ranks, and distributed checkpoints.

Every test spawns 2 CPU processes on the gloo backend (loopback only) and
compares them with single-process torch (``torch.optim.ASGD`` +
``torch.amp.GradScaler``) on the same global batch. Each spawn runs under a
deadline and gloo collectives under a timeout, so a hang fails the test
instead of the suite.
"""
import datetime
import os
import runpy
import socket
import time

import pytest
import torch
import torch.distributed as dist

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

import torchext  # noqa: E402
import helpers  # noqa: E402

WORLD = 2
SPAWN_TIMEOUT_S = 60
HP = dict(lr=0.05, lambd=1e-3, alpha=0.75, t0=3.0, weight_decay=1e-3)  # t0 small: mu < 1 soon
SCALER = dict(init_scale=2.0**10, growth_interval=3)
GLOBAL_BATCH = 16
EXAMPLE = os.path.join(helpers.SRC, "examples", "distributed_train.py")


# ------------------------------------------------------------------ harness

def _free_ports(n):
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:  # all bound at once: n distinct ports
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _entry(rank, world, ports, scenario, tmpdir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[0]),
                      RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if os.path.isdir("/sys/class/net/lo"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    if scenario == "example":  # the example initializes the process group itself
        return _run_example(tmpdir, ports)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=SPAWN_TIMEOUT_S // 2))
    try:
        # A name from SCENARIOS, or a scenario function of another test module.
        (SCENARIOS[scenario] if isinstance(scenario, str) else scenario)(rank, world, tmpdir)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _start_method():
    # forkserver: the ranks are forked from a clean server process that
    # imported torch once for all the tests (not from pytest's process, whose
    # OpenMP pool a fork would break); spawn where there is no forkserver.
    if "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    mp.set_forkserver_preload(["torch", "torchext", "torch.distributed.fsdp",
                               "torch.distributed.checkpoint", "torch.nn.parallel", __name__])
    return "forkserver"


def _spawn(scenario, tmp_path):
    ctx = mp.start_processes(_entry, args=(WORLD, _free_ports(3), scenario, str(tmp_path)),
                             nprocs=WORLD, join=False, start_method=_start_method())
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not ctx.join(timeout=1.0):  # raises with the worker's traceback on failure
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"{scenario}: {WORLD} ranks did not finish in {SPAWN_TIMEOUT_S} s")


# ------------------------------------------------------------ model and data

def _model():
    torch.manual_seed(0)
    # Linear(3, 1) gives FSDP2 uneven shards: rank 1 holds an empty one.
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3),
                               torch.nn.Tanh(), torch.nn.Linear(3, 1))


def _batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randn(GLOBAL_BATCH, 1, generator=g)


def _local(t, rank, world):
    n = t.shape[0] // world
    return t[rank * n:(rank + 1) * n]


def _reference(steps, inject=None):
    """Single process, torch's ASGD and GradScaler on the global batch.
    inject(step, named_grads) may poison gradients (full tensors)."""
    model = _model()
    opt = torch.optim.ASGD(model.parameters(), foreach=False, **HP)
    scaler = torch.amp.GradScaler("cpu", **SCALER)
    for step in range(steps):
        x, y = _batch(step)
        opt.zero_grad()
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        if inject is not None:
            inject(step, dict(model.named_parameters()))
        scaler.step(opt)
        scaler.update()
    return model, opt, scaler


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _fsdp_model(world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = _model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _torchext(model, process_group="world", capturable=False):
    opt = torchext.optim.ASGD(model.parameters(), capturable=capturable, **HP)
    group = dist.group.WORLD if process_group == "world" else process_group
    scaler = torchext.amp.GradScaler(process_group=group, **SCALER)
    return opt, scaler


def _train_step(model, opt, scaler, step, rank, world, inject=None, clip=False):
    x, y = _batch(step)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(_local(x, rank, world)), _local(y, rank, world))
    scaler.scale(loss).backward()
    if inject is not None:
        inject(step, rank, model)
    if clip:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e3)
    scaler.step(opt)
    scaler.update()


def _assert_matches_reference(model, opt, scaler, ref_model, ref_opt, ref_scaler):
    ref_params = dict(ref_model.named_parameters())
    for name, p in model.named_parameters():
        name = name.removeprefix("module.")
        ref = ref_params[name]
        torch.testing.assert_close(_full(p.detach()), ref.detach(), rtol=2e-5, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")
        st, ref_st = opt.state[p], ref_opt.state[ref]
        torch.testing.assert_close(_full(st["ax"]), ref_st["ax"], rtol=2e-5, atol=1e-6,
                                   msg=lambda m: f"{name} ax: {m}")
        for key in ("step", "eta", "mu"):
            assert not hasattr(st[key], "full_tensor"), f"{key} should be a plain tensor"
            torch.testing.assert_close(st[key], ref_st[key].to(st[key].dtype), rtol=1e-6,
                                       atol=0, msg=lambda m: f"{name} {key}: {m}")
    assert scaler.get_scale() == ref_scaler.get_scale()
    assert scaler._get_growth_tracker() == ref_scaler._get_growth_tracker()


def _assert_same_on_all_ranks(t):
    t = t.detach().reshape(-1).float()
    gathered = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, t)
    for other in gathered[1:]:
        assert torch.equal(other, gathered[0]), gathered


# ---------------------------------------------------------------- scenarios

STEPS = 8


def _scenario_ddp(rank, world, tmpdir):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model())
    opt, scaler = _torchext(model)
    for step in range(STEPS):
        _train_step(model, opt, scaler, step, rank, world)
    _assert_matches_reference(model, opt, scaler, *_reference(STEPS))


def _scenario_fsdp(rank, world, tmpdir):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    from torch.distributed.tensor import DTensor

    model = _fsdp_model(world)
    opt, scaler = _torchext(model)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    for step in range(STEPS):
        _train_step(model, opt, scaler, step, rank, world, clip=step % 3 == 1)
    for p in model.parameters():
        ax = opt.state[p]["ax"]
        assert isinstance(ax, DTensor) and ax.placements == p.placements
    ref_model, ref_opt, ref_scaler = _reference(STEPS)
    _assert_matches_reference(model, opt, scaler, ref_model, ref_opt, ref_scaler)

    # A full (consolidated) optimizer state_dict is torch.optim.ASGD's, by name.
    full = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    for name, ref in ref_model.named_parameters():
        for key, value in ref_opt.state[ref].items():
            got = full["state"][name][key]
            assert type(got) is torch.Tensor and got.dtype == value.dtype, (name, key)
            torch.testing.assert_close(got, value, rtol=2e-5, atol=1e-6)

    # Plain (unsharded) state loaded straight into a DTensor optimizer is refused
    # with a pointer to set_optimizer_state_dict, not stepped on wrong shapes.
    opt.load_state_dict(ref_opt.state_dict())
    x, y = _batch(STEPS)
    torch.nn.functional.mse_loss(model(_local(x, rank, world)), _local(y, rank, world)).backward()
    try:
        opt.step()
    except TypeError as e:
        assert "set_optimizer_state_dict" in str(e)
    else:
        raise AssertionError("a plain 'ax' for a DTensor parameter was accepted")
    _check_partial_grad(rank, world)


def _check_partial_grad(rank, world):
    """A gradient laid out unlike its parameter (Partial: each rank holds a
    summand) is reduced to the parameter's layout before the local update."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(12.0).reshape(4, 3)
    grads = [torch.full((4, 3), float(r + 1)) for r in range(world)]  # summands per rank
    p = torch.nn.Parameter(distribute_tensor(full, mesh, [Shard(0)]))
    p.grad = DTensor.from_local(grads[rank], mesh, [Partial()])
    opt = torchext.optim.ASGD([p], **HP)
    opt.step()
    ref_p = torch.nn.Parameter(full.clone())
    ref_p.grad = sum(grads)
    ref_opt = torch.optim.ASGD([ref_p], foreach=False, **HP)
    ref_opt.step()
    torch.testing.assert_close(p.full_tensor(), ref_p.detach())
    torch.testing.assert_close(opt.state[p]["ax"].full_tensor(), ref_opt.state[ref_p]["ax"])


# One rank only sees the overflow: step 2 on rank 1 (fused path), step 4 on
# rank 0 after unscale_ (clipping path). The full-tensor element poisoned in
# the reference is the one the rank holds in its shard.
_POISON = {2: (1, float("inf")), 4: (0, float("nan"))}


def _poison_local(step, rank, model):
    if step in _POISON and _POISON[step][0] == rank:
        grad = model[0].weight.grad.to_local()
        grad[0, 0] = _POISON[step][1]


def _poison_full(step, named):
    if step in _POISON:
        owner = _POISON[step][0]
        rows = named["0.weight"].shape[0] // WORLD
        named["0.weight"].grad[owner * rows, 0] = _POISON[step][1]


class _NoHostSync:
    """Fails on Tensor.item() (the host sync a skip decision must not take)."""

    def __enter__(self):
        self._item = torch.Tensor.item

        def item(t):
            raise AssertionError("host sync (Tensor.item) in scaler.step/update")
        torch.Tensor.item = item

    def __exit__(self, *exc):
        torch.Tensor.item = self._item


def _scenario_overflow(rank, world, tmpdir):
    model = _fsdp_model(world)
    # No process_group: with DTensor grads the scaler must fall back to the
    # default group by itself (as ShardedGradScaler), or the ranks diverge.
    # capturable=True: the skip is decided on the device, no host read.
    opt, scaler = _torchext(model, process_group=None, capturable=True)
    for step in range(STEPS):
        before = [t.detach().clone() for p in model.parameters()
                  for t in (p.to_local(), *(opt.state[p].values() if p in opt.state else ()))]
        x, y = _batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(_local(x, rank, world)), _local(y, rank, world))
        scaler.scale(loss).backward()
        _poison_local(step, rank, model)
        clip = step == 4
        if clip:
            with _NoHostSync():
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e3)
        with _NoHostSync():
            scaler.step(opt)
            scaler.update()
        skipped = step in _POISON
        assert bool(scaler.last_step_skipped) == skipped, (rank, step)
        _assert_same_on_all_ranks(scaler._scale)
        _assert_same_on_all_ranks(scaler._growth_tracker)
        if skipped:
            after = [t.detach() for p in model.parameters()
                     for t in (p.to_local(), *opt.state[p].values())]
            assert all(torch.equal(a, b) for a, b in zip(before, after)), \
                f"rank {rank} changed its shards on skipped step {step}"
    assert scaler.num_skipped_steps() == len(_POISON)
    _assert_matches_reference(model, opt, scaler, *_reference(STEPS, inject=_poison_full))


def _checkpoint_state(model, opt, scaler):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, opt)
    return {"model": model_sd, "optim": optim_sd, "scaler": scaler.state_dict()}


def _snapshot(model, opt, scaler):
    out = {name: _full(p.detach()).clone() for name, p in model.named_parameters()}
    for name, p in model.named_parameters():
        for key, v in opt.state[p].items():
            out[f"{name}.{key}"] = _full(v).clone()
    out.update(scale=scaler._scale.clone(), growth=scaler._growth_tracker.clone(),
               skipped=scaler._skipped_steps.clone())
    return out


def _scenario_checkpoint(rank, world, tmpdir):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel as DDP

    save_at, total = 4, 8
    for kind in ("fsdp", "ddp"):
        def build():
            return _fsdp_model(world) if kind == "fsdp" else DDP(_model())

        path = os.path.join(tmpdir, kind)
        model = build()
        opt, scaler = _torchext(model)
        for step in range(total):
            if step == save_at:
                dcp.save(_checkpoint_state(model, opt, scaler), checkpoint_id=path)
            _train_step(model, opt, scaler, step, rank, world,
                        inject=_poison_local if kind == "fsdp" else None)
        expected = _snapshot(model, opt, scaler)

        # A fresh run, different initial weights and scale: all must come from the checkpoint.
        with torch.random.fork_rng():
            torch.manual_seed(123)
            model = build()
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(0.5)
        opt = torchext.optim.ASGD(model.parameters(), **HP)
        scaler = torchext.amp.GradScaler(process_group=dist.group.WORLD, init_scale=7.0)
        state = _checkpoint_state(model, opt, scaler)
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        scaler.load_state_dict(state["scaler"])
        for p in model.parameters():
            st = opt.state[p]
            assert isinstance(st["ax"], DTensor) == (kind == "fsdp")
            assert not isinstance(st["step"], DTensor) and st["step"].dtype == torch.float32
            assert st["step"].item() == save_at - (kind == "fsdp")  # one step was skipped
        for step in range(save_at, total):
            _train_step(model, opt, scaler, step, rank, world,
                        inject=_poison_local if kind == "fsdp" else None)
        got = _snapshot(model, opt, scaler)
        assert got.keys() == expected.keys()
        for key in expected:
            assert torch.equal(got[key], expected[key]), f"{kind} {key} differs after resume"
        assert scaler.num_skipped_steps() == (len(_POISON) if kind == "fsdp" else 0)


def _run_example(tmpdir, ports):
    """examples/distributed_train.py as torchrun runs it (env:// rendezvous):
    train, save; resume and finish; the same as training straight through."""
    main = runpy.run_path(EXAMPLE, run_name="distributed_train")["main"]
    ckpt = os.path.join(tmpdir, "ckpt")

    def run(port, *argv):
        # A fresh rendezvous port per run: a rank that re-initializes first
        # must not meet the previous run's store.
        os.environ["MASTER_PORT"] = str(port)
        return main(list(argv))

    run(ports[0], "--steps", "6", "--ckpt-dir", ckpt)
    resumed = run(ports[1], "--steps", "4", "--ckpt-dir", ckpt, "--resume")
    straight = run(ports[2], "--steps", "10")
    assert resumed == straight, (resumed, straight)


def _scenario_fsdp_fused_clip(rank, world, tmpdir):
    """scaler.clip_grad_norm_ on sharded grads: the global norm (each rank's
    partial sum all-reduced), the same on every rank, equal to torch's recipe
    on the global batch; clipping active, 2-norm and inf-norm steps."""
    model = _fsdp_model(world)
    opt, scaler = _torchext(model)
    orders = [2.0 if step % 2 else float("inf") for step in range(STEPS)]
    norms = []
    for step in range(STEPS):
        x, y = _batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(_local(x, rank, world)),
                                            _local(y, rank, world))
        scaler.scale(loss).backward()
        norms.append(scaler.clip_grad_norm_(opt, 0.05, orders[step]))
        _assert_same_on_all_ranks(norms[-1])
        scaler.step(opt)
        scaler.update()
    ref_model = _model()
    ref_opt = torch.optim.ASGD(ref_model.parameters(), foreach=False, **HP)
    ref_scaler = torch.amp.GradScaler("cpu", **SCALER)
    for step in range(STEPS):
        x, y = _batch(step)
        ref_opt.zero_grad()
        ref_scaler.scale(torch.nn.functional.mse_loss(ref_model(x), y)).backward()
        ref_scaler.unscale_(ref_opt)
        ref_norm = torch.nn.utils.clip_grad_norm_(ref_model.parameters(), 0.05, orders[step])
        assert ref_norm > 0.05  # clipping is active
        assert type(norms[step]) is torch.Tensor
        torch.testing.assert_close(norms[step], ref_norm, rtol=1e-5, atol=0)
        ref_scaler.step(ref_opt)
        ref_scaler.update()
    _assert_matches_reference(model, opt, scaler, ref_model, ref_opt, ref_scaler)


def _scenario_bf16_reshard(rank, world, tmpdir):
    """bf16 FSDP2 parameters: ax float32 (sharded), saved with DCP, loaded
    into another sharding (a plain replicated model on every rank): ax stays
    float32 and holds the same values; training then goes on alike. With
    stochastic rounding, whose seed the checkpoint carries: the resharded
    run rounds every element as the sharded one (its bits are keyed by the
    element's index in the full tensor, not in the shard)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def fsdp_bf16():
        mesh = init_device_mesh("cpu", (world,))
        model = _model().to(torch.bfloat16)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def step(model, opt, k, local):
        x, y = _batch(k)
        if local:
            x, y = _local(x, rank, world), _local(y, rank, world)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x.bfloat16()).float(), y).backward()
        opt.step()

    path = os.path.join(tmpdir, "bf16")
    model = fsdp_bf16()
    opt = torchext.optim.ASGD(model.parameters(), stochastic_rounding=True, rounding_seed=5, **HP)
    for k in range(4):
        step(model, opt, k, local=True)
    assert all(_full(opt.state[p]["ax"]).dtype == torch.float32 for p in model.parameters())
    saved_ax = {n: _full(opt.state[p]["ax"]).clone() for n, p in model.named_parameters()}
    dcp.save(_checkpoint_state(model, opt, torchext.amp.GradScaler(enabled=False)),
             checkpoint_id=path)
    # Resharded: a plain bf16 model on every rank (the full tensors).
    plain = _model().to(torch.bfloat16)
    popt = torchext.optim.ASGD(plain.parameters(), **HP)
    state = _checkpoint_state(plain, popt, torchext.amp.GradScaler(enabled=False))
    dcp.load(state, checkpoint_id=path)
    set_state_dict(plain, popt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for name, p in plain.named_parameters():
        ax = popt.state[p]["ax"]
        assert ax.dtype == torch.float32, (name, ax.dtype)
        assert torch.equal(ax, saved_ax[name]), name
    assert all(g["average_dtype"] == "float32" for g in popt.param_groups)
    assert all(g["stochastic_rounding"] and g["rounding_seed"] == 5 for g in popt.param_groups)

    # The same full gradients on both: the sharded and the resharded runs
    # round alike, bit for bit (uneven shards, an empty one included).
    from torch.distributed.tensor import distribute_tensor
    for k in range(3):
        gen = torch.Generator().manual_seed(50 + k)
        for p, q in zip(model.parameters(), plain.parameters()):
            full = (torch.randn(p.shape, generator=gen) * 1e-2).bfloat16()
            q.grad = full.clone()
            p.grad = distribute_tensor(full, p.device_mesh, p.placements)
        opt.step()
        popt.step()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert torch.equal(_full(p.detach()), q.detach()), name
        assert torch.equal(_full(opt.state[p]["ax"]), popt.state[q]["ax"]), name


SCENARIOS = {
    "bf16_reshard": _scenario_bf16_reshard,
    "ddp": _scenario_ddp,
    "fsdp_fused_clip": _scenario_fsdp_fused_clip,
    "fsdp": _scenario_fsdp,
    "overflow": _scenario_overflow,
    "checkpoint": _scenario_checkpoint,
}


# -------------------------------------------------------------------- tests

def test_ddp_matches_single_process(tmp_path):
    """DDP on 2 ranks, torchext ASGD + GradScaler == torch on the global batch."""
    _spawn("ddp", tmp_path)


def test_fsdp2_matches_single_process(tmp_path):
    """FSDP2 (DTensor params, uneven and empty shards, unscale_ + clipping on
    some steps) == torch on the global batch; ax is sharded like the param."""
    _spawn("fsdp", tmp_path)


def test_fsdp2_fused_clip_gives_the_global_norm(tmp_path):
    """GradScaler.clip_grad_norm_ with DTensor grads: the global norm on every
    rank, and the training of torch's unscale_ + clip_grad_norm_ recipe."""
    _spawn("fsdp_fused_clip", tmp_path)


def test_one_rank_overflow_skips_on_every_rank(tmp_path):
    """An inf/NaN in one rank's gradient shard makes every rank skip the step
    and back off the scale identically, with no Tensor.item() in the scaler."""
    _spawn("overflow", tmp_path)


def test_checkpoint_resume_continues_identically(tmp_path):
    """torch.distributed.checkpoint of model + optimizer + scaler on 2 ranks
    (FSDP2 and DDP) resumes bit-for-bit."""
    _spawn("checkpoint", tmp_path)


def test_bf16_fsdp2_checkpoint_resharded_keeps_the_float32_average(tmp_path):
    _spawn("bf16_reshard", tmp_path)


def test_example_trains_saves_and_resumes(tmp_path):
    """examples/distributed_train.py (FSDP2 + torchext on gloo): a run saved
    and resumed ends with the same loss as one run straight through."""
    _spawn("example", tmp_path)
