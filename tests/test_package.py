"""The package: version, build info, and clear import errors."""
import os
import shutil
import subprocess
import sys

import torch

import torchext

PKG = os.path.dirname(torchext.__file__)


def test_version_and_build_info():
    assert torchext.__version__ == "0.1.0"
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


def test_import_refuses_library_built_for_another_torch(tmp_path):
    def mutate(dst):
        info = (dst / "_build_info.py").read_text()
        (dst / "_build_info.py").write_text(
            info.replace(repr(torch.__version__), repr("0.0.0+other")))
    r = _import_copy(tmp_path, mutate)
    assert r.returncode != 0
    assert "built against torch 0.0.0+other" in r.stderr
    assert "pip install --no-build-isolation" in r.stderr


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
    root = os.path.dirname(PKG)
    for d in ("scripts", "csrc", "torchext"):
        shutil.copytree(os.path.join(root, d), tmp_path / d,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("setup.py", "CMakeLists.txt"):
        shutil.copy(os.path.join(root, f), tmp_path / f)
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
