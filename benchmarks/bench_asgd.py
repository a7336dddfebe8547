"""The 'asgd' benchmark of `python -m torchext bench` (torchext/bench/asgd.py:
cases in its CASES table), printing its table:

    python benchmarks/bench_asgd.py [--device cpu|cuda] [--quick]
"""
from torchext.bench import script_main

if __name__ == "__main__":
    script_main("asgd")
