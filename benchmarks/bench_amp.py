"""The 'amp' benchmark of `python -m torchext bench` (torchext/bench/amp.py),
printing its table:

    python benchmarks/bench_amp.py [--device cpu|cuda] [--quick]
"""
from torchext.bench import script_main

if __name__ == "__main__":
    script_main("amp")
