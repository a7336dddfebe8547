"""The CUDA kernels' two launch layouts, on a GPU (skipped without one).

Eager launches carry up to 32 KB of launch metadata (CUDA 13 builds);
launches made while the stream captures a CUDA graph fall back to the
classic 4 KB layout, unless TORCHEXT_CUDA_GRAPH_LARGE_PARAMS=1 (see
csrc/ops/cuda/launch.cuh for why). A captured asgd_ / unscale_ step, or
tensor_norms call, replayed, must match the same run eagerly bit for bit in
both layouts, and the profiler must see the launch counts each layout makes
(docs/benchmarks.md lists them; ctest cuda_on_host checks both layouts on
the CPU)."""
import pytest
import torch

import torchext  # noqa: F401
from conftest import requires_cuda

ops = torch.ops.torchext
HYPER = dict(lambd=1e-4, alpha=0.75, t0=2.0, weight_decay=0.01, maximize=False)

# (tensors, elements) -> asgd_ update launches per step with packed state,
# (large layout, classic layout); asgd_ adds one schedule launch.
UPDATE_LAUNCHES = {(200, 50_000): (1, 5), (1000, 1000): (2, 15)}


def packed_state(n, numel, seed=0):
    """asgd_.packed's arguments on the GPU: ([params, grads, axs], [mus, etas,
    steps], lr)."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd():
        return torch.randn(numel, generator=g, device="cuda")

    params, grads, axs = ([rnd() for _ in range(n)] for _ in range(3))
    steps = torch.arange(n, device="cuda", dtype=torch.float32) % 5
    etas = 0.01 / (1 + 1e-4 * 0.01 * steps) ** 0.75
    mus = 1 / torch.clamp(steps - 2.0, min=1.0)
    return [params, grads, axs], [mus, etas, steps], torch.tensor(0.01, device="cuda")


def clone_all(lists, state, lr):
    return [[t.clone() for t in lst] for lst in lists], [t.clone() for t in state], lr.clone()


def step(lists, state, lr, found_inf, inv_scale):
    """One scaler-style step: unscale_ the grads, then asgd_.packed."""
    params, grads, axs = lists
    ops.unscale_(grads, found_inf, inv_scale)
    ops.asgd_.packed(params, grads, axs, *state, lr=lr, **HYPER, found_inf=found_inf)


def assert_bitwise_equal(a, b):
    (la, sa, _), (lb, sb, _) = a, b
    for x_list, y_list in zip(la, lb):
        for x, y in zip(x_list, y_list):
            assert torch.equal(x.view(torch.int32), y.view(torch.int32))
    for x, y in zip(sa, sb):
        assert torch.equal(x.view(torch.int32), y.view(torch.int32))


@requires_cuda
@pytest.mark.parametrize("large_in_graph", [False, True], ids=["classic graph", "large graph"])
@pytest.mark.parametrize("shape", list(UPDATE_LAUNCHES), ids=lambda s: f"{s[0]}x{s[1]}")
def test_captured_step_replays_bit_for_bit_like_eager(monkeypatch, large_in_graph, shape):
    if large_in_graph:
        monkeypatch.setenv("TORCHEXT_CUDA_GRAPH_LARGE_PARAMS", "1")
    eager = packed_state(*shape)
    captured = clone_all(*eager)
    found = [torch.zeros((), device="cuda") for _ in range(2)]
    inv = torch.tensor(0.5, device="cuda")
    # Warm up on a side stream, as torch.cuda.graph asks; then capture one step.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(*eager, found[0], inv)
        step(*captured, found[1], inv)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(*captured, found[1], inv)
    for _ in range(3):
        step(*eager, found[0], inv)
        graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(captured, eager)
    assert torch.equal(found[0], found[1])
    # The replays moved the params: the graph is not empty.
    assert not torch.equal(captured[0][0][0], packed_state(*shape)[0][0][0])


def update_launches(fn):
    """asgd_ update kernels the profiler saw while fn ran (on the GPU)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if "ASGDElementwise" in e.name)


@requires_cuda
@pytest.mark.parametrize("large_in_graph", [False, True], ids=["classic graph", "large graph"])
@pytest.mark.parametrize("shape", list(UPDATE_LAUNCHES), ids=lambda s: f"{s[0]}x{s[1]}")
def test_launch_counts_of_each_layout(monkeypatch, large_in_graph, shape):
    if large_in_graph:
        monkeypatch.setenv("TORCHEXT_CUDA_GRAPH_LARGE_PARAMS", "1")
    large, classic = UPDATE_LAUNCHES[shape]
    lists, state, lr = packed_state(*shape)
    run = lambda: ops.asgd_.packed(*lists, *state, lr=lr, **HYPER)  # noqa: E731
    run()  # warm-up
    assert update_launches(run) == large  # eager: the large layout
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    assert update_launches(graph.replay) == (large if large_in_graph else classic)


