"""ASGD.step() is all or nothing: bad input anywhere (here: always in a later
parameter group) raises before any group is written, and no state is
created for a rejected step. Also: the state the optimizer owns (packed
step/eta/mu, the C++ holder of eager steps) follows swapped params, grads,
state, dtypes and devices."""
import pytest
import torch

from torchext.optim import ASGD

KW = dict(lr=0.05, t0=1, weight_decay=1e-3)


def make_groups(seed=0):
    g = torch.Generator().manual_seed(seed)
    groups = []
    for lr in (0.05, 0.02, 0.01):
        ps = [torch.nn.Parameter(torch.randn(4, 3, generator=g)) for _ in range(3)]
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        groups.append({"params": ps, "lr": lr})
    return groups


def snapshot(opt):
    """Everything a step may change: params, and every state entry (by param
    position, so a newly created entry shows up)."""
    params = [p for g in opt.param_groups for p in g["params"]]
    return {
        "params": [p.detach().clone() for p in params],
        "state": {i: {k: v.detach().clone() for k, v in opt.state[p].items()}
                  for i, p in enumerate(params) if p in opt.state and opt.state[p]},
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
    }


def equal(x, y):
    if x.is_meta or y.is_meta:  # no data to compare
        return (x.device, x.dtype, x.shape) == (y.device, y.dtype, y.shape)
    return x.dtype == y.dtype and torch.equal(x, y)


def assert_same(a, b):
    assert len(a["params"]) == len(b["params"])
    for x, y in zip(a["params"], b["params"]):
        assert equal(x, y)
    assert a["state"].keys() == b["state"].keys()  # no new (or lost) state
    for i in a["state"]:
        assert a["state"][i].keys() == b["state"][i].keys()
        for k in a["state"][i]:
            assert equal(a["state"][i][k], b["state"][i][k]), (i, k)
    assert a["groups"] == b["groups"]


def set_grad_data(p, t):
    # p.grad = t refuses another dtype/shape; .data does not (as user code
    # or a buggy hook may do).
    p.grad.data = t


# Bad input on the second parameter of the LAST group.
GRAD_CASES = {
    "complex grad": lambda p: set_grad_data(p, torch.zeros(p.shape, dtype=torch.complex64)),
    "float64 grad": lambda p: set_grad_data(p, torch.zeros(p.shape, dtype=torch.float64)),
    "wrong grad shape": lambda p: set_grad_data(p, torch.zeros(5, 2)),
    "sparse grad": lambda p: setattr(p, "grad", torch.zeros(p.shape).to_sparse()),
}
STATE_CASES = {
    "ax wrong shape": ("ax", lambda t: torch.zeros(5, 2)),
    "ax wrong dtype": ("ax", lambda t: t.double()),
    "ax on meta": ("ax", lambda t: t.to("meta")),
    "step on meta": ("step", lambda t: t.to("meta")),
    "eta wrong dtype": ("eta", lambda t: t.half()),
    "mu two elements": ("mu", lambda t: t.expand(2).clone()),
}
MATCH = "sparse|dtype|shape|device|meta|element|float32"


@pytest.mark.parametrize("first_step", [True, False], ids=["first-step", "later-step"])
@pytest.mark.parametrize("case", GRAD_CASES)
def test_bad_grad_in_later_group_changes_nothing(case, first_step):
    opt = ASGD(make_groups(), **KW)
    if not first_step:
        opt.step()
        opt.step()  # the second step runs from the cached per-group plan
    before = snapshot(opt)
    GRAD_CASES[case](opt.param_groups[-1]["params"][1])
    with pytest.raises((RuntimeError, TypeError, ValueError), match=MATCH):
        opt.step()
    assert_same(snapshot(opt), before)
    if first_step:
        assert len(opt.state) == 0


