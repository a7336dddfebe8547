"""``scale_loss`` and ``disable_casts``: what runs around each backward."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from ._amp_state import _amp_state, _local, _require_state
from ._casting import _model_device_type
from ._process_optimizer import _stash


def _optimizer_list(optimizers) -> list[torch.optim.Optimizer]:
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    return list(optimizers)


def _grad_params(opt) -> Iterator[torch.nn.Parameter]:
    for group in opt.param_groups:
        yield from group["params"]


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False,
               delay_overflow_check=False):
    """apex's ``amp.scale_loss``: yields ``loss.float() * scale``.

    On exit (unless ``delay_unscale``) the gradients produced inside the
    block are unscaled in place and checked for inf/NaN at once (so clipping
    after the block sees real gradients; in O2 clip ``amp.master_params``),
    gradients already there before the block are kept and added back, and
    this loss's scale is updated on the device. After an overflow the next
    ``optimizer.step()`` of these optimizers is a no-op.

    ``delay_unscale=True`` leaves the gradients scaled (gradient
    accumulation): the last backward before ``step()`` must use the default
    ``False``. ``model`` is unused, as in apex. ``delay_overflow_check`` is
    accepted and has no effect: the check already runs on the device, and a
    step with an overflow is always skipped.
    """
    st = _require_state("'with amp.scale_loss'")
    if not st.opt_properties["enabled"]:
        yield loss
        return
    opts = _optimizer_list(optimizers)
    stashes = [_stash(o) for o in opts]
    if not 0 <= loss_id < len(st.loss_scalers):
        raise IndexError(f"loss_id {loss_id} is out of range: amp.initialize was called with "
                         f"num_losses={len(st.loss_scalers)}; pass num_losses=N to it for N "
                         "losses with their own scales.")
    ls = st.loss_scalers[loss_id]
    if ls.passthrough:
        yield loss.float()
        return

    # Gradients already there (another loss's, unscaled) are set aside so that
    # only this backward's gradients get unscaled; they are added back on exit.
    for opt, stash in zip(opts, stashes):
        if not stash.grads_are_scaled and stash.stashed is None:
            stashed = {}
            for p in _grad_params(opt):
                if p.grad is not None:
                    stashed[id(p)] = p.grad
                    p.grad = None
            for p in stash.model_half_params():
                p.grad = None  # already copied into the masters (or stale)
            stash.stashed = stashed

    try:
        yield ls.scaler.scale(loss.float())
    except BaseException:
        # The block failed (e.g. in backward): drop its partial, scaled grads
        # and put back the ones set aside, as if the block had not run.
        for opt, stash in zip(opts, stashes):
            if not stash.grads_are_scaled and stash.stashed is not None:
                for p in _grad_params(opt):
                    p.grad = stash.stashed.get(id(p))
                stash.stashed = None
        raise

    if delay_unscale:
        for stash in stashes:
            stash.grads_are_scaled = True
        return
    scaler = ls.scaler
    unscaled = []
    with torch.no_grad():
        for opt, stash in zip(opts, stashes):
            for p, master in stash.master_pairs:
                master.grad = None if p.grad is None else p.grad.to(torch.float32, copy=True)
            if any(p.grad is not None for p in _grad_params(opt)):
                scaler.unscale_(opt)
                unscaled.append(opt)
    found = None
    if unscaled:
        for opt in unscaled:
            f = scaler.found_inf(opt)
            found = f.clone() if found is None else found + f
        scaler.update()  # this loss's scale, on the device
    with torch.no_grad():
        for opt, stash in zip(opts, stashes):
            stashed, stash.stashed = stash.stashed or {}, None
            stash.grads_are_scaled = False
            if stashed:
                for p in _grad_params(opt):
                    old = stashed.get(id(p))
                    if old is not None:
                        if p.grad is None:
                            p.grad = old
                        else:
                            p.grad.add_(old)
            if found is not None:
                stash.pending = found if stash.pending is None else stash.pending + found


@contextlib.contextmanager
def disable_casts():
    """Runs the block without amp's casts: autocast is disabled (on CPU, on
    CUDA when present, and on the models' devices), O1 forwards do not turn
    it back on, and registered half/float/promote functions run uncast."""
    device_types = {"cpu"}
    if torch.cuda.is_available():
        device_types.add("cuda")
    for model in _amp_state.models:
        device_types.add(_model_device_type(model))
    _local.disabled = getattr(_local, "disabled", 0) + 1
    try:
        with contextlib.ExitStack() as stack:
            for dt in sorted(device_types):
                stack.enter_context(torch.autocast(dt, enabled=False))
            yield
    finally:
        _local.disabled -= 1
