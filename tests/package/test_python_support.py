"""The Pythons torchext says it runs on: setup.py's ``python_requires`` and
the abi3 wheel tag (``bdist_wheel``'s ``py_limited_api``) are both the
oldest Python that the supported torch range has wheels for (the range's
one source: ``torchext._compile_compat.SUPPORTED_TORCH``), every wheel name
in the tree (docs, scripts, CI, tests) carries that tag, and an installed
wheel's metadata says the same."""
import ast
import glob
import importlib.metadata
import os
import re

import pytest

import torchext
from helpers import INSTALLED, SRC
from torchext._compile_compat import SUPPORTED_TORCH

#: The oldest Python each torch minor release has wheels for, from the
#: package index (`pip index versions torch --python-version 3.9|3.10|3.11
#: --only-binary=:all:`, checked 2026-12: torch 2.8.0 is the last with
#: cp39 wheels, 2.14.1 the last with cp310 ones, 2.15.0 starts at cp311).
#: A torch added to SUPPORTED_TORCH needs its row here.
TORCH_MIN_PYTHON = {
    (2, 11): (3, 10),
    (2, 12): (3, 10),
    (2, 13): (3, 10),
    (2, 14): (3, 10),
    (2, 15): (3, 11),
}


def supported_torch():
    (major, lo), (major_hi, hi) = SUPPORTED_TORCH
    assert major == major_hi == 2
    return [(2, m) for m in range(lo, hi + 1)]


def oldest_python():
    return min(TORCH_MIN_PYTHON[t] for t in supported_torch())


def abi3_tag():
    major, minor = oldest_python()
    return f"cp{major}{minor}"


def setup_kwargs():
    """python_requires and the bdist_wheel options of setup.py's setup() call
    (literals: read with ast, nothing of setup.py runs)."""
    with open(os.path.join(SRC, "setup.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "setup"]
    assert len(calls) == 1
    kw = {k.arg: k.value for k in calls[0].keywords}
    return ast.literal_eval(kw["python_requires"]), ast.literal_eval(kw["options"])


def test_the_table_covers_the_supported_torch_range():
    missing = [t for t in supported_torch() if t not in TORCH_MIN_PYTHON]
    assert not missing, f"no oldest Python for torch {missing}: add a row to TORCH_MIN_PYTHON"
    assert oldest_python() == (3, 10)  # torch 2.11's; 2.15 alone would be 3.11


def test_python_requires_and_the_abi3_tag_are_the_oldest_python_of_the_supported_torch():
    python_requires, options = setup_kwargs()
    major, minor = oldest_python()
    assert python_requires == f">={major}.{minor}"
    assert options["bdist_wheel"]["py_limited_api"] == abi3_tag()


def test_every_wheel_name_in_the_tree_carries_the_tag():
    files = [os.path.join(SRC, f) for f in ("README.md", "setup.py", ".ci/run")]
    for pattern in ("docs/**/*.md", "scripts/*", "tests/**/*.py"):
        files += glob.glob(os.path.join(SRC, pattern), recursive=True)
    seen, bad = 0, []
    for path in sorted(set(files)):
        if not os.path.isfile(path) or path == os.path.abspath(__file__):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                for tag in re.findall(r"\bcp3\d+-abi3\b", line):
                    seen += 1
                    if tag != f"{abi3_tag()}-abi3":
                        bad.append(f"{os.path.relpath(path, SRC)}:{n}: {line.strip()}")
    assert seen >= 5  # README, install.md, build_wheels.sh, test.sh, .ci/run name it
    assert not bad, f"wheel tags other than {abi3_tag()}-abi3:\n" + "\n".join(bad)


@pytest.mark.skipif(not INSTALLED, reason="reads an installed wheel's metadata "
                    "(scripts/test_wheel.sh); this torchext is the checkout's in-place build")
def test_installed_wheel_says_the_same():
    dist = importlib.metadata.distribution("torchext")
    assert os.path.samefile(dist.locate_file("torchext/__init__.py"), torchext.__file__)
    major, minor = oldest_python()
    assert dist.metadata["Requires-Python"] == f">={major}.{minor}"
    # (its tag: test_wheel.py, whose literal the scan above holds to abi3_tag())