@pytest.mark.parametrize("case", STATE_CASES)
def test_bad_state_in_later_group_changes_nothing(case):
    opt = ASGD(make_groups(), **KW)
    opt.step()
    opt.step()
    key, make = STATE_CASES[case]
    p = opt.param_groups[-1]["params"][1]
    opt.state[p][key] = make(opt.state[p][key])
    before = snapshot(opt)
    with pytest.raises((RuntimeError, TypeError, ValueError), match=MATCH):
        opt.step()
    assert_same(snapshot(opt), before)


def test_new_param_in_later_group_gets_no_state_when_rejected():
    opt = ASGD(make_groups(), **KW)
    opt.step()
    q = torch.nn.Parameter(torch.randn(2))
    q.grad = torch.randn(2)
    opt.add_param_group({"params": [q]})
    bad = opt.param_groups[1]["params"][0]
    set_grad_data(bad, torch.zeros(bad.shape, dtype=torch.float64))
    before = snapshot(opt)
    with pytest.raises(TypeError, match="dtype"):
        opt.step()
    assert q not in opt.state or not opt.state[q]
    assert_same(snapshot(opt), before)


def test_several_devices_in_one_group_change_nothing_when_one_is_bad():
    # cpu + meta params in one group: one op call per device; the meta
    # call's input is bad, the cpu call must not have run.
    cpu = [torch.nn.Parameter(torch.randn(3)) for _ in range(2)]
    meta = torch.nn.Parameter(torch.empty(3, device="meta"))
    for p in cpu:
        p.grad = torch.randn(3)
    meta.grad = torch.empty(3, device="meta")
    opt = ASGD([{"params": cpu + [meta]}], **KW)
    opt.step()
    opt.state[meta]["ax"] = torch.empty(4, device="meta")
    before = snapshot(opt)
    with pytest.raises(ValueError, match="shape"):
        opt.step()
    assert_same(snapshot(opt), before)


