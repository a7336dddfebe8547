"""Each workaround in torchext/_compile_compat.py, and a check that torch
still behaves the way that makes it necessary. When one of the
`test_torch_still_*` tests fails on a new torch, the matching workaround
can probably go (and its test with it)."""
import ast
import copy
import inspect
import re
import subprocess
import sys
import textwrap
import types
import warnings

import pytest
import torch
from helpers import COMPILED_STEP, PKG_PARENT, SCALER_OVERRIDES, needs_torch, subprocess_env
from torch._dynamo import trace_rules
from torch._dynamo.variables.optimizer import OptimizerVariable

import torchext
from torchext import _compile_compat as cc
from torchext.optim import ASGD


def _opt(cls=torch.optim.SGD):
    return cls([torch.nn.Parameter(torch.randn(2))], lr=0.1)


# (1) LR schedulers wrap optimizer.step in a function Dynamo does not trace.

def test_torch_still_wraps_step_in_an_untraceable_lr_scheduler_function():
    opt = _opt()
    torch.optim.lr_scheduler.StepLR(opt, 1)
    wrapper = getattr(opt.step, "__func__", opt.step)
    assert inspect.getsourcefile(wrapper).endswith("lr_scheduler.py")
    assert trace_rules.check_verbose(wrapper).skipped


def test_marked_step_is_not_wrapped_and_still_tells_the_scheduler_it_ran():
    opt = _opt(ASGD)
    assert cc.is_marked_not_wrapped(ASGD.step)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    assert opt.step.__func__ is ASGD.step
    opt.step()
    assert opt._opt_called  # what the wrapper would have recorded
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()" would fail
        warnings.simplefilter("error")
        sched.step()


