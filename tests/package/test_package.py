"""The package: version, build info, and clear import errors."""
import os
import shutil
import subprocess
import sys

import torch

import torchext
from helpers import SRC

PKG = os.path.dirname(torchext.__file__)


def test_version_and_build_info():
    # version.txt's version, with the torch the library was built for as a
    # PEP 440 local label (the wheel's version: 0.1.0+torch2.13.0.cpu).
    base, _, label = torch.__version__.partition("+")
    assert torchext.__version__ == f"0.1.0+torch{base}.{label or 'cpu'}" + (
        ".nocuda" if torch.version.cuda and not torchext.has_cuda_kernels() else "")
    info = torchext.build_info
    assert info["cpu"] is True and info["torch_version"] == torch.__version__
    assert isinstance(info["cuda"], bool) and torchext.has_cuda_kernels() == info["cuda"]
    if info["cuda"]:
        assert info["cuda_version"] and info["cuda_archs"]
    assert os.path.exists(torchext.library_path)


def _import_copy(tmp_path, mutate):
    dst = tmp_path / "torchext"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("__pycache__"))
    mutate(dst)
    return subprocess.run([sys.executable, "-c", "import torchext"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})


def _built_for_another_torch(dst):
    info = (dst / "_build_info.py").read_text()
    (dst / "_build_info.py").write_text(info.replace(repr(torch.__version__), repr("2.99.0+cpu")))


def test_import_refuses_library_built_for_another_torch(tmp_path):
    # As an installed wheel (no sources next to the package): names the wheel
    # for the running torch, and the torch this one is for.
    r = _import_copy(tmp_path, _built_for_another_torch)
    assert r.returncode != 0
    assert (f"torchext {torchext.__version__} was built against torch 2.99.0+cpu, but torch "
            f"{torch.__version__} is installed") in r.stderr
    base, _, label = torch.__version__.partition("+")
    assert f'pip install "torchext==0.1.0+torch{base}.{label or "cpu"}"' in r.stderr
    assert "pip install torch==2.99.0" in r.stderr


def test_import_refuses_another_build_of_the_same_torch_version(tmp_path):
    # torch==2.13.0 can bring 2.13.0+cu130 where the wheel is for 2.13.0+cpu
    other = torch.__version__.split("+")[0] + "+othervariant"

    def mutate(dst):
        info = (dst / "_build_info.py").read_text()
        (dst / "_build_info.py").write_text(info.replace(repr(torch.__version__), repr(other)))
    r = _import_copy(tmp_path, mutate)
    assert r.returncode != 0
    assert f'pip install "torch=={other}"' in r.stderr


def test_import_refuses_library_built_for_another_torch_in_a_source_tree(tmp_path):
    def mutate(dst):
        _built_for_another_torch(dst)
        (tmp_path / "csrc").mkdir()
        (tmp_path / "setup.py").write_text("# setup\n")
    r = _import_copy(tmp_path, mutate)
    assert r.returncode != 0
    assert "built against torch 2.99.0+cpu" in r.stderr
    assert f"pip install --no-build-isolation -e {tmp_path}" in r.stderr


def test_import_explains_missing_library(tmp_path):
    def mutate(dst):
        for f in os.listdir(dst):
            if f.startswith("_C"):
                os.remove(dst / f)
    r = _import_copy(tmp_path, mutate)
    assert r.returncode != 0
    assert "compiled library is missing" in r.stderr


# ---- rebuild detection (torchext/_sources.py) --------------------------------

def _source_tree(root):
    """A minimal source tree: setup.py, csrc/, and a 'library' built after them."""
    (root / "csrc" / "cpu").mkdir(parents=True)
    (root / "csrc" / "ops.cpp").write_text("// ops\n")
    (root / "csrc" / "cpu" / "k.cpp").write_text("// kernel\n")
    (root / "setup.py").write_text("# setup\n")
    lib = root / "lib.so"
    lib.write_text("")
    for f in (root / "csrc" / "ops.cpp", root / "csrc" / "cpu" / "k.cpp", root / "setup.py"):
        os.utime(f, (1_000_000, 1_000_000))
    os.utime(lib, (2_000_000, 2_000_000))
    return lib


def test_stale_sources_by_time_and_content(tmp_path):
    from torchext._sources import digest, stale_sources, write_stamp
    lib = _source_tree(tmp_path)
    assert stale_sources(str(tmp_path), str(lib), str(tmp_path)) == []
    kernel = tmp_path / "csrc" / "cpu" / "k.cpp"
    os.utime(kernel, (3_000_000, 3_000_000))  # touched after the build, no stamp
    assert stale_sources(str(tmp_path), str(lib), str(tmp_path)) == [str(kernel)]
    write_stamp(str(tmp_path), str(tmp_path))  # the build's stamp: same contents
    assert stale_sources(str(tmp_path), str(lib), str(tmp_path)) == []
    before = digest(str(tmp_path))
    kernel.write_text("// kernel, edited\n")
    assert digest(str(tmp_path)) != before
    assert stale_sources(str(tmp_path), str(lib), str(tmp_path)) == [str(kernel)]
    # setup_env.sh also hashes CMakeLists.txt
    assert digest(str(tmp_path), ["CMakeLists.txt"]) != digest(str(tmp_path))


