"""Builds torchext's compiled library with torch.utils.cpp_extension + ninja.

CPU kernels are always built. CUDA kernels are built when the installed torch
is a CUDA build and nvcc is found; TORCHEXT_CUDA=1 forces them on (and fails
loudly when that is impossible), TORCHEXT_CUDA=0 forces them off.
TORCH_CUDA_ARCH_LIST picks the GPU archs (default: 8.0;9.0+PTX).
TORCHEXT_CPP_API=0 builds the ops without the C++ API classes.

Install with:  pip install --no-build-isolation -e .
(--no-build-isolation: the library must be built against the torch you run.)
"""
import glob
import importlib.util
import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py as _build_py

# torch.utils.cpp_extension reads CUDA_HOME when imported; its own guess on
# these machines is /usr/local, which has no CUDA headers.
if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/bin/nvcc"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from torch.utils.cpp_extension import (  # noqa: E402
    CUDA_HOME,
    BuildExtension,
    CppExtension,
    CUDAExtension,
)

ROOT = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(ROOT, "version.txt")) as _f:  # the one version source
    VERSION = _f.read().strip()
GENERATED_INCLUDE = os.path.join(ROOT, "build", "generated")


def configure(template, out, values):
    """CMake's configure_file(@ONLY) on cmake/<template>: the same templates
    CMakeLists.txt fills, so the version and package config are written once."""
    with open(os.path.join(ROOT, "cmake", template)) as f:
        text = f.read()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)


def write_version_files(with_cuda):
    # version.h for the C++ sources, torchext/_version.py for Python, and the
    # CMake package config shipped in the Python package (torchext/share/cmake).
    major, minor, patch = VERSION.split(".")[:3]
    values = {"TORCHEXT_VERSION": VERSION, "TORCHEXT_VERSION_MAJOR": major,
              "TORCHEXT_VERSION_MINOR": minor, "TORCHEXT_VERSION_PATCH": patch,
              "TORCHEXT_CONFIG_LAYOUT": "pip", "PACKAGE_INIT": "",
              "TORCHEXT_CUDA": "ON" if with_cuda else "OFF"}
    configure("version.h.in", os.path.join(GENERATED_INCLUDE, "torchext", "version.h"), values)
    share = os.path.join(ROOT, "torchext", "share", "cmake", "torchext")
    configure("torchextConfig.cmake.in", os.path.join(share, "torchextConfig.cmake"), values)
    configure("torchextConfigVersion.cmake.in",
              os.path.join(share, "torchextConfigVersion.cmake"), values)
    with open(os.path.join(ROOT, "torchext", "_version.py"), "w") as f:
        f.write(f"# Written by setup.py from version.txt; do not edit.\n__version__ = {VERSION!r}\n")


