"""`python -m torchext` (info, check, bench), run as a user runs it: in a
subprocess against the torchext under test (this checkout's in-place build,
or an installed wheel). Benchmarks run --quick on shrunken cases
(a wrapper edits the case tables before calling the CLI) to stay fast on CI."""
import importlib
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import torchext
from torchext import bench, cli
from torchext.cli import check as cli_check
from torchext.cli.info import arch_coverage

from helpers import PKG_PARENT, SRC, subprocess_env


def run_cli(*args, prelude="", timeout=300):
    """Runs the command line in a fresh process; prelude is Python run first
    (to block a module or shrink benchmark cases)."""
    code = prelude + "\nimport sys\nfrom torchext.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env=subprocess_env(), cwd=PKG_PARENT)


# Shrinks every benchmark to a case of a few thousand elements.
TINY = textwrap.dedent("""
    import torch
    import torchext.bench.asgd as a, torchext.bench.amp as m
    a.CASES = {"tiny fp32": (3, 2000, torch.float32), "tiny bf16": (2, 1000, torch.bfloat16)}
    m.SIZE = 2000
    import torchext.bench.clip as c
    c.SHAPES = [(30, 2000)]
""")
NO_TQDM = "import sys; sys.modules['tqdm'] = None\n"


def test_module_entry_point_and_usage():
    r = subprocess.run([sys.executable, "-m", "torchext", "--help"], capture_output=True,
                       text=True, timeout=120, cwd=PKG_PARENT, env=subprocess_env())
    assert r.returncode == 0 and "info" in r.stdout and "check" in r.stdout
    assert run_cli().returncode == 2  # a subcommand is required
    # the `torchext` console script: setup.py's entry point resolves to a function
    setup_py = open(os.path.join(SRC, "setup.py")).read()
    target = re.search(r'"torchext = ([\w.]+):(\w+)"', setup_py)
    assert target and callable(getattr(importlib.import_module(target[1]), target[2]))


def test_info():
    r = run_cli("info")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"built against torch {torchext.build_info['torch_version']}" in out
    assert f"ISA in use: {torchext.cpu_isa()}" in out
    assert f"library: {torchext.library_path}" in out
    assert f"cmake_prefix_path: {torchext.cmake_prefix_path}" in out
    if torchext.has_cuda_kernels():
        assert " ".join(torchext.build_info["cuda_archs"]) in out
    else:
        assert "CUDA kernels: no" in out
    if not torch.cuda.is_available():
        assert "GPU: none" in out


@pytest.mark.parametrize("archs,cc,covered,says", [
    (["8.0", "9.0+PTX"], (9, 0), True, "9.0+PTX build (native"),
    (["8.0", "9.0+PTX"], (8, 6), True, "8.0 build (native"),   # same major, newer minor
    (["8.0", "9.0+PTX"], (12, 0), True, "PTX"),                # driver JITs the PTX
    (["8.0", "9.0+PTX"], (7, 5), False, "TORCH_CUDA_ARCH_LIST=7.5"),
    (["9.0a"], (9, 0), True, "native"),
    (["8.0"], (9, 0), False, "TORCH_CUDA_ARCH_LIST=9.0"),      # no PTX: another major
    (["9.0a"], (9, 1), False, "TORCH_CUDA_ARCH_LIST=9.1"),     # 'a' code: that arch only
])
def test_arch_coverage(archs, cc, covered, says):
    ok, text = arch_coverage(archs, cc)
    assert ok is covered and says in text


def test_check_cpu_passes_and_covers_every_op():
    r = run_cli("check", "--device", "cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("asgd_ (float lr)", "asgd_ (tensor lr)", "asgd_ grad_scale/found_inf/clip_coef",
                 "check_finite_", "unscale_", "update_scale_", "bad input refused"):
        row = next(line for line in r.stdout.splitlines() if line.startswith(f"| {name} "))
        assert "| PASS" in row, row
    assert "checks passed" in r.stdout
    swap_row = next(line for line in r.stdout.splitlines() if line.startswith("| swap_ "))
    assert ("PASS" in swap_row) == hasattr(torch.ops.torchext, "swap_")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_check_cuda_without_gpu_fails_clearly():
    r = run_cli("check", "--device", "cuda")
    assert r.returncode == 2
    assert "no CUDA GPU is visible" in r.stderr


