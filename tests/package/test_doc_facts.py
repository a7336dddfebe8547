"""Facts that change, as the pages state them, against their one source:
the supported torch range (``torchext._compile_compat.SUPPORTED_TORCH``),
what CI runs on which torch (``.ci/run``), and whether the CUDA kernels have
run on a GPU (the Status section of docs/status.md, which records each GPU
run). A page that states one of them otherwise fails here."""
import glob
import os
import re

from helpers import SRC

from torchext._compile_compat import SUPPORTED_TORCH

PAGES = ["README.md", *sorted(os.path.relpath(p, SRC) for p in glob.glob(f"{SRC}/docs/*.md"))]
SCRIPT_COMMENTS = [".ci/run", *sorted(os.path.relpath(p, SRC)
                                      for p in glob.glob(f"{SRC}/scripts/*.sh"))]
RANGE = re.compile(r"\b2\.(\d+)(?:\.\d+)?\s*(?:to|–)\s*2\.(\d+)(?:\.\d+)?\b")
VERSION = re.compile(r"\b2\.(\d+)\.\d+\b")


def read(path: str) -> str:
    with open(os.path.join(SRC, path)) as f:
        return f.read()


def lines_of(paths, comments_only=False):
    for path in paths:
        for n, line in enumerate(read(path).splitlines(), 1):
            if comments_only and not line.lstrip().startswith("#"):
                continue
            yield f"{path}:{n}", line


def ci():
    """(newest, oldest, between, the between loop's body) from .ci/run."""
    run = read(".ci/run")
    newest = re.search(r"^NEWEST=(\S+)$", run, re.M).group(1)
    oldest = re.search(r"^OLDEST=(\S+)$", run, re.M).group(1)
    between = re.search(r"^BETWEEN=\(([^)]*)\)$", run, re.M).group(1).split()
    loop = re.search(r'^for tv in "\$\{BETWEEN\[@\]\}"; do\n(.*?)^done$', run, re.M | re.S).group(1)
    return newest, oldest, between, loop


def minor(version: str) -> int:
    return int(re.match(r"2\.(\d+)", version).group(1))


def test_every_stated_torch_range_is_the_supported_one():
    (_, lo), (_, hi) = SUPPORTED_TORCH
    found = 0
    for where, line in [*lines_of(PAGES), *lines_of(SCRIPT_COMMENTS, comments_only=True)]:
        for m in RANGE.finditer(line):
            found += 1
            assert (int(m.group(1)), int(m.group(2))) == (lo, hi), (
                f"{where} states the torch range {m.group(0)!r}, but SUPPORTED_TORCH is "
                f"2.{lo} to 2.{hi}: {line.strip()}")
    assert found >= 3  # README, install.md and status.md state it


def test_ci_covers_every_supported_minor_version_with_the_version_sensitive_tests():
    newest, oldest, between, loop = ci()
    (_, lo), (_, hi) = SUPPORTED_TORCH
    assert sorted(minor(v) for v in [newest, oldest, *between]) == list(range(lo, hi + 1))
    assert minor(newest) == hi and minor(oldest) == lo
    # The newest and the oldest run the whole suite; the others tests/compile.
    assert "pytest" in loop and "tests/compile" in loop, loop


def test_status_page_lists_what_ci_runs_on_each_torch():
    newest, oldest, between, loop = ci()
    status = read("docs/status.md")
    table = re.search(r"^\| torch \| what runs \|\n\|---\|---\|\n((?:\|.*\n)+)", status, re.M)
    rows = {}
    for row in table.group(1).splitlines():
        first, what = row.split("|")[1:3]
        for v in re.findall(r"2\.\d+\.\d+(?:\+\w+)?", first):
            rows[v] = what
    assert set(rows) == {newest, oldest, *between}
    for v in between:
        assert "torchext check" in rows[v]
        assert ("tests/compile" in rows[v]) == ("tests/compile" in loop), rows[v]


def test_pages_name_only_the_torch_versions_ci_builds_when_they_speak_of_ci():
    newest, oldest, between, _ = ci()
    built = {minor(v): v.split("+")[0] for v in [newest, oldest, *between]}
    for where, line in lines_of(PAGES):
        if not re.search(r"\bCI\b", line):
            continue
        for m in VERSION.finditer(line):
            assert built.get(int(m.group(1))) == m.group(0), (
                f"{where} names torch {m.group(0)} next to CI, which builds "
                f"{sorted(built.values())}: {line.strip()}")


def test_pages_say_the_ctest_suites_run_with_the_newest_torch_only():
    # .ci/run runs ctest through scripts/test.sh, for the newest torch alone.
    newest, _, _, _ = ci()
    run = read(".ci/run")
    assert "ctest" not in run.replace("ctest runs here only", "")
    assert re.findall(r"TORCH_VERSION=\$(\w+) bash scripts/test\.sh", run) == ["NEWEST"]
    for where, line in lines_of(PAGES):
        if re.search(r"ctest|cuda_on_host", line) and re.search(r"\bCI\b", line):
            assert not re.search(r"\b(both|every|each|all) torch", line), f"{where}: {line}"
            for m in VERSION.finditer(line):
                assert m.group(0) == newest.split("+")[0], f"{where}: {line}"


def test_pages_do_not_say_the_cuda_kernels_never_ran_on_a_gpu_once_they_did():
    status = read("docs/status.md")
    section = status.split("\n## Status\n", 1)[1].split("\n## ", 1)[0]
    if not re.search(r"gpu_check\.sh` ran\s+on", section):
        return  # no GPU run recorded: such a sentence would be true
    never = re.compile(r"(not yet|never|has not|have not)\s+(been\s+)?run on a GPU", re.I)
    for where, line in lines_of(PAGES):
        if "CUDA kernels" in line:
            assert not never.search(line), (
                f"{where} says the CUDA kernels have not run on a GPU, but docs/status.md "
                f"records a GPU run: {line.strip()}")
