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
