"""Each workaround in torchext/_compile_compat.py, and a check that torch
still behaves the way that makes it necessary. When one of the
`test_torch_still_*` tests fails on a new torch, the matching workaround
can probably go (and its test with it)."""
import inspect
import types

import torch
from helpers import COMPILED_STEP, SCALER_OVERRIDES
from torch._dynamo import trace_rules
from torch._dynamo.variables.optimizer import OptimizerVariable

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
    sched.step()  # no "lr_scheduler.step() before optimizer.step()" warning path


# (2) Dynamo special-cases `param_groups` of optimizers.

def test_torch_still_special_cases_param_groups_of_optimizers():
    src = inspect.getsource(OptimizerVariable)
    assert "param_groups" in src and "capturable" in src


def test_groups_are_read_from_the_instance_and_follow_a_replaced_list():
    opt = _opt(ASGD)
    assert opt._current_groups() is opt.param_groups
    opt.param_groups = list(opt.param_groups)
    assert opt._current_groups() is opt.param_groups
    opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(1))]})
    assert opt._current_groups() is opt.param_groups
    assert cc.param_groups(torch.optim.SGD(opt.param_groups[0]["params"])) is not None


# (3) torch's Optimizer.zero_grad is not traceable.

def test_torch_zero_grad_is_still_not_traced():
    assert trace_rules.check_verbose(torch.optim.Optimizer.zero_grad).skipped
    assert not trace_rules.check_verbose(ASGD.zero_grad).skipped


# (4) Dynamo intercepts the method named `_init_group`.

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
    assert cc.DYNAMO_INTERCEPTED_INIT in inspect.getsource(OptimizerVariable)


def test_step_path_never_calls_init_group():
    names = _step_path_names(ASGD)
    assert {"_run_step", "_call", "_gather", "_with_grads"} <= names  # the walk reaches the gather
    assert cc.DYNAMO_INTERCEPTED_INIT not in names


def test_step_path_check_fails_when_the_gather_goes_through_init_group():
    # The workaround undone: the gather through torch's name. The check above
    # must see it (it once inspected the hook wrapper and could not fail).
    class Undone(ASGD):
        def _gather(self, sg, lr, created, fused):
            lists = [[] for _ in range(6)]
            self._init_group(None, *lists)
            return lists

    assert cc.DYNAMO_INTERCEPTED_INIT in _step_path_names(Undone)


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