def _mismatch(device, gen, rng, tally):
    tally.case()
    ours = torch.ones(4)
    ours[2] = 1.001
    tally.close("corrupted value", ours, torch.ones(4), 1e-5)


def _raises(device, gen, rng, tally):
    raise RuntimeError("kernel exploded")


def _passes(device, gen, rng, tally):
    tally.case()
    tally.exact("same", torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))


def test_check_reports_failures_and_exits_nonzero(monkeypatch, capsys):
    checks = [("mismatch", _mismatch, None), ("raises", _raises, None),
              ("passes", _passes, None), ("skipped", _passes, lambda d: "not here")]
    outcomes = cli_check.run_checks(["cpu"], checks)
    assert [o.ok for o in outcomes] == [False, False, True, True]
    assert outcomes[0].worst == pytest.approx(1e-3 / 1e-5, rel=1e-3)
    table = cli_check.format_table(outcomes)
    row = next(line for line in table.splitlines() if line.startswith("| mismatch "))
    assert row.split("|")[3:5] == [" 1     ", " 100.0" + row.split("|")[4][6:]] and "FAIL" in row
    assert "FAIL mismatch [cpu]: corrupted value: relative error 0.001 > 1e-05" in table
    assert "FAIL raises [cpu]: raised RuntimeError: kernel exploded" in table
    assert "skipped (not here)" in table and "2 of 4 checks failed" in table
    assert cli_check.exit_code(outcomes) == 1 and cli_check.exit_code(outcomes[2:]) == 0
    # the command line: the same failing table, exit status 1
    monkeypatch.setattr(cli_check, "CHECKS", checks)
    assert cli.main(["check", "--device", "cpu"]) == 1
    assert "2 of 4 checks failed" in capsys.readouterr().out


def test_bench_json_tables_and_no_tqdm_message(tmp_path):
    out = tmp_path / "bench.json"
    r = run_cli("bench", "--device", "cpu", "--quick", "--only", "asgd,amp", "--json",
                str(out), prelude=NO_TQDM + TINY)
    assert r.returncode == 0, r.stderr
    # the benchmarks' own ratio tables
    assert "| tiny fp32 " in r.stdout and "vs torch foreach" in r.stdout
    assert "us/tensor with GradScaler" in r.stdout  # (e)/(f): the scaler's per-tensor cost
    assert "torch GradScaler + ASGD (foreach)" in r.stdout
    assert r.stderr.count("tqdm is not installed") == 1 and "torchext[bench]" in r.stderr
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == bench.SCHEMA_VERSION == 1
    assert doc["torch_version"] == torch.__version__ and doc["quick"] is True
    (run,) = doc["runs"]
    assert run["device"] == "cpu" and run["threads"] == torch.get_num_threads()
    assert run["array_MiB"] == 64 and run["bandwidth_GBps"]["bound"] == max(
        run["bandwidth_GBps"]["copy"], run["bandwidth_GBps"]["inplace_add"]) > 0
    assert [(r["benchmark"], r["case"]) for r in run["results"]] == [
        ("asgd", "tiny fp32"), ("asgd", "tiny bf16"), ("amp", "20 x 2k fp32")]
    for res in run["results"]:
        first, *others = res["ms"]
        assert first.startswith("torchext") and set(res["speedup"]) == set(others)
        for k in others:
            assert res["speedup"][k] == pytest.approx(res["ms"][k] / res["ms"][first])
        assert res["bandwidth_fraction"] > 0
    assert run["results"][0]["extra"] == {"tensors": 1, "numel": 2000,
                                          "dtype": "torch.float32"}  # --quick: 10x fewer


