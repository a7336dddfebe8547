"""The code fences of README.md and docs/*.md, as the tests run them.

A fence's info string is its language, then tags:

    ```python             runs on CPU; a page's fences run in order, in one
                          namespace, in a fresh process (tests/package/test_docs.py)
    ```python no-run      shown only (a fragment, or needs several processes)
    ```python cuda        runs, in order with the others, only where a CUDA
                          GPU and torchext's CUDA kernels are
    ```python compiled-step
                          runs only where torch can compile the whole step
                          (torchext._compile_compat.COMPILED_STEP: torch >= 2.12)
    ```cpp                a complete program (a main): compiled against
                          find_package(torchext) and run, exit status 0
                          (the downstream_docs ctest, cpp_tests/downstream.sh)
    ```cpp no-run         compiled, not run (it needs files made elsewhere)
    ```cpp no-compile     a fragment: neither

Fences of other languages (bash, cmake, text, ...) are never run. An unknown
tag on a python or cpp fence is an error, so a typo cannot turn a check off.

Used by tests/package/test_docs.py, and as a script:

    python tests/docs_snippets.py run PAGE [--cuda]   # what each page test runs
    python tests/docs_snippets.py cpp-project DIR     # the C++ fences as a CMake project
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAGS = {"python": {"no-run", "cuda", "compiled-step"}, "cpp": {"no-run", "no-compile"}}
_OPEN = re.compile(r"^(?P<indent> *)(?P<ticks>```+)(?P<info>[^`]*)$")


@dataclasses.dataclass
class Fence:
    page: str        # path relative to the repository root, e.g. "docs/optimizer.md"
    lang: str        # "python", "cpp", "bash", ... ("" for a bare fence)
    tags: list[str]
    line: int        # 1-based line of the fence's first code line
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[str]:
    """README.md and docs/*.md, relative to the repository root."""
    found = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return ["README.md"] + found


def fences(page: str) -> list[Fence]:
    """Every fenced block of a page (fences may be indented, e.g. in a list)."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        lines = f.read().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks = len(m["indent"]), m["ticks"]
        words = m["info"].split()
        lang, tags = (words[0], words[1:]) if words else ("", [])
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() != ticks:
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        if j == len(lines):
            raise ValueError(f"{page}:{i + 1}: fence never closed")
        out.append(Fence(page, lang, tags, i + 2, "\n".join(body) + "\n"))
        i = j + 1
    return out


def check_tags(fence: Fence) -> None:
    unknown = set(fence.tags) - TAGS.get(fence.lang, set(fence.tags))
    if unknown:
        raise ValueError(f"{fence.where}: unknown tag(s) {sorted(unknown)} on a ```{fence.lang} "
                         f"fence (known: {sorted(TAGS[fence.lang])})")


def _compiled_step_available() -> bool:
    from torchext._compile_compat import COMPILED_STEP
    return COMPILED_STEP.available()


def python_fences(page: str, cuda: bool) -> list[Fence]:
    """The python fences of a page that run here, in order."""
    out = []
    for f in fences(page):
        if f.lang != "python":
            continue
        check_tags(f)
        if "no-run" in f.tags or ("cuda" in f.tags and not cuda):
            continue
        if "compiled-step" in f.tags and not _compiled_step_available():
            continue
        out.append(f)
    return out


def page_script(page: str, cuda: bool) -> str:
    """The runnable python fences of a page as one module whose line numbers
    are the page's own (everything else is blank), so a traceback's line is
    the page's line, and inspect.getsource (TorchScript) finds real source."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        n = len(f.read().splitlines())
    lines = [""] * n
    for fence in python_fences(page, cuda):
        for k, text in enumerate(fence.code.splitlines()):
            lines[fence.line - 1 + k] = text
    return "\n".join(lines) + "\n"


def cpp_fences() -> list[Fence]:
    """Every cpp fence that compiles, over all pages."""
    out = []
    for page in pages():
        for f in fences(page):
            if f.lang == "cpp":
                check_tags(f)
                if "no-compile" not in f.tags:
                    out.append(f)
    return out


def write_cpp_project(directory: str) -> list[tuple[str, bool]]:
    """One executable per compiled cpp fence, with `#line` pointing at the
    page, in a CMake project that uses find_package(torchext). Writes
    run.txt: the executables to run, one a line. Returns (name, run)."""
    os.makedirs(directory, exist_ok=True)
    targets = []
    for f in cpp_fences():
        name = re.sub(r"\W", "_", os.path.splitext(f.page)[0]).lower() + f"_{f.line}"
        with open(os.path.join(directory, name + ".cpp"), "w", encoding="utf-8") as out:
            out.write(f'#line {f.line} "{f.page}"\n' + f.code)
        targets.append((name, "no-run" not in f.tags))
    cmake = ["# Written by tests/docs_snippets.py: the cpp fences of README.md and docs/.",
             "cmake_minimum_required(VERSION 3.18)",
             "project(torchext_doc_snippets LANGUAGES CXX)",
             "find_package(torchext REQUIRED)"]
    for name, _ in targets:
        cmake += [f"add_executable({name} {name}.cpp)",
                  f"target_link_libraries({name} PRIVATE torchext::torchext)",
                  f"set_target_properties({name} PROPERTIES CXX_STANDARD 20 "
                  "CXX_STANDARD_REQUIRED ON)"]
    with open(os.path.join(directory, "CMakeLists.txt"), "w", encoding="utf-8") as out:
        out.write("\n".join(cmake) + "\n")
    with open(os.path.join(directory, "run.txt"), "w", encoding="utf-8") as out:
        out.write("".join(f"{name}\n" for name, run in targets if run))
    return targets


def _main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "run":
        # Runs one page's fences here, as a module named __main__ whose file
        # is the page's script (written to the current directory).
        page, cuda = argv[1], "--cuda" in argv[2:]
        path = os.path.abspath(os.path.basename(page) + ".py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(page_script(page, cuda))
        import runpy
        import traceback
        if os.environ.get("TORCHEXT_TEST_INDUCTOR_CXX"):
            # The installed-wheel run hides every compiler; torch.compile's
            # inductor alone gets g++ by absolute path (as tests/conftest.py).
            import torch._inductor.config as inductor_config
            inductor_config.cpp.cxx = (None, os.environ["TORCHEXT_TEST_INDUCTOR_CXX"])
        sys.argv = [path]
        try:
            runpy.run_path(path, run_name="__main__")
        except BaseException as e:
            if isinstance(e, SystemExit) and not e.code:
                return 0
            traceback.print_exc()
            lines = [fr.lineno for fr in traceback.extract_tb(e.__traceback__)
                     if fr.filename == path]
            where = page
            if lines:
                start = max(f.line for f in python_fences(page, cuda) if f.line <= lines[0])
                where = f"{page}:{lines[0]} (the ```python fence at line {start - 1}"
                where += f"; innermost page line {lines[-1]})" if lines[-1] != lines[0] else ")"
            print(f"\nFAILED at {where}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        return 0
    if len(argv) == 2 and argv[0] == "cpp-project":
        for name, run in write_cpp_project(argv[1]):
            print(f"{name}{'' if run else ' (compile only)'}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
