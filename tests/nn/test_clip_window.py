"""The two-call clip leaves nothing pending: what user code does between
``clip_grad_norm_`` and ``step`` is stepped as torch's recipe steps it.

Two worlds train the same model, call for call:

* torch's: ``torch.optim.ASGD`` or torch's fused AdamW, ``torch.amp.GradScaler``
  (or none), and torch's recipe: ``scaler.unscale_(opt)``,
  ``torch.nn.utils.clip_grad_norm_``, then ``step``;
* torchext's: ``torchext.optim.ASGD`` or the same AdamW,
  ``torchext.amp.GradScaler`` (or none), and the two-call clip
  (``scaler.clip_grad_norm_(opt, ...)``; without a scaler ``opt.clip_grad_norm_``
  or the drop-in), then ``step``.

Between the clip and the step each test runs one of the things user code
does there (issue 46's list: replacing ``.grad``, writes through ``.data``,
a backward that creates or accumulates gradients, ``add_param_group``, a
second clip through the other API, step pre-hooks that edit or read the
gradients, a compiled step, reading the gradients, in-place edits, a
framework's second clip, ``unscale_`` after the optimizer's own clip,
gradients that are views of one flat buffer with a second optimizer). The
params must equal torch's within 1e-5 relative at tensor scale, and no call
may be refused.
"""
import pytest
import torch

import torchext

TOL = 1e-5
MAX_NORM = 0.05


def _close(a, b, what):
    a, b = a.detach().double(), b.detach().double()
    fin = b.isfinite()
    assert torch.equal(a.isfinite(), fin) and torch.equal(a[~fin].nan_to_num(),
                                                          b[~fin].nan_to_num()), what
    a, b = a[fin], b[fin]
    if not fin.any():
        return
    scale = b.abs().max().clamp_min(1e-30)
    err = ((a - b).abs().max() / scale).item()
    assert err <= TOL, f"{what}: relative error {err:.3g}"


class World:
    def __init__(self, ours: bool, opt_kind: str, scaled: bool, init_scale=2.0 ** 16,
                 extra=False):
        torch.manual_seed(0)
        self.ours, self.opt_kind, self.scaled = ours, opt_kind, scaled
        self.model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                                         torch.nn.Linear(8, 3))
        # A parameter with no gradient from the model's loss (a head used
        # only by some losses).
        self.extra = torch.nn.Parameter(torch.randn(3, 3))
        params = list(self.model.parameters()) + ([self.extra] if extra else [])
        self.opt = self.make_opt(params)
        cls = torchext.amp.GradScaler if ours else torch.amp.GradScaler
        self.scaler = cls("cpu", init_scale=init_scale) if scaled else None

    def make_opt(self, params):
        if self.opt_kind == "asgd":
            kw = dict(lr=0.05, lambd=1e-3, t0=2.0, weight_decay=1e-3)
            return (torchext.optim.ASGD(params, **kw) if self.ours
                    else torch.optim.ASGD(params, foreach=False, **kw))
        return torch.optim.AdamW(params, lr=1e-2, fused=True)

    def params(self):
        return [p for g in self.opt.param_groups for p in g["params"]]

    def loss(self, x, y, create_graph=False):
        loss = torch.nn.functional.mse_loss(self.model(x), y) * 10.0
        (self.scaler.scale(loss) if self.scaled else loss).backward(create_graph=create_graph)

    def clip(self, max_norm=MAX_NORM):
        if not self.ours:
            if self.scaled:
                self.scaler.unscale_(self.opt)
            return torch.nn.utils.clip_grad_norm_(self.params(), max_norm)
        if self.scaled:
            return self.scaler.clip_grad_norm_(self.opt, max_norm)
        if isinstance(self.opt, torchext.optim.ASGD):
            return self.opt.clip_grad_norm_(max_norm)
        return torchext.nn.utils.clip_grad_norm_(self.params(), max_norm)

    def step(self):
        if self.scaled:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()


def _data(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)


def run(opt_kind, scaled, between, iterations=3, init_scale=2.0 ** 16, extra=False):
    """Both worlds: loss, clip, ``between(world)``, step; params compared
    after each iteration. Returns the worlds."""
    worlds = [World(True, opt_kind, scaled, init_scale, extra),
              World(False, opt_kind, scaled, init_scale, extra)]
    for it in range(iterations):
        x, y = _data(it)
        norms = []
        for w in worlds:
            w.opt.zero_grad()
            w.loss(x, y)
            norms.append(w.clip())
            between(w)
            w.step()
        _close(norms[0], norms[1], f"iteration {it}: total norm")
        for i, (p, q) in enumerate(zip(worlds[0].params(), worlds[1].params())):
            _close(p, q, f"iteration {it}: param {i}")
    return worlds


KINDS = [("asgd", True), ("asgd", False), ("adamw", True), ("adamw", False)]
IDS = [f"{k}-{'scaler' if s else 'noscaler'}" for k, s in KINDS]