def test_retry_after_fixing_the_bad_grad_matches_torch():
    """A user who catches the error, fixes the grad and retries applies each
    group exactly once."""
    ours, ref = ASGD(make_groups(), **KW), torch.optim.ASGD(make_groups(), foreach=False, **KW)
    for opt in (ours, ref):
        opt.step()
    p = ours.param_groups[-1]["params"][0]
    good = p.grad
    p.grad = torch.zeros(p.shape).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        ours.step()
    p.grad = good
    ours.step()
    ref.step()
    for g_ours, g_ref in zip(ours.param_groups, ref.param_groups):
        for a, b in zip(g_ours["params"], g_ref["params"]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(ours.state[a]["ax"], ref.state[b]["ax"],
                                       rtol=1e-6, atol=1e-7)


# --- the cached per-group plan notices what changed -------------------------

def stepped_pair(**kw):
    ours, ref = ASGD(make_groups(), **KW, **kw), torch.optim.ASGD(make_groups(), foreach=False,
                                                                   **KW, **kw)
    for _ in range(2):
        ours.step()
        ref.step()
    return ours, ref


def assert_match(ours, ref):
    assert len(ours.param_groups) == len(ref.param_groups)
    for g_ours, g_ref in zip(ours.param_groups, ref.param_groups):
        for a, b in zip(g_ours["params"], g_ref["params"]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            if b in ref.state:
                for k in ("ax", "step", "eta", "mu"):
                    torch.testing.assert_close(ours.state[a][k], ref.state[b][k].to(
                        ours.state[a][k].dtype), rtol=1e-6, atol=1e-7)
            else:
                assert a not in ours.state


def both(ours, ref, fn):
    fn(ours)
    fn(ref)
    ours.step()
    ref.step()
    assert_match(ours, ref)


def test_plan_notices_swapped_param():
    ours, ref = stepped_pair()

    def swap(opt):
        new = torch.nn.Parameter(torch.full((4, 3), 0.5))
        new.grad = torch.full((4, 3), 0.25)
        opt.param_groups[1]["params"][2] = new  # same list object, other param
    both(ours, ref, swap)


def test_plan_notices_swapped_and_missing_grads():
    ours, ref = stepped_pair()

    def new_grads(opt):
        for g in opt.param_groups:
            for p in g["params"]:
                p.grad = torch.ones_like(p) * 0.3
    both(ours, ref, new_grads)
    both(ours, ref, lambda opt: setattr(opt.param_groups[0]["params"][1], "grad", None))

    def grads_back(opt):
        opt.param_groups[0]["params"][1].grad = torch.full((4, 3), -0.1)
    both(ours, ref, grads_back)


def test_plan_notices_replaced_group_list_and_state_tensors():
    ours, ref = stepped_pair()

    def new_list(opt):
        opt.param_groups[0]["params"] = opt.param_groups[0]["params"][:2]
    both(ours, ref, new_list)

    def new_ax(opt):
        p = opt.param_groups[2]["params"][0]
        opt.state[p]["ax"] = torch.full((4, 3), 2.0)
    both(ours, ref, new_ax)


def test_plan_notices_load_state_dict():
    ours, ref = stepped_pair()
    other, other_ref = stepped_pair()
    other.step()
    other_ref.step()
    ours.load_state_dict(other.state_dict())
    ref.load_state_dict(other_ref.state_dict())
    ours.step()
    ref.step()
    assert_match(ours, ref)


def test_plan_notices_dtype_and_device_changes():
    ours = ASGD(make_groups(), **KW)
    ours.step()
    ours.step()
    p = ours.param_groups[2]["params"][0]
    # The param moves to float64 in place (same object): its float32 state no
    # longer fits, and the step says so instead of reusing the old plan.
    p.data = p.data.double()
    p.grad = torch.zeros(p.shape, dtype=torch.float64)
    before = snapshot(ours)
    with pytest.raises(TypeError, match=r"axs\[0\] has dtype"):
        ours.step()
    assert_same(snapshot(ours), before)
    p.data = p.data.float()
    p.grad = torch.zeros(p.shape)
    ours.step()  # and works again once it fits



def test_plan_notices_param_moved_to_another_device():
    # A param replaced by one on another device (cpu -> meta): the group now
    # needs one op call per device, not the cached single call.
    ours, ref = stepped_pair()

    def to_meta(opt):
        m = torch.nn.Parameter(torch.empty(4, 3, device="meta"))
        m.grad = torch.empty(4, 3, device="meta")
        opt.param_groups[1]["params"][1] = m
    to_meta(ours)
    ours.step()
    ref.param_groups[1]["params"].pop(1)
    ref.step()
    m = ours.param_groups[1]["params"].pop(1)
    assert ours.state[m]["ax"].device.type == "meta"
    assert_match(ours, ref)


def test_plan_notices_group_flags():
    ours = ASGD(make_groups(), **KW)
    ours.step()
    ours.step()
    ours.param_groups[0]["fused"] = False  # reference path from now on
    ref = torch.optim.ASGD(make_groups(), foreach=False, **KW)
    ref.step()
    ref.step()
    ours.param_groups[0]["differentiable"] = False
    ours.step()
    ref.step()
    assert_match(ours, ref)


# --- the C++ holder of eager steps (csrc/classes/asgd_holder.cpp) -------------------

def holders(opt):
    """The C++ holders of the optimizer's slot groups (None where none was made)."""
    return [sg.native for pgs in opt._slots() for sg in pgs.slot_groups]


def test_single_group_steps_through_the_cpp_holder_and_leaves_params_without_grads_alone():
    params = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(4)]
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ours = ASGD(params, **KW)
    ref = torch.optim.ASGD(ref_params, foreach=False, **KW)

    def step(drop=None):
        for i, (p, q) in enumerate(zip(params, ref_params)):
            g = None if i == drop else torch.full_like(p, 0.1 * (i + 1))
            p.grad, q.grad = g, None if g is None else g.clone()
        ours.step()
        ref.step()
        assert_match(ours, ref)

    step(drop=1)  # param 1 gets no state on the first step, as in torch
    assert params[1] not in ours.state
    step()  # and its state on its first step with a grad
    (holder,) = holders(ours)
    assert holder is not None, "a plain one-device group steps through its C++ holder"
    step(drop=2)  # the holder skips a param without a grad
    step()
    assert holders(ours) == [holder]  # nothing structural changed: the same holder


def test_ops_bump_versions_of_what_they_write_only_when_they_run():
    p, g, ax = torch.randn(3), torch.randn(3), torch.zeros(3)
    mu, eta, step = torch.ones(()), torch.full((), 0.1), torch.zeros(())
    kw = dict(lr=torch.tensor(0.1), lambd=0.0, alpha=0.75, t0=0.0, weight_decay=0.0,
              maximize=False)
    before = [t._version for t in (p, g, ax, mu, eta, step)]
    torch.ops.torchext.asgd_([p], [g], [ax], [mu], [eta], [step], **kw)
    after = [t._version for t in (p, g, ax, mu, eta, step)]
    assert after[1] == before[1]  # grads are read, not written
    assert all(a == b + 1 for i, (a, b) in enumerate(zip(after, before)) if i != 1)
    with pytest.raises(TypeError):
        torch.ops.torchext.asgd_([p], [g.double()], [ax], [mu], [eta], [step], **kw)
    assert [t._version for t in (p, g, ax, mu, eta, step)] == after
    # Through the optimizer's C++ holder (which passes a param without a
    # grad as an undefined grad, left alone): such a param is not bumped.
    a, b = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))
    opt = ASGD([a, b], lr=0.1)
    a.grad, b.grad = torch.ones(3), torch.ones(3)
    opt.step()
    b.grad = None
    versions = a._version, b._version
    opt.step()
    assert (a._version, b._version) == (versions[0] + 1, versions[1])