def test_scheduler_warns_when_the_step_did_not_tell_it():
    # The check above can fail: a step that does not record the call makes
    # the scheduler warn.
    class Silent(torch.optim.SGD):
        @cc.mark_step_not_wrapped
        def step(self, closure=None):  # forgets self._opt_called = True
            return None

    opt = Silent([torch.nn.Parameter(torch.randn(2))], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    opt.step()
    with pytest.warns(UserWarning, match="optimizer.step()"):
        sched.step()


# (1b) Dynamo drops attribute writes on an optimizer in compiled code.

@needs_torch(cc.COMPILED_STEP)  # (older Dynamo breaks the graph at such a write instead: (6))
def test_torch_still_drops_attribute_writes_on_an_optimizer_in_compiled_code():
    opt, box = _opt(), cc.StepCalled()

    def f(x):
        opt._probe = True  # what a compiled step's `self._opt_called = True` is
        box.called = True  # what GroupsAlias writes instead
        return x + 1

    torch._dynamo.reset()
    torch.compile(f, backend="eager")(torch.ones(1))
    torch._dynamo.reset()
    assert "_probe" not in opt.__dict__ and box.called


SCHED_WARNING = r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`"


_SCHED_SCRIPT = """
import sys, warnings
import torch
from torchext.optim import ASGD
fullgraph = sys.argv[1] == "True"
opts = [("torchext", ASGD)] + ([] if fullgraph else [("torch", torch.optim.ASGD)])
for name, cls in opts:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = cls(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.5)
    w0 = model.weight.detach().clone()

    def step(x):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=fullgraph):
        torch.compile(step, backend="eager", fullgraph=fullgraph)(torch.ones(2, 3))
    torch._dynamo.reset()
    assert not torch.equal(model.weight, w0), name  # the compiled step ran
    assert opt._opt_called, name
    with warnings.catch_warnings():
        warnings.filterwarnings("error", sys.argv[2])
        sched.step()
    assert opt.param_groups[0]["lr"] == 0.05, name
    print("ran", name)
"""


@pytest.mark.parametrize("fullgraph", [False, pytest.param(True, marks=needs_torch(cc.COMPILED_STEP))])
def test_compiled_step_tells_the_scheduler_it_ran_as_torchs_does(fullgraph):
    """A step compiled with its zero_grad and backward, then the scheduler's
    first step(): no "lr_scheduler.step() before optimizer.step()" warning,
    as with torch's ASGD (whose scheduler wrapper breaks the graph and runs
    its step eagerly; with fullgraph=True torch cannot compile it at all).
    In a process of its own: on torch 2.14, after the whole-step graphs of
    tests/compile/test_compile.py in the same process, Dynamo's generated
    resume code for this graph-breaking step fails with an IndexError (its
    own state, which torch._dynamo.reset() does not clear; not in a fresh
    process, nor on 2.15)."""
    r = subprocess.run([sys.executable, "-c", _SCHED_SCRIPT, str(fullgraph), SCHED_WARNING],
                       env=subprocess_env(), cwd=PKG_PARENT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    names = ["torchext"] + ([] if fullgraph else ["torch"])
    assert r.stdout.split() == [w for n in names for w in ("ran", n)], r.stdout


def test_opt_called_starts_false_and_copies_start_afresh():
    opt = _opt(ASGD)
    assert opt._opt_called is False
    opt.step()
    assert opt._opt_called is True
    copied = copy.deepcopy(opt)  # torch's __getstate__ keeps no _opt_called either
    assert copied._opt_called is False and isinstance(copied.__dict__[cc.STEP_CALLED],
                                                      cc.StepCalled)
    sched = torch.optim.lr_scheduler.StepLR(copied, 1)
    with pytest.warns(UserWarning, match=SCHED_WARNING):  # as torch's, after a copy
        sched.step()


# (2) Dynamo special-cases `param_groups` of optimizers.

def _code_words(obj) -> set[str]:
    """The names, attributes and string constants ``obj``'s code uses: its
    source without comments and docstrings."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                    ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    words = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            words.add(n.id)
        elif isinstance(n, ast.Attribute):
            words.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings:
            words.add(n.value)
    return words


def test_code_words_skip_comments_and_docstrings():
    class Commented:
        """param_groups"""
        # capturable
        def f(self):
            """_init_group"""
            return self.used["key"]

    assert _code_words(Commented) == {"self", "used", "key"}


def test_torch_still_special_cases_param_groups_of_optimizers():
    words = _code_words(OptimizerVariable)
    assert "param_groups" in words and "capturable" in words


def test_groups_are_read_from_the_instance_and_follow_a_replaced_list():
    opt = _opt(ASGD)
    assert opt._current_groups() is opt.param_groups
    opt.param_groups = list(opt.param_groups)
    assert opt._current_groups() is opt.param_groups
    opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(1))]})
    assert opt._current_groups() is opt.param_groups
    sgd = torch.optim.SGD(opt.param_groups[0]["params"])
    assert cc.param_groups(sgd) is sgd.param_groups


# (3) torch's Optimizer.zero_grad is not traceable.

def test_torch_zero_grad_is_still_not_traced():
    assert trace_rules.check_verbose(torch.optim.Optimizer.zero_grad).skipped
    # (traced wherever the torch traces a step: (6))
    assert trace_rules.check_verbose(ASGD.zero_grad).skipped == (not cc.COMPILED_STEP.available())


# (4) Dynamo intercepts the method named `_init_group`.

INIT_GROUP = "_init_group"  # the name Dynamo intercepts, which the step path must not use


def _step_path_names(cls) -> set[str]:
    """Every name the step's code uses, following the methods of ``cls`` it
    calls (``self.<name>``), from the function under the hook wrapper."""
    seen: set[str] = set()
    todo = [inspect.unwrap(cls.step)]
    while todo:
        code = todo.pop().__code__
        codes = [code]
        while codes:  # nested functions and lambdas (HolderCall's make_state)
            c = codes.pop()
            codes.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
            for name in c.co_names:
                if name in seen:
                    continue
                seen.add(name)
                fn = inspect.getattr_static(cls, name, None)
                if isinstance(fn, types.FunctionType):
                    todo.append(fn)
    return seen


def test_torch_still_intercepts_init_group():
    assert INIT_GROUP in _code_words(OptimizerVariable)


def test_step_path_never_calls_init_group():
    names = _step_path_names(ASGD)
    assert {"_run_step", "_call", "_gather", "_with_grads"} <= names  # the walk reaches the gather
    assert INIT_GROUP not in names


def test_step_path_check_fails_when_the_gather_goes_through_init_group():
    # The workaround undone: the gather through torch's name. The check above
    # must see it (it once inspected the hook wrapper and could not fail).
    class Undone(ASGD):
        def _gather(self, sg, lr, created, fused):
            lists = [[] for _ in range(6)]
            self._init_group(None, *lists)
            return lists

    assert INIT_GROUP in _step_path_names(Undone)


def test_init_group_alias_gathers_like_torch_and_reports_complex():
    p = torch.nn.Parameter(torch.randn(2, dtype=torch.complex64))
    p.grad = torch.randn(2, dtype=torch.complex64)
    q = torch.nn.Parameter(torch.randn(2))
    opt = ASGD([p, q])
    lists = [[] for _ in range(6)]
    assert opt._init_group(opt.param_groups[0], *lists) is True
    assert lists[0] == [p] and set(opt.state[p]) == {"step", "eta", "mu", "ax"}


# (5) Dynamo skips code defined in torch/amp/grad_scaler.py, which is why
# torchext's GradScaler defines every method a compiled step calls itself
# (torchext/amp/grad_scaler.py). When this fails, torch traces that file
# and the overrides kept only for tracing can go.

def test_torch_still_skips_tracing_torch_grad_scaler():
    compiled = [name for name, why in SCALER_OVERRIDES.items() if why.startswith(COMPILED_STEP)]
    assert len(compiled) >= 7  # every one a compiled step calls (tests/helpers.py)
    for name in compiled:
        fn = getattr(torch.amp.GradScaler, name)
        assert inspect.getsourcefile(fn).endswith("amp/grad_scaler.py"), name
        assert trace_rules.check_verbose(fn).skipped, name


# ---------------------------------------------------------------- torch versions
# (6) and (7): what differs between the torch releases torchext supports.

def test_torch_version_parses_releases_builds_and_nightlies():
    assert cc.torch_version("2.11.0+cu130") == (2, 11)
    assert cc.torch_version("2.15.0") == (2, 15)
    assert cc.torch_version("2.16.0.dev20270101+cpu") == (2, 16)
    assert cc.torch_version() == tuple(int(x) for x in torch.__version__.split(".")[:2])
    oldest, newest = cc.SUPPORTED_TORCH
    assert oldest <= cc.torch_version() <= newest, "this torch is outside the supported range"


def test_every_feature_names_itself_and_its_torch_in_its_message():
    for feature in cc.FEATURES:
        assert cc.SUPPORTED_TORCH[0] < feature.min_torch <= cc.SUPPORTED_TORCH[1]
        major, minor = feature.min_torch
        older = f"{major}.{minor - 1}.0"
        assert not feature.available(older) and feature.available(f"{major}.{minor}.0")
        msg = feature.message(older)
        assert feature.name in msg and f"needs torch >= {major}.{minor}" in msg and older in msg
    # (How a missing feature is refused with this message, at its first call:
    # test_fullgraph_step_is_refused_at_the_first_call_naming_the_feature.)


def _setattr_on_an_optimizer_compiles() -> bool:
    opt = _opt()

    def f(x):
        opt._probe = x
        return x + 1

    torch._dynamo.reset()
    try:
        torch.compile(f, fullgraph=True, backend="eager")(torch.ones(1))
        return True
    except Exception as e:  # torch._dynamo.exc.* on an older Dynamo
        assert "setattr" in str(e) or "AttributeMutation" in str(e), e
        return False
    finally:
        torch._dynamo.reset()


def _grads_reach_a_step_traced_after_backward(groups_through_dict: bool = True) -> bool:
    """Whether an optimizer's step, traced in one fullgraph graph after its
    zero_grad (``p.grad = None``) and an in-graph backward, sees the grads
    (the params move). Groups read as torchext reads them (the instance's
    ``__dict__``, (2)), or through the ``param_groups`` attribute."""

    def groups(opt):
        return opt.__dict__["param_groups"] if groups_through_dict else opt.param_groups

    class Opt(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.5})

        def zero_grad(self, set_to_none=True):
            for group in groups(self):
                for p in group["params"]:
                    p.grad = None

        def step(self, closure=None):
            with torch.no_grad():
                for group in groups(self):
                    for p in group["params"]:
                        if p.grad is not None:
                            p.sub_(p.grad * group["lr"])

    w = torch.nn.Parameter(torch.ones(2))
    opt = Opt([w])

    def train_step(x):
        opt.zero_grad()
        (w * x).sum().backward()
        opt.step()

    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            step = torch.compile(train_step, fullgraph=True, backend="eager")
            step(torch.ones(2))
            step(torch.ones(2))
    except Exception:  # an older Dynamo that cannot trace it at all
        return False
    finally:
        torch._dynamo.reset()
    return torch.equal(w.detach(), torch.zeros(2))  # two steps of 0.5 * 1


def test_torch_still_loses_grads_read_through_param_groups():
    """(2) Through the ``param_groups`` attribute the traced step sees no
    grads; this also shows the probe below can see lost grads. When it
    fails, Dynamo no longer needs the groups read from ``__dict__``."""
    assert not _grads_reach_a_step_traced_after_backward(groups_through_dict=False)


def test_compiled_step_gate_matches_what_dynamo_can_do():
    """(6) COMPILED_STEP is available exactly where Dynamo can do both things
    a compiled step needs: set attributes on an optimizer inside a fullgraph
    graph, and keep the grads of an in-graph backward for a step traced
    after zero_grad. When the oldest supported torch can, the gate (and
    COMPILED_STEP) can go."""
    can = {"setattr": _setattr_on_an_optimizer_compiles(),
           "grads": _grads_reach_a_step_traced_after_backward()}
    assert {k: cc.COMPILED_STEP.available() for k in can} == can


def test_fullgraph_step_is_refused_at_the_first_call_naming_the_feature():
    """(6) On a torch without COMPILED_STEP the whole-step compile fails at
    its first call with the feature's message; without fullgraph the step
    runs eagerly between graphs and matches an eager run."""
    if cc.COMPILED_STEP.available():
        pytest.skip("this torch compiles the whole step (tests/compile/test_compile.py)")

    def make():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = ASGD(model.parameters(), lr=0.1, t0=1)
        return model, opt, torchext.amp.GradScaler(init_scale=4.0)

    def step_fn(model, opt, scaler):
        def step(x, y):
            opt.zero_grad()
            scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
            scaler.step(opt)
            scaler.update()
        return step

    x, y = torch.randn(8, 4), torch.randn(8, 1)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        with pytest.raises(Exception, match=re.escape(cc.COMPILED_STEP.message())):
            torch.compile(step_fn(*make()), fullgraph=True, backend="eager")(x, y)
        eager, compiled = make(), make()
        run = torch.compile(step_fn(*compiled), backend="eager")
        for _ in range(3):
            step_fn(*eager)(x, y)
            run(x, y)
    torch._dynamo.reset()
    assert not torch.equal(eager[0].weight, make()[0].weight)  # it trained
    for a, b in zip(eager[0].parameters(), compiled[0].parameters()):
        assert torch.equal(a, b)


def test_mse_loss_probe_and_the_promoting_wrapper_match_newer_torch():
    """(7) The wrapper gives what a torch with the fix gives: the loss and
    gradient of the inputs cast to their promoted dtype. The probe says
    whether this torch's own mse_loss takes mixed dtypes; when the oldest
    supported torch does, the wrapper can go."""
    F = torch.nn.functional
    x = torch.randn(5, 3, dtype=torch.float64)
    t = torch.randn(5, 3)
    a = x.to(torch.bfloat16).requires_grad_()
    b = x.to(torch.bfloat16).requires_grad_()
    wrapped = cc.promoting_mse_loss(F.mse_loss)
    la = wrapped(a, t)
    la.backward()
    lb = F.mse_loss(b.float(), t)
    lb.backward()
    assert la.dtype == torch.float32 and torch.equal(la, lb) and torch.equal(a.grad, b.grad)
    try:
        F.mse_loss(x.to(torch.bfloat16).requires_grad_(), t).backward()
        works = True
    except RuntimeError as e:
        assert "expected BFloat16" in str(e)
        works = False
    assert cc.mse_loss_mixed_dtype_works() == works
    if works:  # and then torch's own result is the wrapper's
        c = x.to(torch.bfloat16).requires_grad_()
        lc = F.mse_loss(c, t)
        lc.backward()
        assert torch.equal(lc, la) and torch.equal(c.grad, a.grad)


def test_apex_o1_puts_the_wrapper_in_place_only_where_torch_needs_it():
    from torchext.amp import apex
    F = torch.nn.functional
    own = F.mse_loss
    apex.reset()
    try:
        apex.initialize(torch.nn.Linear(2, 1), opt_level="O1", verbosity=0)
        assert getattr(F.mse_loss, "_torchext_promoting", False) == (
            not cc.mse_loss_mixed_dtype_works())
    finally:
        apex.reset()
    assert F.mse_loss is own


def test_the_default_torch_is_the_newest_supported():
    """scripts/venv.sh (so test.sh and demo.sh) and requirements-dev.txt
    default to the newest torch of SUPPORTED_TORCH."""
    import os
    from helpers import SRC
    major, minor = cc.SUPPORTED_TORCH[1]
    venv = open(os.path.join(SRC, "scripts", "venv.sh")).read()
    assert re.search(rf"^TORCH_VERSION=\$\{{TORCH_VERSION:-{major}\.{minor}\.\d+\}}$", venv, re.M)
    reqs = open(os.path.join(SRC, "requirements-dev.txt")).read().split("\n")
    assert f"torch=={major}.{minor}.*" in reqs
