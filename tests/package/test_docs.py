"""The manual's code runs: every ```python fence of README.md and docs/*.md
not marked otherwise, page by page (tests/docs_snippets.py says how fences
are marked; the ```cpp fences are built by the downstream_docs ctest). Also:
the README stays short, and relative links and their anchors resolve."""
import concurrent.futures
import os
import re
import subprocess
import sys

import pytest
import torch

import docs_snippets as ds
import torchext

CUDA = torch.cuda.is_available() and torchext.has_cuda_kernels()
PAGES = ds.pages()
PYTHON_PAGES = [p for p in PAGES if any(f.lang == "python" for f in ds.fences(p))]
CUDA_PAGES = [p for p in PAGES
              if any(f.lang == "python" and "cuda" in f.tags for f in ds.fences(p))]


def test_every_page_is_in_the_index_and_fence_tags_are_known():
    with open(os.path.join(ds.ROOT, "docs", "index.md"), encoding="utf-8") as f:
        index = f.read()
    for page in PAGES:
        if page.startswith("docs/") and page != "docs/index.md":
            assert f"({os.path.basename(page)})" in index, f"{page} is not linked from docs/index.md"
        for fence in ds.fences(page):
            if fence.lang in ds.TAGS:
                ds.check_tags(fence)


def _run_page(page, cuda, cwd):
    # The torchext this test imported (the source tree, or an installed one).
    here = os.path.dirname(os.path.dirname(os.path.abspath(torchext.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    cmd = [sys.executable, ds.__file__, "run", page] + (["--cuda"] if cuda else [])
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def page_runs(request, tmp_path_factory):
    """Runs every selected page's snippets up front, a few processes at a
    time (TORCHEXT_DOCS_JOBS, default: the CPU count, at most 4), so the
    pages' imports and compiles overlap; each test then waits for its own."""
    wanted = []
    for item in request.session.items:
        name = getattr(item, "originalname", "")
        if name in ("test_page_snippets_run", "test_page_snippets_run_with_cuda_fences"):
            cuda = name.endswith("cuda_fences")
            page = item.callspec.params["page"]
            if (cuda and CUDA) or (not cuda and ds.python_fences(page, cuda=False)):
                wanted.append((page, cuda))
    jobs = int(os.environ.get("TORCHEXT_DOCS_JOBS", min(4, os.cpu_count() or 1)))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs))
    futures = {key: pool.submit(_run_page, *key, tmp_path_factory.mktemp("docs"))
               for key in wanted}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def _check(page_runs, page, cuda):
    proc = page_runs[(page, cuda)].result()
    if proc.returncode != 0:
        pytest.fail(f"{page}: a snippet failed\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}",
                    pytrace=False)


@pytest.mark.parametrize("page", PYTHON_PAGES)
def test_page_snippets_run(page, page_runs):
    """The page's python fences (cuda ones left out), in order, in one
    namespace, in a fresh process (its working directory a temporary one).
    The failure message names the page line that raised."""
    if not ds.python_fences(page, cuda=False):
        pytest.skip("no python fence of this page runs on CPU")
    _check(page_runs, page, False)


@pytest.mark.parametrize("page", CUDA_PAGES)
def test_page_snippets_run_with_cuda_fences(page, page_runs):
    """The same, with the page's ```python cuda fences (scripts/gpu_check.sh
    runs it: its -k selects "cuda")."""
    if not CUDA:
        pytest.skip("needs a CUDA GPU and torchext built with CUDA kernels")
    _check(page_runs, page, True)


def test_cpp_fences_are_programs():
    """What the downstream_docs ctest compiles: complete programs."""
    compiled = ds.cpp_fences()
    assert compiled, "no ```cpp fence to compile"
    for fence in compiled:
        assert re.search(r"\bint main\s*\(", fence.code), (
            f"{fence.where}: a compiled ```cpp fence needs a main (or the tag no-compile)")


def test_readme_is_short():
    with open(os.path.join(ds.ROOT, "README.md"), encoding="utf-8") as f:
        n = len(f.read().splitlines())
    assert n < 200, f"README.md has {n} lines; the manual lives in docs/"


def _slug(heading):
    # GitHub's anchors: lower case, punctuation dropped, spaces to hyphens.
    text = re.sub(r"`|\*\*", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _prose_lines(page):
    """(line number, text) of the lines outside fences, inline code removed."""
    with open(os.path.join(ds.ROOT, page), encoding="utf-8") as f:
        lines = f.read().splitlines()
    inside = set()
    for fence in ds.fences(page):
        inside.update(range(fence.line - 1, fence.line + fence.code.count("\n") + 1))
    return [(i + 1, re.sub(r"`[^`]*`", "", t) if not t.startswith("#") else t)
            for i, t in enumerate(lines) if i + 1 not in inside]


def _anchors(page):
    seen, out = {}, set()
    for _, text in _prose_lines(page):
        m = re.match(r"#{1,6} (.*)", text)
        if m:
            slug = _slug(m[1])
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_relative_links_and_anchors_resolve():
    bad = []
    for page in PAGES:
        for lineno, text in _prose_lines(page):
            for target in re.findall(r"\]\(([^)\s]+)\)", text):
                if re.match(r"[a-z]+:", target):
                    continue  # http(s), mailto
                path, _, anchor = target.partition("#")
                full = (os.path.join(ds.ROOT, page) if not path else
                        os.path.normpath(os.path.join(ds.ROOT, os.path.dirname(page), path)))
                if not os.path.exists(full):
                    bad.append(f"{page}:{lineno}: {target} (no such file)")
                elif anchor and full.endswith(".md"):
                    if anchor not in _anchors(os.path.relpath(full, ds.ROOT)):
                        bad.append(f"{page}:{lineno}: {target} (no such heading)")
    assert not bad, "broken links:\n" + "\n".join(bad)