def _grads(w):
    return [p for p in w.params() if p.grad is not None]


# ---------------------------------------------------------------- mechanisms

def replace_clone(w):
    for p in _grads(w):
        p.grad = p.grad.clone()


def replace_detach_relayout(w):
    for p in _grads(w):
        g = p.grad.detach()
        p.grad = g.t().contiguous().t() if g.dim() == 2 else g.clone()


def write_data_inplace(w):
    for p in _grads(w):
        p.grad.data.add_(1e-3)


def assign_data(w):
    for p in _grads(w):
        p.grad.data = p.grad.data * 0.5


def inplace_edit(w):
    for p in _grads(w):
        p.grad.mul_(2.0)


def backward_new_grad(w):
    # A second loss after the clip: creates a gradient for a parameter that
    # had none (w.extra) and accumulates into the model's.
    x, y = _data(100)
    out = w.model(x) @ w.extra
    loss = torch.nn.functional.mse_loss(out, y)
    (w.scaler.scale(loss) if w.scaled else loss).backward()


def backward_create_graph(w):
    x, y = _data(101)
    loss = torch.nn.functional.mse_loss(w.model(x), y)
    (w.scaler.scale(loss) if w.scaled else loss).backward(create_graph=True)
    for p in _grads(w):  # (the step reads plain values either way)
        p.grad = p.grad.detach()


def read_grads(w):
    # Logging the clipped gradients: both worlds must read the same values.
    w.read = torch.cat([p.grad.reshape(-1) for p in _grads(w)]).clone()


def framework_clips_again(w):
    # A framework callback that clips again with torch's own function.
    torch.nn.utils.clip_grad_norm_(w.params(), MAX_NORM / 3)


MECHANISMS = {
    "replace .grad (clone)": replace_clone,
    "replace .grad (detach, re-layout)": replace_detach_relayout,
    "write through .data": write_data_inplace,
    "assign .data": assign_data,
    "in-place edit": inplace_edit,
    "backward with create_graph": backward_create_graph,
    "read the clipped grads": read_grads,
    "a framework clips again": framework_clips_again,
}


@pytest.mark.parametrize("mechanism", list(MECHANISMS))
@pytest.mark.parametrize("kind,scaled", KINDS, ids=IDS)
def test_user_code_between_clip_and_step(kind, scaled, mechanism):
    worlds = run(kind, scaled, MECHANISMS[mechanism])
    if mechanism == "read the clipped grads":
        _close(worlds[0].read, worlds[1].read, "the grads read between clip and step")


@pytest.mark.parametrize("kind,scaled", KINDS, ids=IDS)
def test_backward_after_clip_creates_a_grad(kind, scaled):
    worlds = run(kind, scaled, backward_new_grad, extra=True)
    assert worlds[0].extra.grad is not None


@pytest.mark.parametrize("kind,scaled", KINDS, ids=IDS)
def test_add_param_group_between_clip_and_step(kind, scaled):
    def add_group(w):
        if any(len(g["params"]) == 1 and g["params"][0] is w.extra for g in w.opt.param_groups):
            return
        # A new group whose gradient the clip never measured: stepped as it is.
        w.extra.grad = torch.full_like(w.extra, 0.25)
        w.opt.add_param_group({"params": [w.extra], "lr": 0.01})

    run(kind, scaled, add_group, extra=False)


@pytest.mark.parametrize("kind", ["asgd", "adamw"])
def test_step_pre_hook_edits_and_reads_the_grads(kind):
    for scaled in (True, False):
        def between(w):
            if getattr(w, "hooked", False):
                return
            w.hooked = True
            norms = []

            def hook(opt, args, kwargs):
                grads = [p.grad for g in opt.param_groups for p in g["params"]
                         if p.grad is not None]
                norms.append(torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(g) for g in grads])))
                for g in grads:
                    g.add_(1e-3)  # an edit: not divided by the scale afterwards
                for group in opt.param_groups:  # an lr from the norm read
                    group["lr"] = 0.05 / (1.0 + float(norms[-1]))

            w.norms = norms
            w.opt.register_step_pre_hook(hook)

        worlds = run(kind, scaled, between)
        for a, b in zip(worlds[0].norms, worlds[1].norms):
            _close(a, b, "the norm a pre-hook read")


