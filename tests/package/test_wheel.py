"""What an installed wheel holds and how its library links: run against the
wheel that scripts/test_wheel.sh installed (skipped for an in-place build,
whose files are the checkout's own)."""
import glob
import importlib.metadata
import os
import re
import shutil
import subprocess

import pytest
import torch

import torchext
from helpers import INSTALLED, NO_COMPILER, SRC

pytestmark = pytest.mark.skipif(
    not INSTALLED, reason="tests an installed wheel (scripts/test_wheel.sh); this torchext is "
    "the checkout's in-place build")

PKG = os.path.dirname(os.path.abspath(torchext.__file__))


def _dist():
    dist = importlib.metadata.distribution("torchext")
    assert os.path.samefile(dist.locate_file("torchext/__init__.py"), torchext.__file__)
    return dist


def test_version_names_the_torch_and_requires_it():
    dist = _dist()
    base, _, label = torch.__version__.partition("+")
    assert dist.version == torchext.__version__
    assert dist.version.startswith(open(os.path.join(SRC, "version.txt")).read().strip() + "+")
    assert f"+torch{base}.{label or 'cpu'}" in dist.version
    assert f"torch=={base}" in dist.requires
    # one wheel for every Python version torch supports: the stable ABI tag
    wheel = dist.read_text("WHEEL")
    # ... and the platform tag of torch's own wheels, which a package index takes
    assert re.search(r"^Tag: cp310-abi3-manylinux_2_28_x86_64$", wheel, re.M), wheel


def test_library_needs_no_glibc_newer_than_manylinux_2_28():
    # csrc/library/glibc_compat.cpp: the two symbols this machine's glibc would give
    # a newer version (pow, hypot, __libc_single_threaded) are kept at 2.28 or older.
    out = subprocess.run([_tool("objdump"), "-T", torchext.library_path], capture_output=True,
                         text=True, check=True).stdout
    versions = {tuple(map(int, v.split("."))): line.split()[-1]
                for line in out.splitlines() for v in re.findall(r"GLIBC_(\d+\.\d+)", line)}
    newer = {v: sym for v, sym in versions.items() if v > (2, 28)}
    assert not newer, newer


def test_installed_files_are_what_a_user_needs():
    installed = {str(f) for f in _dist().files if f.parts[0] == "torchext"}
    rel = lambda p: os.path.relpath(p, os.path.dirname(PKG))  # noqa: E731
    # the library, and what import torchext reads next to it
    assert rel(torchext.library_path) in installed
    for f in ("_build_info.py", "_version.py", "__main__.py"):
        assert f"torchext/{f}" in installed
    assert "torchext/_build_stamp" not in installed  # an in-place build's rebuild stamp
    # every C++ header of the checkout, byte for byte, and the generated version.h
    headers = os.path.join(SRC, "csrc", "include")
    for h in glob.glob(os.path.join(headers, "torchext", "**", "*.h"), recursive=True):
        name = "torchext/include/" + os.path.relpath(h, headers)
        assert name in installed, name
        with open(h, "rb") as a, open(os.path.join(os.path.dirname(PKG), name), "rb") as b:
            assert a.read() == b.read(), name
    version_h = os.path.join(PKG, "include", "torchext", "version.h")
    assert f'#define TORCHEXT_VERSION "{torchext.__version__.split("+")[0]}"' in open(version_h).read()
    # the CMake package config (the downstream build uses it: test_wheel.sh's C++ step)
    for f in ("torchextConfig.cmake", "torchextConfigVersion.cmake", "torchextTorchHints.cmake"):
        assert f"torchext/share/cmake/torchext/{f}" in installed
    # nothing in the package directory that the wheel did not bring
    on_disk = {rel(os.path.join(d, f)) for d, _, fs in os.walk(PKG) for f in fs
               if "__pycache__" not in d}
    assert on_disk <= installed, sorted(on_disk - installed)


def _tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} (binutils) not installed")
    return path


# What the library may load: torch's own libraries (found through its rpath
# $ORIGIN/../torch/lib, and the CUDA wheel's nvidia/cu*/lib), and the C/C++
# runtime that manylinux allows.
_ALLOWED = re.compile(r"lib(c10|c10_cuda|torch|torch_cpu|torch_cuda|gomp|cudart)\.so(\.\d+)*|"
                      r"lib(stdc\+\+|m|gcc_s|c|dl|pthread|rt)\.so\.\d+|ld-linux-x86-64\.so\.2")


def test_library_links_torch_by_rpath_and_no_python():
    out = subprocess.run([_tool("readelf"), "-d", torchext.library_path], capture_output=True,
                         text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", out)
    assert needed and all(_ALLOWED.fullmatch(n) for n in needed), needed
    rpath = re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[(.+)\]", out)
    assert rpath and all(p.startswith("$ORIGIN/") for p in rpath[0].split(":")), rpath
    assert "$ORIGIN/../torch/lib" in rpath[0].split(":")
    # abi3 is honest: the library calls nothing of Python's C API (it is
    # loaded with torch.ops.load_library), so any CPython can load it.
    undefined = subprocess.run([_tool("nm"), "-D", "--undefined-only", torchext.library_path],
                               capture_output=True, text=True, check=True).stdout.split()
    assert not [s for s in undefined if re.match(r"_?Py", s)]
    # no debug info from the build machine
    sections = subprocess.run([_tool("readelf"), "-S", "-W", torchext.library_path],
                              capture_output=True, text=True, check=True).stdout
    assert ".debug_info" not in sections


@pytest.mark.skipif(not NO_COMPILER, reason="checks the no-compiler run of scripts/test_wheel.sh")
def test_no_compiler_is_reachable(tmp_path):
    """The suite runs with no compiler reachable, so nothing it does can
    have built torchext (or anything else) on the side."""
    for cc in ("cc", "c++", "gcc", "g++", "nvcc", "ninja", "cmake"):
        path = shutil.which(cc)
        if path:
            r = subprocess.run([path, "--version"], capture_output=True, text=True)
            assert r.returncode != 0 and "no compiler here" in r.stderr, (cc, path)
    assert os.environ.get("CC") == "false" and os.environ.get("CXX") == "false"
    from torch.utils.cpp_extension import load_inline
    with pytest.raises(Exception):
        load_inline("probe", cpp_sources="int f() { return 1; }", functions=["f"],
                    build_directory=str(tmp_path), verbose=False)
