"""The 'compile' benchmark of `python -m torchext bench` (torchext/bench/train_step.py),
printing its table:

    python benchmarks/bench_compile.py [--device cpu|cuda] [--quick]
"""
from torchext.bench import script_main

if __name__ == "__main__":
    script_main("compile")