def test_bench_clip_tables(tmp_path):
    out = tmp_path / "bench.json"
    r = run_cli("bench", "--device", "cpu", "--quick", "--only", "clip", "--json", str(out),
                prelude=NO_TQDM + TINY)
    assert r.returncode == 0, r.stderr
    assert "clip_grad_norm_ alone, 3 x 2000 fp32 (clipping active)" in r.stdout
    assert "scale -> clip -> step -> update, 3 x 2000 fp32" in r.stdout
    (run,) = json.loads(out.read_text())["runs"]
    phase = run["results"][1]["ms"]
    assert list(phase)[:4] == ["torchext ASGD, clip_and_step", "torchext ASGD, two calls",
                               "torchext ASGD, no clip", "torch recipe, SGD(momentum, fused)"]
    assert "torch recipe, AdamW(fused)" in phase
    # The norm kernel alone (CPU here; the CUDA kernel where a GPU runs it):
    # its bytes/s against a copy's, and the composite kernel's two reads.
    assert re.search(r"tensor_norms alone, 3 x 2000 fp32: [\d.]+ GB/s read, \d+% of copy_'s",
                     r.stdout), r.stdout
    norms = run["results"][2]
    assert list(norms["ms"]) == ["tensor_norms (one read: norms + inf check)",
                                 "composite: _foreach_norm + check_finite_ (two reads)",
                                 "torch._foreach_norm (no inf check)"]
    assert norms["extra"]["bytes_per_s"] > 0 and norms["extra"]["copy_bytes_per_s"] > 0


def test_bench_host_runs_quick_and_reports_both_steps(tmp_path):
    # issue 37's host-cost benchmark: runs (--quick), no timing asserted
    out = tmp_path / "host.json"
    r = run_cli("bench", "--device", "cpu", "--quick", "--only", "host", "--json", str(out),
                prelude=NO_TQDM)
    assert r.returncode == 0, r.stderr
    assert "host cost of one step" in r.stdout and "torchext / torch" in r.stdout
    (run,) = json.loads(out.read_text())["runs"]
    got = [(res["case"], res["extra"]["tensors"], list(res["ms"])) for res in run["results"]]
    step, scaler = (["torchext ASGD", "torch fused SGD"],
                    ["torchext GradScaler + ASGD", "torch GradScaler + fused SGD"])
    # --quick: 10x fewer tensors, except the single tensor of the fixed cost
    assert got == [(f"{k} x {n}", q, names) for k, names in
                   (("opt.step()", step), ("scale -> step -> update", scaler))
                   for n, q in ((1, 1), (200, 20), (1000, 100), (10000, 1000))]
    for res in run["results"]:
        assert all(ms > 0 for ms in res["ms"].values())
        assert res["bandwidth_fraction"] is None  # host cost: not bandwidth-bound
    row = next(line for line in r.stdout.splitlines() if line.startswith("| opt.step() "))
    assert "<= 0.5x:" in row


def test_bench_plot_without_matplotlib_fails_before_running(tmp_path):
    r = run_cli("bench", "--quick", "--plot", str(tmp_path / "b.png"),
                prelude="import sys; sys.modules['matplotlib'] = None")
    assert r.returncode == 2
    assert "--plot needs matplotlib" in r.stderr and "pip install torchext[bench]" in r.stderr
    assert "device:" not in r.stdout  # nothing ran
    assert not (tmp_path / "b.png").exists()


def test_bench_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "b.png"
    r = run_cli("bench", "--device", "cpu", "--quick", "--only", "asgd", "--plot", str(png),
                prelude=TINY)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_unknown_benchmark_and_missing_gpu():
    r = run_cli("bench", "--only", "asgd,nope")
    assert r.returncode == 2 and "unknown benchmark nope" in r.stderr
    if not torch.cuda.is_available():
        r = run_cli("bench", "--device", "cuda", "--quick")
        assert r.returncode == 2 and "no CUDA GPU is visible" in r.stderr