def test_two_clips_through_the_two_apis():
    # scaler.clip_grad_norm_ then opt.clip_grad_norm_ (torchext's ASGD), and
    # the reverse: each applies when called, as torch's recipe's two clips.
    def second_clip(w):
        if w.ours:
            w.opt.clip_grad_norm_(MAX_NORM / 4)
        else:
            torch.nn.utils.clip_grad_norm_(w.params(), MAX_NORM / 4)

    run("asgd", True, second_clip)

    worlds = [World(True, "asgd", True), World(False, "asgd", True)]
    for it in range(3):
        x, y = _data(it)
        for w in worlds:
            w.opt.zero_grad()
            w.loss(x, y)
            if w.ours:  # the optimizer's own clip of scaled grads, then the scaler's
                w.opt.clip_grad_norm_(1e6)
                w.scaler.clip_grad_norm_(w.opt, MAX_NORM)
            else:
                torch.nn.utils.clip_grad_norm_(w.params(), 1e6)
                w.scaler.unscale_(w.opt)
                torch.nn.utils.clip_grad_norm_(w.params(), MAX_NORM)
            w.step()
        for p, q in zip(worlds[0].params(), worlds[1].params()):
            _close(p, q, f"iteration {it}")


def test_unscale_after_the_optimizers_own_clip():
    worlds = [World(True, "asgd", True), World(False, "asgd", True)]
    for it in range(3):
        x, y = _data(it)
        for w in worlds:
            w.opt.zero_grad()
            w.loss(x, y)
            if w.ours:
                w.opt.clip_grad_norm_(1e5)  # of the scaled grads
            else:
                torch.nn.utils.clip_grad_norm_(w.params(), 1e5)
            w.scaler.unscale_(w.opt)
            w.step()
        for p, q in zip(worlds[0].params(), worlds[1].params()):
            _close(p, q, f"iteration {it}")


def test_eager_clip_then_compiled_step():
    worlds = run("asgd", False, lambda w: None, iterations=1)  # warm state
    steps = [torch.compile(w.opt.step) for w in worlds]
    for it in range(1, 3):
        x, y = _data(it)
        for w, step in zip(worlds, steps):
            w.opt.zero_grad()
            w.loss(x, y)
            w.clip()
            for p in _grads(w):  # user code between: an in-place edit
                p.grad.mul_(0.5)
            step()
        for p, q in zip(worlds[0].params(), worlds[1].params()):
            _close(p, q, f"iteration {it}")


def test_grads_as_views_of_one_flat_buffer_with_two_optimizers():
    # DDP's gradient_as_bucket_view=True: every grad a view of one buffer;
    # a second optimizer on the same scaler.
    def world(ours):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                                    torch.nn.Linear(8, 3))
        params = list(model.parameters())
        kw = dict(lr=0.05, lambd=1e-3, t0=2.0)
        mk = ((lambda ps: torchext.optim.ASGD(ps, **kw)) if ours
              else (lambda ps: torch.optim.ASGD(ps, foreach=False, **kw)))
        opts = [mk(params[:2]), mk(params[2:])]
        cls = torchext.amp.GradScaler if ours else torch.amp.GradScaler
        flat = torch.zeros(sum(p.numel() for p in params))
        views, off = [], 0
        for p in params:
            views.append(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
        return model, params, opts, cls("cpu", init_scale=2.0 ** 10), flat, views

    worlds = [world(True), world(False)]
    for it in range(3):
        x, y = _data(it)
        for ours, (model, params, opts, scaler, flat, views) in zip((True, False), worlds):
            flat.zero_()
            for p, v in zip(params, views):
                p.grad = v
            loss = torch.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            assert all(p.grad.data_ptr() == v.data_ptr() for p, v in zip(params, views))
            if ours:
                scaler.clip_grad_norm_(opts[0], MAX_NORM)
            else:
                scaler.unscale_(opts[0])
                torch.nn.utils.clip_grad_norm_(params[:2], MAX_NORM)
            for o in opts:
                scaler.step(o)
            scaler.update()
        for p, q in zip(worlds[0][1], worlds[1][1]):
            _close(p, q, f"iteration {it}")


def test_top_scale_between_clip_and_step():
    # At 2**100 (bf16/fp32 grads let torch's scaler climb there) the two-call
    # clip is exact: the unscale and the clip rounded one after the other.
    run("asgd", True, inplace_edit, init_scale=2.0 ** 100)
    run("adamw", True, replace_clone, init_scale=2.0 ** 100)


def test_the_record_after_the_two_call_clip_is_torchs():
    w = World(True, "asgd", True)
    t = World(False, "asgd", True)
    x, y = _data(0)
    for v in (w, t):
        v.loss(x, y)
        v.clip()
    ours = w.scaler._per_optimizer_states[id(w.opt)]
    theirs = t.scaler._per_optimizer_states[id(t.opt)]
    assert set(ours) == set(theirs) == {"stage", "found_inf_per_device"}
    assert ours["stage"].name == theirs["stage"].name == "UNSCALED"
    assert [f.item() for f in ours["found_inf_per_device"].values()] == \
        [f.item() for f in theirs["found_inf_per_device"].values()]
    for p, q in zip(w.params(), t.params()):
        _close(p.grad, q.grad, "the grads the two-call clip leaves")
    assert not hasattr(w.scaler, "clip_pending")