def test_plan_groups_whose_grads_all_went_are_skipped_in_a_multi_group_step():
    ours, ref = stepped_pair()

    def drop_group(opt):
        for p in opt.param_groups[1]["params"]:
            p.grad = None
    both(ours, ref, drop_group)


# --- the packed schedule state of a C++ plan ---------------------------------

def one_group_pair(n=5, **kw):
    params = [torch.nn.Parameter(torch.randn(4, 3, generator=torch.Generator().manual_seed(i)))
              for i in range(n)]
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ours = ASGD(params, **KW, **kw)
    ref = torch.optim.ASGD(ref_params, foreach=False, **KW, **kw)
    return ours, ref


def step_both(ours, ref, scale=0.1):
    for i, (p, q) in enumerate(zip(ours.param_groups[0]["params"], ref.param_groups[0]["params"])):
        p.grad = torch.full_like(p, scale * (i + 1))
        q.grad = p.grad.clone()
    ours.step()
    ref.step()
    assert_match(ours, ref)


def test_state_is_packed_from_creation_as_views_with_the_same_values():
    ours, ref = one_group_pair()
    step_both(ours, ref)  # creates the state: packed from the start
    bases = set()
    for st in (ours.state[p] for p in ours.param_groups[0]["params"]):
        for k in ("step", "eta", "mu"):
            assert st[k].dim() == 0 and st[k].dtype == torch.float32 and st[k]._base is not None
            bases.add((k, st[k]._base.data_ptr()))
    assert len(bases) == 3  # one packed tensor per key for the whole group
    for _ in range(3):
        step_both(ours, ref)


def test_plan_notices_replaced_step_eta_mu_and_sees_in_place_writes():
    ours, ref = one_group_pair()
    for _ in range(3):
        step_both(ours, ref)
    p, q = ours.param_groups[0]["params"][3], ref.param_groups[0]["params"][3]
    for key, value in (("step", 40.0), ("eta", 0.003), ("mu", 0.25)):
        ours.state[p][key] = torch.tensor(value)  # a new tensor: the plan must notice
        ref.state[q][key] = torch.tensor(value)
        step_both(ours, ref)
        step_both(ours, ref)  # (and a new plan packs it again)
        ours.state[p][key].fill_(value / 2)  # in place, through the packed view
        ref.state[q][key].fill_(value / 2)
        step_both(ours, ref)