def test_progress_bar_counts_every_case(monkeypatch):
    class Bar:
        def __init__(self, total):
            self.total, self.n, self.closed = total, 0, False
            bars.append(self)

        def update(self):
            self.n += 1

        def set_postfix_str(self, s):
            pass

        def close(self):
            self.closed = True

    bars = []
    monkeypatch.setattr(bench.asgd, "CASES", {"t": (2, 500, torch.float32)})
    monkeypatch.setattr(bench.amp, "SIZE", 500)
    env, results = bench.run("cpu", ["asgd", "amp"], quick=True, progress=Bar)
    (bar,) = bars
    assert bar.total == bar.n == 3 and bar.closed  # bandwidth + 2 cases
    assert [len(v) for v in results.values()] == [1, 1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU branch")
def test_gpu_check_without_gpu_says_so_and_fails(tmp_path):
    # PATH without nvidia-smi, as on a machine without the NVIDIA driver
    r = subprocess.run(["bash", os.path.join(SRC, "scripts", "gpu_check.sh")],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PATH": "/usr/bin:/bin", "OUT": str(tmp_path)})
    assert r.returncode == 1
    assert "no NVIDIA GPU found" in r.stdout and "nothing was run" in r.stdout


class _Ops:
    """torch.ops.torchext with one op replaced (a planted bug)."""

    def __init__(self, **replaced):
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(torch.ops.torchext, name)


def test_check_catches_a_wrong_kernel(monkeypatch):
    real_asgd = torch.ops.torchext.asgd_

    def asgd_lr_off_by_10_percent(*args, lr, **kw):
        real_asgd(*args, lr=lr * 1.1, **kw)

    def check_finite_never_flags(tensors, found_inf):
        pass

    monkeypatch.setattr(cli_check, "ops", _Ops(asgd_=asgd_lr_off_by_10_percent,
                                               check_finite_=check_finite_never_flags))
    outcomes = cli_check.run_checks(["cpu"], [c for c in cli_check.CHECKS
                                              if c[0] in ("asgd_ (float lr)", "check_finite_")])
    assert [o.ok for o in outcomes] == [False, False]
    assert outcomes[0].worst > 1 and "param[" in outcomes[0].failures[0]
    assert "found_inf=0.0 but inf/NaN present: True" in outcomes[1].failures[0]


def test_check_catches_a_wrong_packed_kernel(monkeypatch):
    import types
    real = torch.ops.torchext.asgd_

    def packed_skips_the_schedule(params, grads, axs, mus, etas, steps, **kw):
        # the update runs, but step/eta/mu never advance
        saved = [t.clone() for t in (mus, etas, steps)]
        real.packed(params, grads, axs, mus, etas, steps, **kw)
        for t, s in zip((mus, etas, steps), saved):
            t.copy_(s)

    bad = types.SimpleNamespace(packed=packed_skips_the_schedule)
    monkeypatch.setattr(cli_check, "ops", _Ops(asgd_=bad))
    outcomes = cli_check.run_checks(["cpu"], [c for c in cli_check.CHECKS
                                              if c[0] == "asgd_ (packed state)"])
    assert [o.ok for o in outcomes] == [False]
    assert any(f.startswith(("step[", "eta[", "mu[")) for f in outcomes[0].failures)


def test_compile_bench_reports_ratios_only_where_timed_together():
    # torchext/bench/compile.py's table from rows as its child processes
    # write them: a speed-up only for recipes timed interleaved with
    # torchext's (the others keep their own process's ms/step), errors shown.
    from torchext.bench import compile as ts
    from torchext.bench.common import Env
    row = dict(tensors=64, to_steady_s=26.0, to_steady_cpu_s=25.0, recompiles_after_first_call=0,
               steady=True, ms_step=9.0, opt_scaler_ms=0.5, peak_rss_MiB=900.0)
    rows = {"torchext": {**row, "ab_pairs": [(4.0, 0.4), (5.0, 0.5)], "ab_ms_step": 4.5},
            "torch-split": {**row, "to_steady_s": 59.0, "ab_ms_step": 4.4, "ab_speedup": 1.1,
                            "ab_opt_scaler_ms": 1.1},
            "torch-whole": {**row, "ms_step": 7.0},
            "torchext-fullgraph": {"error": "timeout (480 s)"}}
    res = ts.result_of("mlp-64", rows)
    assert res.ms["torchext"] == 4.0  # from its run against torch's recipe
    assert res.speedup == {"torch-split": 1.1}
    text = ts.report(Env("cpu", quick=False), [res])
    assert "timeout (480 s)" in text and "7.00 (own process)" in text and "1.10x" in text
    assert text.index("| torchext ") < text.index("| torch-split ")


def test_compile_bench_rounds_and_clipped_recipes(monkeypatch):
    # --rounds: one child per recipe and round, in turns (the first with a
    # cold cache); each recipe's ratio per round and its interleaved pair are
    # against torchext's recipe with the same clipping (+clip).
    from torchext.bench import compile as ts
    from torchext.bench.common import Env
    assert ts.split_recipe("torch-split+clip") == ("torch-split", True)
    assert ts.base_recipe("torchext-fullgraph+clip") == "torchext+clip"
    assert ts.base_recipe("torch-split") == "torchext"
    assert "torch-split+clip" in ts.default_recipes() and "torchext+clip" in ts.default_recipes()
    ms = {"torchext": [8.0, 7.0, 9.0], "torch-split": [9.6, 7.7, 9.0],
          "torchext+clip": [8.0, 8.0, 8.0], "torch-split+clip": [10.0, 9.6, 8.8]}
    calls = []

    def child(args, cache, timeout):
        if "--ab" in args:
            base, other = args[args.index("--ab") + 1].split(",")
            calls.append(("ab", base, other))
            return {base: [ms[base][0], 0.5], other: [ms[other][0], 1.5]}
        r = args[args.index("--recipe") + 1]
        calls.append(r)
        k = sum(1 for c in calls if c == r) - 1
        return dict(tensors=128, to_steady_s=20.0, to_steady_cpu_s=19.0,
                    recompiles_after_first_call=0, steady=True, ms_step=ms[r][k],
                    opt_scaler_ms=0.5, peak_rss_MiB=900.0, load=0.5 + k)

    monkeypatch.setattr(ts, "_child", child)
    recipes = ["torchext", "torch-split", "torchext+clip", "torch-split+clip"]
    rows = ts.run_model("mlp-128", recipes, torch.device("cpu"), repeat=5, timeout=1, rounds=3)
    assert calls[:12] == recipes * 3  # rounds in turns
    assert calls[12:] == [("ab", "torchext", "torch-split"),
                          ("ab", "torchext+clip", "torch-split+clip")]
    assert rows["torch-split"]["round_speedups"] == pytest.approx([1.2, 1.1, 1.0])
    assert rows["torch-split+clip"]["round_speedups"] == pytest.approx([1.25, 1.2, 1.1])
    res = ts.result_of("mlp-128", rows)
    assert res.speedup == pytest.approx({"torch-split": 1.2, "torch-split+clip": 1.25})
    text = ts.report(Env("cpu", quick=False), [res])
    assert "1.20x (1.10-1.25x)" in text and "9.60 (8.80-10.00)" in text
    assert "clipped" in text and "1.5 (0.5-2.5)" in text  # loads of the three rounds
    assert ("warning: load up to 2.5" in text) == (2.5 > ts.BUSY_LOAD + torch.get_num_threads())
    monkeypatch.setattr(ts, "BUSY_LOAD", -torch.get_num_threads())  # any load is "busy"
    assert "warning: load up to 2.5" in ts.report(Env("cpu", quick=False), [res])
    # --threads reaches every child
    calls.clear()
    seen = []
    monkeypatch.setattr(ts, "_child", lambda args, cache, timeout: seen.append(args) or child(
        args, cache, timeout))
    ts.run_model("mlp-128", recipes[:2], torch.device("cpu"), repeat=5, timeout=1, threads=1)
    assert len(seen) == 3 and all(a[a.index("--threads") + 1] == "1" for a in seen)


def test_compile_bench_phases_table():
    # --phases: ms per phase of each step, recipes in turns in one process.
    from torchext.bench import compile as ts
    d = dict(total=7.4, p10=7.0, p90=7.8, zero_grad=0.17, forward=3.0, scale=0.012,
             backward=3.7, clip=0.001, step=0.375, update=0.034)
    text = ts.phases_report("mlp-128", {"load": [1.5, 2.0], "torchext": d}, cpu_time=False)
    assert "wall time" in text and "load 1.5 -> 2.0" in text
    row = next(line for line in text.splitlines() if line.startswith("| torchext "))
    assert "7.40 (7.00-7.80)" in row and "| 0.375 " in row
    header = next(line for line in text.splitlines() if line.startswith("| recipe "))
    assert [h.strip() for h in header.strip("|").split("|")][2:] == list(ts.STEP_PHASES)