def integration_requirements():
    # One list, read by pip (scripts/test.sh) and here.
    with open(os.path.join(ROOT, "requirements-integrations.txt")) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def want_cuda():
    flag = os.environ.get("TORCHEXT_CUDA", "auto").strip().lower()
    available = torch.version.cuda is not None and CUDA_HOME is not None and (
        shutil.which("nvcc") or os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")))
    if flag in ("0", "off", "false", "no"):
        return False
    if flag in ("1", "on", "true", "yes"):
        if not available:
            raise RuntimeError(
                "TORCHEXT_CUDA=1 but CUDA kernels cannot be built: torch.version.cuda="
                f"{torch.version.cuda!r}, CUDA_HOME={CUDA_HOME!r}")
        return True
    return bool(available)


def sources(*patterns):
    return sorted(f for p in patterns for f in glob.glob(os.path.join("csrc", p)))


def write_build_info(with_cuda, archs):
    # Read by torchext/__init__.py to refuse a library built for another torch.
    path = os.path.join(ROOT, "torchext", "_build_info.py")
    with open(path, "w") as f:
        f.write("# Written by setup.py at build time; do not edit.\n")
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
        f.write(f"WITH_CUDA = {with_cuda!r}\n")
        f.write(f"CUDA_VERSION = {torch.version.cuda if with_cuda else None!r}\n")
        f.write(f"CUDA_ARCHS = {archs!r}\n")


def _sources_module():
    # torchext/_sources.py, loaded by path: importing the package would load
    # the library being built.
    spec = importlib.util.spec_from_file_location(
        "_torchext_sources", os.path.join(ROOT, "torchext", "_sources.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class build_ext(BuildExtension):
    """Keeps ninja's objects in build/temp.torchext whatever the caller asks
    (pip's editable install uses a fresh temporary directory, which would
    recompile everything), and stamps the sources' digest next to the
    library after a successful in-place build (torchext/_sources.py)."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = os.path.join(ROOT, "build", "temp.torchext")

    def run(self):
        super().run()
        if self.inplace:
            _sources_module().write_stamp(ROOT, os.path.join(ROOT, "torchext"))


class build_py(_build_py):
    """Also ships the C++ headers, as torchext/include/torchext/**/*.h, so that
    find_package(torchext) against an installed wheel (torchext.cmake_prefix_path,
    share/cmake/torchext/torchextConfig.cmake) finds them. An in-place build
    uses csrc/include directly."""

    def run(self):
        super().run()
        src = os.path.join(ROOT, "csrc", "include", "torchext")
        dst = os.path.join(self.build_lib, "torchext", "include", "torchext")
        for path in glob.glob(os.path.join(src, "**", "*.h"), recursive=True):
            target = os.path.join(dst, os.path.relpath(path, src))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(path, target)


with_cuda = want_cuda()
# -fopenmp: at::parallel_for is a header template that only runs in parallel
# when the calling file is compiled with OpenMP (torch's own libgomp serves it:
# it is already loaded, under the same soname, when torch is imported).
# -ffp-contract=off: fused multiply-adds only where the kernels ask for them
# (to round like torch's own kernels; see elementwise_math.h).
cxx_flags = ["-O3", "-std=c++20", "-fvisibility=hidden", "-fopenmp", "-ffp-contract=off"]
# The library is also linked by C++ programs (torchext.cmake_prefix_path),
# where no `import torch` has loaded torch's libraries first: let it find
# them itself, next to it in site-packages or where it was built.
# The CUDA wheel keeps the CUDA runtime in site-packages/nvidia/cu*/lib. An
# RPATH (not RUNPATH) also serves the dependencies' own lookups, as torch's.
_site = os.path.dirname(os.path.dirname(torch.__file__))
_lib_dirs = ["torch/lib"] + sorted(os.path.relpath(d, _site) for d in
                                   glob.glob(os.path.join(_site, "nvidia", "cu[0-9]*", "lib")))
link_flags = ["-fopenmp", "-Wl,--disable-new-dtags"]
for _d in _lib_dirs:
    link_flags += [f"-Wl,-rpath,$ORIGIN/../{_d}", f"-Wl,-rpath,{os.path.join(_site, _d)}"]
include_dirs = [os.path.join(ROOT, "csrc", "include"), GENERATED_INCLUDE]
cpp_sources = sources("*.cpp", "cpu/*.cpp", "meta/*.cpp")
# The LibTorch C++ API (torchext::optim::ASGD, torchext::amp::GradScaler) is
# compiled into the same library so C++ code can link the pip-installed one;
# TORCHEXT_CPP_API=0 leaves it out (ops only).
if os.environ.get("TORCHEXT_CPP_API", "1") != "0":
    cpp_sources += sources("api/*.cpp")
if with_cuda:
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    archs = os.environ["TORCH_CUDA_ARCH_LIST"]
    ext = CUDAExtension(
        "torchext._C",
        cpp_sources + sources("cuda/*.cu"),
        include_dirs=include_dirs,
        define_macros=[("TORCHEXT_WITH_CUDA", "1")],
        extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "-std=c++20"]},
        extra_link_args=link_flags,
        py_limited_api=True,
    )
else:
    archs = None
    ext = CppExtension(
        "torchext._C",
        cpp_sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags},
        extra_link_args=link_flags,
        py_limited_api=True,
    )
write_build_info(with_cuda, archs)
write_version_files(with_cuda)

setup(
    name="torchext",
    version=VERSION,
    description="Fused, compile-ready ASGD optimizer and AMP GradScaler as torch custom ops",
    packages=find_packages(include=["torchext", "torchext.*"]),
    package_data={"torchext": ["share/cmake/torchext/*.cmake", "include/torchext/**/*.h"]},
    ext_modules=[ext],
    cmdclass={"build_ext": build_ext, "build_py": build_py},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
    python_requires=">=3.9",
    install_requires=["torch>=2.13"],
    # `pip install torchext[bench]`: the progress bar and --plot of `torchext bench`.
    # `pip install torchext[integrations]`: the training frameworks that
    # tests/integrations runs torchext in (torchext/integrations).
    extras_require={"bench": ["tqdm", "matplotlib"], "integrations": integration_requirements()},
    entry_points={"console_scripts": ["torchext = torchext.cli:main_exit"]},
)