def test_packed_state_dict_loads_into_torch_and_back_with_weights_only(tmp_path):
    ours, ref = one_group_pair()
    for _ in range(3):
        step_both(ours, ref)
    path = tmp_path / "opt.pt"
    torch.save(ours.state_dict(), path)
    loaded = torch.load(path, weights_only=True)
    # into torch.optim.ASGD: it continues exactly as the reference does
    twin = torch.optim.ASGD([torch.nn.Parameter(p.detach().clone())
                             for p in ours.param_groups[0]["params"]], foreach=False, **KW)
    twin.load_state_dict(loaded)
    for a, b in zip(twin.param_groups[0]["params"], ref.param_groups[0]["params"]):
        a.grad = torch.full_like(a, 0.7)
        b.grad = a.grad.clone()
    twin.step()
    ref.step()
    for a, b in zip(twin.param_groups[0]["params"], ref.param_groups[0]["params"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        for k in ("ax", "step", "eta", "mu"):
            torch.testing.assert_close(twin.state[a][k], ref.state[b][k], rtol=0, atol=0)
    # and back into ours
    again = ASGD([torch.nn.Parameter(p.detach().clone()) for p in twin.param_groups[0]["params"]],
                 **KW)
    again.load_state_dict(twin.state_dict())
    for _ in range(3):
        step_both(again, ref)


def test_rejected_step_keeps_the_state_tensors_and_their_values():
    ours, _ = one_group_pair()
    for p in ours.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    ours.step()
    p = ours.param_groups[0]["params"][4]
    set_grad_data(p, torch.ones(4, 3, dtype=torch.float64))
    held = [ours.state[q]["step"] for q in ours.param_groups[0]["params"]]
    before = snapshot(ours)
    with pytest.raises(TypeError, match="dtype"):
        ours.step()
    assert all(ours.state[q]["step"] is t for q, t in zip(ours.param_groups[0]["params"], held))
    assert_same(snapshot(ours), before)


def _refusal(run):
    try:
        run()
    except (RuntimeError, TypeError, ValueError) as e:
        return e
    raise AssertionError("not refused")


@pytest.mark.parametrize("case", STATE_CASES)
def test_state_refused_by_the_step_as_by_the_op(case):
    # Two homes of the state-entry rules: the op's validator (check_asgd_entry,
    # C++) and the packing of step/eta/mu (_state._check_packable, which runs
    # before the op sees packed state). The same table, through both: the same
    # exception type and the same rule in the message.
    key, make = STATE_CASES[case]
    errors = []
    for route in ("op", "step"):
        p = torch.nn.Parameter(torch.randn(4, 3))
        p.grad = torch.randn(4, 3)
        opt = ASGD([p], **KW)
        opt.step()
        st = {k: v.clone() for k, v in opt.state[p].items()}
        st[key] = make(st[key])
        if route == "op":
            errors.append(_refusal(lambda: torch.ops.torchext.asgd_(
                [p], [p.grad], [st["ax"]], [st["mu"]], [st["eta"]], [st["step"]],
                lr=torch.tensor(0.05, dtype=torch.float64), lambd=1e-4, alpha=0.75, t0=1.0,
                weight_decay=0.0, maximize=False)))
        else:
            opt.state[p][key] = st[key]
            errors.append(_refusal(opt.step))
    by_op, by_step = errors
    assert type(by_op) is type(by_step), (by_op, by_step)
    rule = str(by_op).splitlines()[0].split("] ", 1)[1]  # "asgd_: etas[0] <rule>"
    rule = rule.replace("Half", "torch.float16").replace("[2]", "(2,)")
    rule = rule.replace("params[0]", "its parameter" if key != "ax" else "params[0]")
    assert rule.split(";")[0] in str(by_step), (by_op, by_step)
