"""torchext's ratio benchmarks (``python -m torchext bench``). Each benchmark
module has ``NAME``,
``cases(env)`` (case names), ``run_case(env, name)`` (a :class:`Result`) and
``report(env, results)`` (its table).

JSON written by ``--json`` (``SCHEMA_VERSION`` = 1)::

    {"schema_version": 1, "torchext_version": "0.1.0", "torch_version": "2.14.1+cu130",
     "quick": false,
     "runs": [                                  # one per device
       {"device": "cpu", "threads": 2,
        "bandwidth_GBps": {"bound": 40.1, "copy": 25.1, "inplace_add": 40.1},
        "array_MiB": 512,                       # array size of the bandwidth measurement
        "results": [
          {"benchmark": "asgd",                 # asgd | amp | clip | compile | gpu_targets | host
           "case": "(a) 200 x 50k fp32",
           "ms": {"torchext": 3.12, "torch foreach": 17.3, ...},  # torchext's setup first
           "speedup": {"torch foreach": 5.56, ...},  # other setup's ms / torchext's ms
           "bandwidth_fraction": 1.6,           # bytes moved / time / bound; null if n/a
           "extra": {...}}]}]}                  # case details (tensors, numel, dtype)
"""
import dataclasses

import torch

import torchext

from . import amp, asgd, clip, compile, gpu_targets, host
from .common import Env, Result, bandwidth

BENCHMARKS = {m.NAME: m for m in (asgd, amp, clip, compile, gpu_targets, host)}
SCHEMA_VERSION = 1


def measure_env(device, quick):
    bw, bw_copy, bw_add = bandwidth(device, quick)
    return Env(device, quick, bw, bw_copy, bw_add, array_mib=64 if quick else 512)


def run(device, names=tuple(BENCHMARKS), quick=False, progress=None):
    """Runs the named benchmarks on one device. progress(n_tasks) returns an
    object with update() and close() (a tqdm bar), or None for no bar.
    Returns (env, {name: [Result, ...]})."""
    todo = [(name, BENCHMARKS[name]) for name in names]
    bar = progress(1 + sum(len(m.cases(Env(device, quick))) for _, m in todo)) if progress \
        else None
    try:
        env = measure_env(device, quick)
        if bar:
            bar.update()
        results = {}
        for name, mod in todo:
            results[name] = []
            for case in mod.cases(env):
                if bar:
                    bar.set_postfix_str(f"{name} {case}")
                results[name].append(mod.run_case(env, case))
                if bar:
                    bar.update()
    finally:
        if bar:
            bar.close()
    return env, results


def reports(env, results):
    return "\n\n".join(BENCHMARKS[name].report(env, rs) for name, rs in results.items() if rs)


def to_json(runs, quick):
    """runs: [(env, results)] as returned by run(); see the module docstring."""
    return {
        "schema_version": SCHEMA_VERSION,
        "torchext_version": torchext.__version__,
        "torch_version": torch.__version__,
        "quick": quick,
        "runs": [{
            "device": env.device,
            "threads": torch.get_num_threads(),
            "bandwidth_GBps": {"bound": env.bandwidth / 1e9, "copy": env.copy_bandwidth / 1e9,
                               "inplace_add": env.add_bandwidth / 1e9},
            "array_MiB": env.array_mib,
            "results": [dataclasses.asdict(r) for rs in results.values() for r in rs],
        } for env, results in runs],
    }


__all__ = ["BENCHMARKS", "Env", "Result", "SCHEMA_VERSION", "run", "reports", "to_json"]
