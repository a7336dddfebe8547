"""torchext.cmake_prefix_path: the CMake package shipped in the Python package
(find_package(torchext) from C++ against the very library Python loads).
The C++ API itself is tested by ctest (scripts/cpp_tests.sh)."""
import glob
import os
import shutil
import subprocess
import textwrap

import pytest
import torch

import torchext
from helpers import needs_toolchain


def test_cmake_prefix_path_points_to_a_config():
    prefix = torchext.cmake_prefix_path
    assert os.path.isabs(prefix) and os.path.isdir(prefix)
    config = os.path.join(prefix, "torchext", "torchextConfig.cmake")
    assert os.path.isfile(config)
    assert os.path.isfile(os.path.join(prefix, "torchext", "torchextConfigVersion.cmake"))
    assert os.path.isfile(os.path.join(prefix, "torchext", "torchextTorchHints.cmake"))
    # What the config looks up relative to itself: the loaded library ...
    pkg = os.path.dirname(os.path.dirname(prefix))
    assert os.path.samefile(pkg, os.path.dirname(torchext.__file__))
    libs = sorted(glob.glob(os.path.join(pkg, "_C*.so")))
    assert libs and os.path.samefile(libs[0], torchext.library_path)
    # ... and the headers (in a wheel, or in the source tree of an in-place build).
    headers = [os.path.join(pkg, "include"), os.path.join(pkg, "..", "csrc", "include")]
    assert any(os.path.isfile(os.path.join(h, "torchext", "torchext.h")) for h in headers)


@needs_toolchain
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_find_package_configures(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text(textwrap.dedent("""
        cmake_minimum_required(VERSION 3.18)
        project(probe LANGUAGES CXX)
        find_package(torchext 0.1 REQUIRED)
        get_target_property(loc torchext::torchext IMPORTED_LOCATION)
        get_target_property(inc torchext::torchext INTERFACE_INCLUDE_DIRECTORIES)
        message(STATUS "TORCHEXT_LIB=${loc}")
        message(STATUS "TORCHEXT_INC=${inc}")
    """))
    env = dict(os.environ, CUDA_HOME=os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    prefix = f"{torchext.cmake_prefix_path};{torch.utils.cmake_prefix_path}"
    out = subprocess.run(
        ["cmake", "-S", str(tmp_path), "-B", str(tmp_path / "build"),
         f"-DCMAKE_PREFIX_PATH={prefix}"],
        capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lib = [ln.split("=", 1)[1] for ln in out.stdout.splitlines() if "TORCHEXT_LIB=" in ln]
    assert lib and os.path.samefile(lib[0], torchext.library_path)