def sr_state(n, numel, packed, seed=3):
    """asgd_'s arguments for n bf16 params with a float32 average on the GPU,
    and stochastic rounding's (ids past 2**32, offsets of shards)."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd():
        return torch.randn(numel, generator=g, device="cuda").to(torch.bfloat16)

    params, grads = [rnd() for _ in range(n)], [rnd() for _ in range(n)]
    axs = [p.float() for p in params]
    steps = torch.arange(n, device="cuda", dtype=torch.float32) % 5
    etas = 0.01 / (1 + 1e-4 * 0.01 * steps) ** 0.75
    mus = 1 / torch.clamp(steps - 2.0, min=1.0)
    state = [mus, etas, steps] if packed else [list(t.clone().unbind()) for t in (mus, etas, steps)]
    rounding = dict(rounding_seed=1234, rounding_ids=[(3 << 32) + i for i in range(n)],
                    rounding_offsets=[numel * i for i in range(n)])
    return [params, grads, axs], state, torch.tensor(0.01, device="cuda"), rounding


def sr_step(lists, state, lr, rounding):
    op = ops.asgd_.packed if torch.is_tensor(state[0]) else ops.asgd_.default
    op(*lists, *state, lr=lr, **HYPER, **rounding)


def bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


# Stochastic rounding keys its bits by each tensor's step, read by the update
# kernel itself: every replay of a captured step draws new bits, as the eager
# steps do, and the per-tensor ids and offsets ride in the launch metadata.
@requires_cuda
@pytest.mark.parametrize("large_in_graph", [False, True], ids=["classic graph", "large graph"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "lists"])
def test_captured_stochastic_rounding_replays_like_eager(monkeypatch, large_in_graph, packed):
    if large_in_graph:
        monkeypatch.setenv("TORCHEXT_CUDA_GRAPH_LARGE_PARAMS", "1")
    lists, state, lr, rounding = sr_state(300, 5000, packed)
    initial = [t.clone() for t in lists[0]]
    captured = ([[t.clone() for t in lst] for lst in lists],
                [t.clone() if torch.is_tensor(t) else [x.clone() for x in t] for t in state])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sr_step(lists, state, lr, rounding)
        sr_step(*captured, lr, rounding)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sr_step(*captured, lr, rounding)
    for _ in range(3):
        sr_step(lists, state, lr, rounding)
        graph.replay()
    torch.cuda.synchronize()
    for x_list, y_list in zip(captured[0], lists):
        for x, y in zip(x_list, y_list):
            assert torch.equal(bits(x), bits(y))
    flat = lambda st: [t for x in st for t in ([x] if torch.is_tensor(x) else x)]  # noqa: E731
    for x, y in zip(flat(captured[1]), flat(state)):
        assert torch.equal(bits(x), bits(y))
    assert not torch.equal(lists[0][0], initial[0])
    # The rounding goes through its own kernels, in the replays too.
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    assert any("RoundStochastic" in e.name for e in prof.events())


# tensor_norms: (tensors, elements) -> chunk launches per call (large layout,
# classic layout), then one combine launch. The norms do not depend on the
# layout: a captured call (classic) gives the eager (large) one's bits.
NORMS_LAUNCHES = {(200, 50_000): (1, 5), (10_000, 100): (10, 82)}


def norms_kernels(fn):
    """tensor_norms' (chunk, combine) kernels the profiler saw while fn ran."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    return (sum("NormChunkBody" in n for n in names), sum("NormCombineBody" in n for n in names))


@requires_cuda
@pytest.mark.parametrize("large_in_graph", [False, True], ids=["classic graph", "large graph"])
@pytest.mark.parametrize("shape", list(NORMS_LAUNCHES), ids=lambda s: f"{s[0]}x{s[1]}")
def test_tensor_norms_captured_like_eager_in_each_layout(monkeypatch, large_in_graph, shape):
    if large_in_graph:
        monkeypatch.setenv("TORCHEXT_CUDA_GRAPH_LARGE_PARAMS", "1")
    n, numel = shape
    g = torch.Generator(device="cuda").manual_seed(1)
    grads = [torch.randn(numel, generator=g, device="cuda") * 1024 for _ in range(n)]
    inv = torch.tensor(1 / 1024, device="cuda")
    found = [torch.zeros((), device="cuda") for _ in range(2)]
    run = lambda f: ops.tensor_norms(grads, 2.0, inv, f)  # noqa: E731
    eager = run(found[0])
    assert norms_kernels(lambda: run(found[0])) == (NORMS_LAUNCHES[shape][0], 1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(found[1])
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(found[1])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.view(torch.int32), eager.view(torch.int32))
    assert found[0].item() == found[1].item() == 0
    large, classic = NORMS_LAUNCHES[shape]
    assert norms_kernels(graph.replay) == (large if large_in_graph else classic, 1)
    # An inf in the last grad reaches found_inf on replay.
    grads[-1][-1] = float("inf")
    graph.replay()
    torch.cuda.synchronize()
    assert found[1].item() == 1 and captured[-1].item() == float("inf")
