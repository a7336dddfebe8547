"""Compiled training at real sizes: every torch.compile recipe for a whole
training step (forward, backward, GradScaler, ASGD), torch's classes against
torchext's, on MLPs of 16 to 1024 parameter tensors and on real models
(HF transformers' GPT-2; timm on a CUDA build).

Every recipe runs without and, with a ``+clip`` suffix, with gradient
clipping (``max_norm`` half the gradients' norm at the first step, so the clip
is active): torch's recipes call ``scaler.unscale_(opt)`` and
``torch.nn.utils.clip_grad_norm_`` eagerly (or in their graph), torchext's
``scaler.clip_and_step(opt, max_norm)`` (the clip folded into the step: its
"clip" phase is then part of "step").

Per model and recipe: the time to reach the steady state (every compile and
recompile until none comes, cold inductor cache), the recompiles after the
first call, ms/step, the optimizer + scaler part of a step where it runs
outside a graph (the clip included), and the peak RSS. Compile times are only
comparable one setup per process, so each (model, recipe) runs in a child
process of its own, with a fresh inductor cache; then ``--rounds`` - 1 more
rounds of one child per recipe, in turns (warm caches), give ms/step as a
median and range over rounds, and each recipe's ratio to torchext's recipe
(with the same clipping) per round; the ms/step ratios are also measured in
one process, setups interleaved (``--ab``).

    python -m torchext bench --only compile [--device cpu|cuda] [--quick]
    python -m torchext.bench.compile --models mlp-64,gpt2 --recipes torch-split,torchext
    python -m torchext.bench.compile --models mlp-128 --recipes torchext,torch-split,torchext+clip,torch-split+clip
    python -m torchext.bench.compile --phases --models mlp-128 [--cpu-time --threads 1]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from .common import Result, table

NAME = "compile"

#: Models: MLPs of Linear(64, 64) + Tanh giving that many parameter tensors,
#: HF transformers' GPT-2 (12 layers, width 64: 148 tensors), a timm ResNet-18.
MODELS = ("mlp-16", "mlp-64", "mlp-128", "mlp-256", "mlp-1024", "gpt2", "timm")
QUICK_MODELS = ("mlp-16",)

#: recipe -> (library, description). The first is torchext's recommended one.
RECIPES = {
    "torchext": ("torchext", "compiled model, eager torchext step (recommended)"),
    "torch-split": ("torch", "compiled model + compiled opt.step, eager scaler "
                             "(torch's recipe)"),
    "torch-whole": ("torch", "torch.compile(train_step)"),
    "torch-eager-step": ("torch", "compiled model, eager step"),
    "torchext-fullgraph": ("torchext", "torch.compile(train_step, fullgraph=True) + "
                                       "trace_autograd_ops"),
    "torchext-split": ("torchext", "compiled model + compiled opt.step (torch's recipe)"),
    "torchext-whole": ("torchext", "torch.compile(train_step)"),
}
CUDA_RECIPES = {
    "torchext-cudagraphs": ("torchext", "model compiled with mode='reduce-overhead', eager "
                                        "capturable step"),
}
QUICK_RECIPES = ("torchext", "torch-split")
#: A recipe name ending in CLIP clips the gradients (see the module docstring).
CLIP = "+clip"
#: The recipes run with clipping too by default: torch's best recipe, torchext's
#: recommended one and its whole step.
CLIP_RECIPES = ("torchext", "torch-split", "torchext-fullgraph")


def split_recipe(recipe):
    """(the recipe without its clip suffix, whether it clips)."""
    if recipe.endswith(CLIP):
        return recipe[:-len(CLIP)], True
    return recipe, False


def base_recipe(recipe):
    """torchext's recommended recipe with the same clipping: what ``recipe``
    is compared with."""
    return "torchext" + (CLIP if split_recipe(recipe)[1] else "")


def describe(recipe):
    name, clip = split_recipe(recipe)
    what = (RECIPES.get(name) or CUDA_RECIPES[name])[1]
    return what + (", clipped" if clip else "")


def default_recipes(device_type="cpu"):
    names = list(RECIPES) + (list(CUDA_RECIPES) if device_type == "cuda" else [])
    return names + [r + CLIP for r in CLIP_RECIPES]


def _autocast(device):
    dtype = torch.bfloat16 if device.type == "cpu" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def build_model(name, device):
    """(model, inputs, loss_fn(model, *inputs)) with fixed seeds. Raises
    ImportError (with the reason) for a library that is missing."""
    torch.manual_seed(0)
    if name.startswith("mlp-"):
        layers = []
        for _ in range(int(name[4:]) // 2):
            layers += [torch.nn.Linear(64, 64), torch.nn.Tanh()]
        model = torch.nn.Sequential(*layers)
        inputs = (torch.randn(32, 64), torch.randn(32, 64))

        def loss_fn(m, x, y):
            return torch.nn.functional.mse_loss(m(x), y)
    elif name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=12, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)
        model = GPT2LMHeadModel(cfg)
        ids = torch.randint(0, cfg.vocab_size, (8, 64))
        inputs = (ids, ids)

        def loss_fn(m, x, y):
            return m(input_ids=x, labels=y).loss
    elif name == "timm":
        if device.type != "cuda":
            raise ImportError("timm's models run on the CUDA build only here (a CPU model "
                              "of that size compiles for minutes)")
        import timm
        model = timm.create_model("resnet18", num_classes=10)
        inputs = (torch.randn(32, 3, 64, 64), torch.randint(0, 10, (32,)))

        def loss_fn(m, x, y):
            return torch.nn.functional.cross_entropy(m(x), y)
    else:
        raise ValueError(f"unknown model {name!r} (choose from {', '.join(MODELS)})")
    model = model.to(device)
    return model, tuple(t.to(device) for t in inputs), loss_fn


def clip_max_norm(model, inputs, loss_fn, device):
    """Half the norm of the (unscaled) gradients of a first eager step on a
    copy of the model: every clipped recipe clips with it, so the clip is
    active from the first step on."""
    m = copy.deepcopy(model)
    with _autocast(device):
        loss = loss_fn(m, *inputs)
    loss.backward()
    grads = [p.grad for p in m.parameters() if p.grad is not None]
    return 0.5 * float(torch.nn.utils.get_total_norm(grads))


class Setup:
    """One recipe on one model: ``step(*inputs)`` runs a training step;
    ``opt_ms`` collects the optimizer + scaler part of each step (the clip
    included) where that part runs outside a graph (CPU only: on CUDA it
    would need a sync). A ``+clip`` recipe clips to ``max_norm``."""

    def __init__(self, recipe, model, loss_fn, device, max_norm=None):
        import torchext
        recipe, clip = split_recipe(recipe)
        if clip and max_norm is None:
            raise ValueError(f"{recipe}{CLIP} needs max_norm")
        lib = (RECIPES.get(recipe) or CUDA_RECIPES[recipe])[0]
        lr = torch.tensor(0.01)
        capturable = recipe == "torchext-cudagraphs"
        if lib == "torchext":
            opt = torchext.optim.ASGD(model.parameters(), lr=lr, t0=5, capturable=capturable)
            scaler = torchext.amp.GradScaler(init_scale=2.0**10)
        else:
            opt = torch.optim.ASGD(model.parameters(), lr=lr, t0=5)
            scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
        self.opt, self.scaler, self.opt_ms = opt, scaler, []
        timed = device.type == "cpu" and not recipe.endswith(("-whole", "-fullgraph"))
        net = model
        if recipe.endswith(("-split", "-eager-step")) or recipe == "torchext":
            net = torch.compile(model)
        elif recipe == "torchext-cudagraphs":
            net = torch.compile(model, mode="reduce-overhead")
        if recipe.endswith("-split"):
            eager_opt_step = opt.step

            def opt_step():
                eager_opt_step()

            # torch's recipe for its optimizers: not fullgraph
            compiled_opt_step = torch.compile(
                _own_code(opt_step, recipe + ("_clip" if clip else "")))

            # scaler.step(opt) calls opt.step(): route it to the compiled one.
            opt.step = lambda *args, **kwargs: compiled_opt_step()

        params = [p for g in opt.param_groups for p in g["params"]]

        def clip_grads():
            # torch's recipe: unscale, then clip (torchext's folds its clip
            # into the step: step_opt)
            if lib != "torchext":
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, max_norm)

        def step_opt():
            if clip and lib == "torchext":
                scaler.clip_and_step(opt, max_norm)
            else:
                scaler.step(opt)

        def train_step(*inputs):
            opt.zero_grad(set_to_none=True)
            with _autocast(device):
                loss = loss_fn(net, *inputs)
            scaler.scale(loss).backward()
            t0 = time.perf_counter() if timed else None
            if clip:
                clip_grads()
            step_opt()
            scaler.update()
            if t0 is not None:
                self.opt_ms.append((time.perf_counter() - t0) * 1e3)
            return loss.detach()

        def phased_step(*inputs, clock=time.perf_counter):
            # train_step's work, with a clock reading between its phases
            t = [clock()]
            opt.zero_grad(set_to_none=True)
            t.append(clock())
            with _autocast(device):
                loss = loss_fn(net, *inputs)
            t.append(clock())
            scaled = scaler.scale(loss)
            t.append(clock())
            scaled.backward()
            t.append(clock())
            if clip:
                clip_grads()
            t.append(clock())
            step_opt()
            t.append(clock())
            scaler.update()
            t.append(clock())
            return [(b - a) * 1e3 for a, b in zip(t, t[1:])]

        # (recipes whose step runs outside a graph only)
        self.phased_step = phased_step if timed else None
        tag = recipe + ("_clip" if clip else "")
        self.step = train_step = _own_code(train_step, tag)
        self.trace_autograd_ops = recipe == "torchext-fullgraph"
        if recipe.endswith("-whole"):
            self.step = torch.compile(train_step)
        elif recipe == "torchext-fullgraph":
            self.step = torch.compile(train_step, fullgraph=True)

    def __call__(self, *inputs):
        if self.trace_autograd_ops:  # backward() inside the graph (docs/compile.md)
            with torch._dynamo.config.patch(trace_autograd_ops=True):
                return self.step(*inputs)
        return self.step(*inputs)


def _own_code(fn, recipe):
    """fn with a code object of its own: Dynamo keeps its caches per code
    object, and setups sharing one in a process (--ab) confuse it."""
    fn.__code__ = fn.__code__.replace(co_name=f"{fn.__name__}_{recipe.replace('-', '_')}")
    return fn


def _cpu_seconds():
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_one(model_name, recipe, device, repeat, max_calls=12, confirm=3):
    """Child process: to steady state, recompiles, ms/step, peak RSS."""
    from torch._dynamo.callback import callback_handler
    model, inputs, loss_fn = build_model(model_name, device)
    n_tensors = sum(1 for _ in model.parameters())
    max_norm = (clip_max_norm(model, inputs, loss_fn, device) if split_recipe(recipe)[1]
                else None)
    compiles = []
    callback_handler.register_start_callback(lambda args: compiles.append(args))
    setup = Setup(recipe, model, loss_fn, device, max_norm)
    calls, compiled_in = [], []
    quiet = 0
    cpu0 = _cpu_seconds()
    while len(calls) < max_calls and quiet < confirm:
        n0 = len(compiles)
        t0 = time.perf_counter()
        setup(*inputs)
        _sync(device)
        calls.append(time.perf_counter() - t0)
        compiled_in.append(len(compiles) - n0)
        quiet = 0 if compiled_in[-1] else quiet + 1
    cpu_to_steady = _cpu_seconds() - cpu0
    last = max((i for i, n in enumerate(compiled_in) if n), default=-1)
    setup.opt_ms.clear()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        setup(*inputs)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return {
        "tensors": n_tensors,
        "to_steady_s": sum(calls[:last + 1]),
        # CPU seconds of the warm-up calls, the compiler's included (the
        # children compile in-process, see _child): what a busy machine
        # does not distort.
        "to_steady_cpu_s": cpu_to_steady,
        "first_call_s": calls[0],
        "compiles": len(compiles),
        "recompiles_after_first_call": sum(compiled_in[1:]),
        "steady": quiet >= confirm,
        "ms_step": statistics.median(times) * 1e3,
        "opt_scaler_ms": statistics.median(setup.opt_ms) if setup.opt_ms else None,
        "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "phases_s": compile_phases(),
        # the machine's 1-minute load average as the timing ended (other
        # jobs on a 2-core machine inflate every time, compiles most)
        "load": os.getloadavg()[0],
        "max_norm": max_norm,
    }


#: Where compile time goes (torch._dynamo.utils.compile_times, seconds
#: summed over every compile of the process): tracing the bytecode, the
#: backend (AOTAutograd + inductor) for forward graphs, the backward
#: compiled at its first run, guards, and the C++ compiler.
PHASES = {"dynamo tracing": "bytecode_tracing", "backend (fw)": "OutputGraph.call_user_compiler",
          "backward compile": "backward._backward_impl", "inductor lowering": "GraphLowering.run",
          "C++ compiler": "compile_file", "guards": "build_guards"}


def compile_phases():
    try:
        from torch._dynamo.utils import compile_times
        names, values = compile_times(repr="csv", aggregate=True)
    except Exception:  # a private API: the breakdown is optional
        return {}
    got = dict(zip(names, values))
    return {k: round(float(got[v]), 2) for k, v in PHASES.items() if v in got}


def measure_interleaved(model_name, recipes, device, repeat):
    """Child process: every recipe on its own copy of the model, timed in
    turns (one step of each per round), so that their ratios hold on a busy
    machine. Returns {recipe: (ms/step, optimizer + scaler ms or None)}."""
    base, inputs, loss_fn = build_model(model_name, device)
    max_norm = (clip_max_norm(base, inputs, loss_fn, device)
                if any(split_recipe(r)[1] for r in recipes) else None)
    setups = {r: Setup(r, copy.deepcopy(base), loss_fn, device,
                       max_norm if split_recipe(r)[1] else None) for r in recipes}
    for s in setups.values():
        for _ in range(4):
            s(*inputs)
        s.opt_ms.clear()
    samples = {r: [] for r in recipes}
    for _ in range(repeat):
        for r, s in setups.items():
            _sync(device)
            t0 = time.perf_counter()
            s(*inputs)
            _sync(device)
            samples[r].append(time.perf_counter() - t0)
    return {r: (statistics.median(v) * 1e3,
                statistics.median(setups[r].opt_ms) if setups[r].opt_ms else None)
            for r, v in samples.items()}


#: The phases of a step (Setup.phased_step), in order.
STEP_PHASES = ("zero_grad", "forward", "scale", "backward", "clip", "step", "update")


def measure_phases(model_name, recipes, device, repeat, cpu_time=False):
    """Where a step's time goes: every recipe whose step runs outside a graph
    (others are left out), each on its own copy of the model, timed in turns
    (one step of each per round) phase by phase, in wall time or (cpu_time)
    in the process's CPU time, which other jobs on the machine distort less
    (with one thread; with more, CPU time counts OpenMP's spin-waits too).
    Returns {recipe: {"total": median ms/step, "p10", "p90", phase: median
    ms}}, and "load": the 1-minute load average before and after."""
    base, inputs, loss_fn = build_model(model_name, device)
    max_norm = (clip_max_norm(base, inputs, loss_fn, device)
                if any(split_recipe(r)[1] for r in recipes) else None)
    setups = {r: Setup(r, copy.deepcopy(base), loss_fn, device,
                       max_norm if split_recipe(r)[1] else None) for r in recipes}
    setups = {r: s for r, s in setups.items() if s.phased_step is not None}
    clock = time.process_time if cpu_time else time.perf_counter
    for s in setups.values():
        for _ in range(4):
            s(*inputs)
    load = [os.getloadavg()[0]]
    samples = {r: [] for r in setups}
    for _ in range(repeat):
        for r, s in setups.items():
            samples[r].append(s.phased_step(*inputs, clock=clock))
    load.append(os.getloadavg()[0])
    out = {"load": load}
    for r, v in samples.items():
        totals = sorted(sum(x) for x in v)
        out[r] = {"total": statistics.median(totals), "p10": totals[len(totals) // 10],
                  "p90": totals[(9 * len(totals)) // 10],
                  **{ph: statistics.median(x[i] for x in v) for i, ph in enumerate(STEP_PHASES)}}
    return out


def phases_report(model_name, res, cpu_time):
    load = res["load"]
    lines = [[r, f"{d['total']:.2f} ({d['p10']:.2f}-{d['p90']:.2f})"]
             + [f"{d[ph]:.3f}" for ph in STEP_PHASES] for r, d in res.items() if r != "load"]
    n = torch.get_num_threads()
    head = (f"{model_name}: ms per phase ({'CPU' if cpu_time else 'wall'} time, "
            f"{n} thread{'s' if n > 1 else ''}), recipes in turns in one process, medians; "
            f"load {load[0]:.1f} -> {load[1]:.1f}")
    return head + "\n" + table(["recipe", "ms/step (p10-p90)", *STEP_PHASES], lines)


def _child(args, cache_dir, timeout):
    """Runs this module as a child process; returns its JSON (or an error)."""
    # One compile thread: inductor then runs the C++ compiler as a waited-for
    # child, so the CPU time of compiling is counted (a pool's is not).
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir,
               TORCHINDUCTOR_FX_GRAPH_CACHE="1", TORCHINDUCTOR_COMPILE_THREADS="1")
    cmd = [sys.executable, "-c", "import sys; from torchext.bench.compile import main; "
           "sys.exit(main(sys.argv[1:]))", "--child", *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout ({timeout:.0f} s)"}
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    lines = out.stderr.strip().splitlines() or ["no output"]
    # The exception's own line (Dynamo ends with advice lines after it).
    why = [ln for ln in lines if not ln.startswith(" ") and ("Error" in ln or "Unsupported" in ln)]
    return {"error": (why or lines)[-1][:200]}


def _round_of(k, res):
    return {"round": k, "ms_step": res["ms_step"], "opt_scaler_ms": res["opt_scaler_ms"],
            "load": res.get("load")}


def run_model(model_name, recipes, device, repeat, timeout, ab=True, log=None, ab_with=None,
              rounds=1, threads=None):
    """Every recipe on one model, one child each (cold cache: the time to
    steady state), then ``rounds`` - 1 more rounds of one child per recipe in
    turns (each with its own cache, warm by then) for ms/step over rounds,
    then the interleaved ms/step of those that finished against torchext's
    recipe with the same clipping, in one child (their caches merged, so it
    compiles fast). ``threads``: torch.set_num_threads in the children.
    Returns {recipe: row}."""
    rows = {}
    more = [] if threads is None else ["--threads", str(threads)]
    tmp = tempfile.mkdtemp(prefix="torchext-bench-")
    merged = os.path.join(tmp, "merged")
    try:
        for k in range(rounds):
            for r in recipes:
                if k and "error" in rows[r]:
                    continue
                cache = os.path.join(tmp, r)
                res = _child(["--model", model_name, "--recipe", r, "--device", device.type,
                              "--repeat", str(repeat), *more], cache, timeout)
                if log:
                    log(f"{model_name} {r}, round {k + 1}: {res}")
                if k == 0:
                    rows[r] = res
                    if "error" not in res:
                        res["rounds"] = [_round_of(k, res)]
                        if os.path.isdir(cache):
                            shutil.copytree(cache, merged, dirs_exist_ok=True)
                elif "error" in res:
                    rows[r].setdefault("round_errors", []).append(res["error"])
                else:
                    rows[r]["rounds"].append(_round_of(k, res))
        # Per round, each recipe against torchext's (same clipping): the
        # processes ran one after the other, so the load they met was alike.
        for r, row in rows.items():
            base = rows.get(base_recipe(r))
            if r == base_recipe(r) or not base or "rounds" not in base or "rounds" not in row:
                continue
            ours = {t["round"]: t["ms_step"] for t in base["rounds"]}
            row["round_speedups"] = [t["ms_step"] / ours[t["round"]] for t in row["rounds"]
                                     if t["round"] in ours]
        # Each recipe timed against torchext's recommended one in one process,
        # interleaved (pairs: Dynamo mixes up some setups sharing a process).
        done = [r for r in recipes if "error" not in rows[r]]
        for r in done if ab else ():
            base = base_recipe(r)
            if r == base or base not in done or (ab_with is not None and r not in ab_with):
                continue
            res = _child(["--model", model_name, "--ab", f"{base},{r}", "--device",
                          device.type, "--repeat", str(repeat), *more], merged, timeout * 2)
            if log:
                log(f"{model_name} {base} vs {r}, interleaved: {res}")
            if "error" in res:
                rows[r]["ab_error"] = res["error"]
                continue
            (ours, ours_opt), (theirs, theirs_opt) = res[base], res[r]
            rows[r].update(ab_ms_step=theirs, ab_opt_scaler_ms=theirs_opt,
                           ab_speedup=theirs / ours)
            rows[base].setdefault("ab_pairs", []).append((ours, ours_opt))
        for r in done:
            pairs = rows[r].get("ab_pairs")
            if pairs:
                rows[r]["ab_ms_step"] = statistics.median(p[0] for p in pairs)
                if pairs[0][1] is not None:
                    rows[r]["ab_opt_scaler_ms"] = statistics.median(p[1] for p in pairs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


# ------------------------------------------------------------- bench plugin

def cases(env):
    models = QUICK_MODELS if env.quick else MODELS
    return [m for m in models if m != "timm" or env.device == "cuda"]


def recipes_for(env):
    if env.quick:
        return list(QUICK_RECIPES)
    return default_recipes(env.device)


def run_case(env, name):
    device = torch.device(env.device)
    rows = run_model(name, recipes_for(env), device, repeat=10 if env.quick else 40,
                     timeout=float(os.environ.get("TORCHEXT_BENCH_TIMEOUT", 900)),
                     rounds=1 if env.quick else 3)
    return result_of(name, rows)


def result_of(name, rows):
    """A Result: ms/step per recipe (the interleaved timing when there is
    one), torchext's recommended recipe first; speed-ups against torchext's
    recipe with the same clipping; extra holds every row."""
    ms = {}
    for r, row in rows.items():
        if "error" not in row:
            ms[r] = row.get("ab_ms_step", row["ms_step"])
    for r, row in rows.items():
        pairs = row.get("ab_pairs")
        if pairs:  # torchext's own: from its first pair (torch's recipe when it ran)
            ms[r] = pairs[0][0]
    tensors = next((row["tensors"] for row in rows.values() if "tensors" in row), None)
    # Ratios only where both were timed in one process (interleaved).
    speedup = {r: rows[r]["ab_speedup"] for r in ms if "ab_speedup" in rows[r]}
    return Result(NAME, name, ms=ms, speedup=speedup,
                  extra={"tensors": tensors, "recipes": rows})


#: Load above the benchmark's own threads plus this: the machine was busy.
BUSY_LOAD = 1.0


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _spread(values, spec, unit=""):
    """median (min-max) of the rounds' values; a single value alone."""
    if not values:
        return ""
    med = format(statistics.median(values), spec) + unit
    if len(values) == 1:
        return med
    return f"{med} ({min(values):{spec}}-{max(values):{spec}}{unit})"


def report(env, results):
    n = torch.get_num_threads()
    out = [f"Compiled training step, {env.device}, {n} thread{'s' if n > 1 else ''}, torch "
           f"{torch.__version__}. to steady: every compile and recompile until none comes "
           f"(cold inductor cache, one process per recipe); ms/step and speed-up: timed "
           f"interleaved in one process against torchext's recommended recipe with the same "
           f"clipping (torchext's ms/step: from its run against torch's recipe); rounds: one "
           f"process per recipe and round, in turns, median (range) over rounds; load: the "
           f"1-minute load average as each round's timing ended"]
    for res in results:
        rows = res.extra["recipes"]
        lines = []
        for r, row in rows.items():
            what = describe(r)
            if "error" in row:
                lines.append([r, what, row["error"]] + [""] * 9)
                continue
            sp = res.speedup.get(r)
            cpu = row.get("to_steady_cpu_s")
            opt_ms = (row["ab_pairs"][0][1] if row.get("ab_pairs") else
                      row.get("ab_opt_scaler_ms", row["opt_scaler_ms"]))
            rounds = row.get("rounds", [])
            loads = [t["load"] for t in rounds if t.get("load") is not None]
            lines.append([r, what, f"{row['to_steady_s']:.1f} s"
                          + ("" if cpu is None else f" ({cpu:.0f} cpu-s)"),
                          str(row["recompiles_after_first_call"]) + ("" if row["steady"] else "+"),
                          f"{res.ms[r]:.2f}" + ("" if "ab_ms_step" in row or r == base_recipe(r)
                                                  else " (own process)"),
                          "" if sp is None else f"{sp:.2f}x",
                          _spread([t["ms_step"] for t in rounds], ".2f"),
                          _spread(row.get("round_speedups", []), ".2f", "x"),
                          _fmt(opt_ms, ".3f"),
                          "" if opt_ms is None else f"{opt_ms / res.ms[r]:.0%}",
                          _spread(loads, ".1f"),
                          f"{row['peak_rss_MiB']:.0f}"])
        out.append(f"\n{res.case} ({res.extra['tensors']} parameter tensors)")
        out.append(table(["recipe", "what", "to steady", "recompiles", "ms/step", "speed-up",
                          "ms/step, rounds", "speed-up, rounds", "opt+scaler ms", "of step",
                          "load", "peak RSS MiB"], lines))
        loads = [t["load"] for row in rows.values() for t in row.get("rounds", ())
                 if t.get("load") is not None]
        busy = BUSY_LOAD + torch.get_num_threads()
        if loads and max(loads) > busy:
            n = torch.get_num_threads()
            team = (f", and an OpenMP team of {n} threads then waits at every parallel "
                    f"region for a thread that is not running, so ms/step can be many times "
                    f"a quiet run's (--threads 1 suffers least)" if n > 1 else "")
            out.append(f"warning: load up to {max(loads):.1f} (above {busy:.0f}): other "
                       f"processes shared the cores{team}; compare rounds of similar load, "
                       f"or rerun")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", default=",".join(MODELS[:-1]))
    ap.add_argument("--recipes", help="comma-separated; a +clip suffix clips (default: every "
                    "recipe, and torchext, torch-split and torchext-fullgraph with +clip)")
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3, help="processes per recipe (the first "
                    "with a cold cache), in turns: ms/step as median and range over rounds")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per child process")
    ap.add_argument("--no-ab", action="store_true", help="skip the interleaved timing")
    ap.add_argument("--ab-with", help="time only these recipes interleaved with torchext's "
                    "(default: all; the others keep their own process's ms/step)")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--plot", metavar="PNG", help="time to steady state and speed per step "
                    "(needs matplotlib)")
    ap.add_argument("--phases", action="store_true", help="only time each step's phases "
                    "(zero_grad, forward, scale, backward, clip, step, update) of the recipes "
                    "whose step runs outside a graph, in turns in this process")
    ap.add_argument("--cpu-time", action="store_true", help="--phases in CPU time")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads where steps are timed "
                    "(on a shared machine, 1 keeps an OpenMP team from waiting on a thread "
                    "another process holds up)")
    ap.add_argument("--from-json", nargs="+", metavar="FILE",
                    help="only draw --plot / print the tables from earlier --json files")
    # internal: one child process
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--recipe", help=argparse.SUPPRESS)
    ap.add_argument("--ab", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        try:
            if args.ab:
                res = measure_interleaved(args.model, args.ab.split(","), device, args.repeat)
            else:
                res = measure_one(args.model, args.recipe, device, args.repeat)
        except ImportError as e:
            res = {"error": f"skipped: {e}"}
        print(json.dumps(res), flush=True)
        return 0
    if args.phases:
        for m in args.models.split(","):
            recipes = (args.recipes.split(",") if args.recipes
                       else ["torchext", "torch-split", "torchext+clip", "torch-split+clip"])
            res = measure_phases(m, recipes, device, args.repeat, args.cpu_time)
            print(phases_report(m, res, args.cpu_time), flush=True)
        return 0
    from .common import Env
    env = Env(args.device, quick=False)
    results = []
    if args.from_json:
        for path in args.from_json:
            with open(path) as f:
                results += [result_of(d["case"], d["extra"]["recipes"]) for d in json.load(f)]
        print(report(env, results))
        if args.plot:
            from .plot import plot_compile
            import dataclasses
            plot_compile([dataclasses.asdict(r) for r in results], args.plot,
                         f"compiled training step, {args.device}, torch {torch.__version__}")
        return 0
    for m in args.models.split(","):
        recipes = args.recipes.split(",") if args.recipes else default_recipes(device.type)
        rows = run_model(m, recipes, device, args.repeat, args.timeout,
                         ab=not args.no_ab, log=lambda s: print(s, file=sys.stderr, flush=True),
                         ab_with=args.ab_with.split(",") if args.ab_with else None,
                         rounds=args.rounds, threads=args.threads)
        results.append(result_of(m, rows))
        print(report(env, results[-1:]), flush=True)
    import dataclasses
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in results], f, indent=1)
    if args.plot:
        from .plot import plot_compile
        plot_compile([dataclasses.asdict(r) for r in results], args.plot,
                     f"compiled training step, {args.device}, torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