def test_import_warns_when_sources_are_newer_than_the_library(tmp_path):
    def in_source_tree(dst):
        (tmp_path / "csrc").mkdir()
        (tmp_path / "csrc" / "ops.cpp").write_text("// ops\n")
        (tmp_path / "setup.py").write_text("# setup\n")
        for f in (tmp_path / "csrc" / "ops.cpp", tmp_path / "setup.py"):
            os.utime(f, (1_000_000, 1_000_000))  # older than the copied library

    r = _import_copy(tmp_path, in_source_tree)
    assert r.returncode == 0, r.stderr
    assert "older than its sources" not in r.stderr  # up to date: no warning
    os.utime(tmp_path / "csrc" / "ops.cpp")  # edited now, after the build
    r = _import_copy_again(tmp_path)
    assert r.returncode == 0, r.stderr
    assert "UserWarning" in r.stderr and "older than its sources (csrc/ops.cpp" in r.stderr
    assert "pip install --no-build-isolation -e" in r.stderr


def _import_copy_again(tmp_path):
    return subprocess.run([sys.executable, "-c", "import torchext"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})


def test_setup_env_rebuilds_on_source_changes(tmp_path):
    """scripts/setup_env.sh rebuilds (incrementally: build/ kept) when a source
    changed since the last successful build, not otherwise, and starts from a
    clean build/ for another torch. Run in a copy of the tree, with a venv
    whose `pip` only records its calls."""
    # The checkout's scripts and sources, and the package under test (in
    # place or installed: it has the library the fake pip "builds").
    for src, d in ((SRC, "scripts"), (SRC, "csrc"), (PKG, None)):
        shutil.copytree(os.path.join(src, d) if d else src, tmp_path / (d or "torchext"),
                        ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("setup.py", "CMakeLists.txt"):
        shutil.copy(os.path.join(SRC, f), tmp_path / f)
    venv = tmp_path / ".venv-fake" / "bin"
    venv.mkdir(parents=True)
    log, built = tmp_path / "pip.log", tmp_path / "built"
    built.mkdir()
    for f in (torchext.library_path, os.path.join(PKG, "_build_info.py")):
        shutil.copy(f, built)
    (venv / "python").write_text(  # `pip install -e .` "builds" by copying the library back
        "#!/bin/sh\n"
        f'if [ "$1 $2" = "-m pip" ]; then echo "$*" >> {log}; cp {built}/* torchext/; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n')
    (venv / "python").chmod(0o755)
    tv = torch.__version__.split("+")[0]

    def setup_env():
        r = subprocess.run(["bash", "-c", "source scripts/setup_env.sh"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "VENV": ".venv-fake", "TORCH_VERSION": tv})
        assert r.returncode == 0, r.stdout + r.stderr
        calls = log.read_text().count("install") if log.exists() else 0
        log.unlink(missing_ok=True)
        return r.stdout, calls

    out, calls = setup_env()  # no stamp yet: builds
    assert calls == 1 and "(incremental)" in out
    (tmp_path / "build" / "obj.o").write_text("")  # stands for ninja's objects
    assert setup_env()[1] == 0  # nothing changed: no build
    with open(tmp_path / "csrc" / "ops.cpp", "a") as f:
        f.write("// edited\n")
    out, calls = setup_env()
    assert calls == 1 and "incremental" in out and (tmp_path / "build" / "obj.o").exists()
    stamp = tmp_path / "build" / "setup_env.stamp"
    stamp.write_text(stamp.read_text().replace("torch=", "torch=0.0.0", 1))  # another torch
    out, calls = setup_env()
    assert calls == 1 and "new torch: clean build" in out and not (tmp_path / "build" / "obj.o").exists()


def test_scaler_state_dict_version_has_one_home():
    # csrc/include/torchext/amp/state_dict_version.h holds the number; Python
    # reads it from the loaded library, the C++ GradScaler compiles it in.
    import re

    from torchext.amp import GradScaler
    from torchext.amp._checkpoint import STATE_DICT_VERSION
    header = os.path.join(SRC, "csrc", "include", "torchext", "amp", "state_dict_version.h")
    if not os.path.exists(header):  # an installed wheel ships it under include/
        header = os.path.join(PKG, "include", "torchext", "amp", "state_dict_version.h")
    with open(header) as f:
        m = re.search(r"kStateDictVersion = (\d+);", f.read())
    assert m and int(m.group(1)) == STATE_DICT_VERSION
    assert GradScaler().state_dict()["_torchext_version"] == STATE_DICT_VERSION
    for where in (os.path.join(SRC, "torchext"), os.path.join(SRC, "csrc", "api")):
        for root, _, files in os.walk(where):
            for name in files:
                if name.endswith((".py", ".cpp")):
                    with open(os.path.join(root, name)) as f:
                        text = f.read()
                    assert not re.search(r"(STATE_DICT_VERSION|kStateDictVersion)\s*=\s*\d",
                                         text), f"a second home of the version in {name}"


def test_one_list_of_compiler_flags():
    # cmake/cxx_flags.txt: setup.py and CMakeLists.txt both read it, and
    # neither spells a flag of it itself.
    path = os.path.join(SRC, "cmake", "cxx_flags.txt")
    if not os.path.exists(path):
        import pytest
        pytest.skip("no checkout next to the tests")
    with open(path) as f:
        flags = [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    assert "-ffp-contract=off" in flags and "-fopenmp" in flags
    for build in ("setup.py", "CMakeLists.txt"):
        with open(os.path.join(SRC, build)) as f:
            text = f.read()
        assert "cxx_flags.txt" in text, build
        code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        # (-O3 and -std=c++20 are nvcc's flags too, -fopenmp a link flag.)
        for flag in ("-ffp-contract=off", "-fvisibility=hidden"):
            assert flag not in code, f"{build} spells {flag} itself"
