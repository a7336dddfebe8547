"""Builds torchext's compiled library with torch.utils.cpp_extension + ninja.

CPU kernels are always built. CUDA kernels are built when the installed torch
is a CUDA build and nvcc is found; TORCHEXT_CUDA=1 forces them on (and fails
loudly when that is impossible), TORCHEXT_CUDA=0 forces them off.
TORCH_CUDA_ARCH_LIST picks the GPU archs (default: 8.0;9.0+PTX).
TORCHEXT_CPP_API=0 builds the ops without the C++ API classes.

Install with:  pip install --no-build-isolation -e .
(--no-build-isolation: the library must be built against the torch you run.)

Every wheel is built for one torch: its version carries a PEP 440 local
label naming that torch (0.1.0+torch2.13.0.cpu, 0.1.0+torch2.14.1.cu130), it
requires exactly that torch version, and it is tagged cp310-abi3 (the library
uses no Python C API: it is loaded with torch.ops.load_library), so one wheel
serves every Python version that torch supports: 3.10 and newer, the oldest
Python any supported torch has (tests/package/test_python_support.py).
scripts/build_wheels.sh builds them; an sdist keeps the plain version.
"""
import glob
import importlib.util
import os
import platform
import shutil
import sys

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
# An sdist is not built for any torch: plain version, any supported torch.
BUILDING_SDIST = "sdist" in sys.argv[1:]


def configure(template, out, values):
    """CMake's configure_file(@ONLY) on cmake/<template>: the same templates
    CMakeLists.txt fills, so the version and package config are written once."""
    with open(os.path.join(ROOT, "cmake", template)) as f:
        text = f.read()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    _write_if_changed(out, text)


def _write_if_changed(path, text):
    # Unchanged files keep their mtime: ninja would otherwise recompile every
    # source including version.h on each build (a wheel right after an
    # in-place build would cost a recompile, not a relink).
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def write_version_files(with_cuda, full_version):
    # version.h for the C++ sources, torchext/_version.py for Python, and the
    # CMake package config shipped in the Python package (torchext/share/cmake).
    # C++ and CMake see version.txt's plain version; Python's __version__ is
    # the package's, with the torch label (the one pip shows).
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
    _write_if_changed(os.path.join(ROOT, "torchext", "_version.py"),
                      "# Written by setup.py from version.txt and the torch it builds for; "
                      f"do not edit.\n__version__ = {full_version!r}\n")


def local_version(with_cuda):
    """The PEP 440 local label naming the torch this build is for:
    torch 2.13.0+cpu -> torch2.13.0.cpu, 2.14.1+cu130 -> torch2.14.1.cu130
    (a CUDA torch built without our CUDA kernels adds .nocuda)."""
    base, _, variant = torch.__version__.partition("+")
    if not variant:
        variant = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
    label = f"torch{base}.{variant}"
    if torch.version.cuda and not with_cuda:
        label += ".nocuda"
    return label


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
    return sorted(f for p in patterns for f in glob.glob(os.path.join("csrc", p), recursive=True))


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

    def build_extensions(self):
        # An editable install (pip install -e, PEP 660) builds out of place
        # too, then uses the library from the source tree: it keeps the
        # in-place library's absolute rpaths (C++ programs linking it find
        # torch's CUDA libraries through them).
        if not self.inplace and not getattr(self, "editable_mode", False):
            # A wheel's library finds torch next to it ($ORIGIN/..); the build
            # machine's absolute paths are for the in-place library only. The
            # debug info (-g from Python's own CFLAGS: ~28 of the CPU library's
            # 30 MB) stays in the in-place build too.
            for ext in self.extensions:
                ext.extra_link_args = [a for a in ext.extra_link_args
                                       if not (a.startswith("-Wl,-rpath,") and "$ORIGIN" not in a)]
                ext.extra_link_args.append("-Wl,--strip-debug")
        super().build_extensions()

    def build_extension(self, ext):
        # The per-ISA sources (cmake/isa_flags.txt) are compiled on their own,
        # each with its ISA's flags on top of the extension's (torch's
        # defines, ABI and Py_LIMITED_API flags included: build_extensions
        # added them by now), and linked in as objects: setuptools has no
        # per-file flags. Ninja keeps this incremental like the rest.
        for src, flags in ISA_FLAGS.items():
            if src not in ext.sources:
                continue
            ext.sources.remove(src)
            args = dict(ext.extra_compile_args)
            args["cxx"] = list(args["cxx"]) + flags
            name = os.path.splitext(os.path.basename(src))[0]
            ext.extra_objects += self.compiler.compile(
                [src], output_dir=os.path.join(self.build_temp, name),
                macros=ext.define_macros, include_dirs=ext.include_dirs,
                debug=self.debug, extra_postargs=args, depends=ext.depends)
            ext.depends.append(src)  # a change relinks
        super().build_extension(ext)

    def run(self):
        super().run()
        if self.inplace:
            _sources_module().write_stamp(ROOT, os.path.join(ROOT, "torchext"))


class build_py(_build_py):
    """Also ships the C++ headers, as torchext/include/torchext/**/*.h (the
    generated version.h included), so that find_package(torchext) against an
    installed wheel (torchext.cmake_prefix_path,
    share/cmake/torchext/torchextConfig.cmake) finds them. An in-place build
    uses csrc/include and build/generated directly."""

    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "torchext", "include", "torchext")
        shutil.rmtree(dst, ignore_errors=True)  # no header left from an earlier build
        for top in (os.path.join(ROOT, "csrc", "include"), GENERATED_INCLUDE):
            src = os.path.join(top, "torchext")
            for path in glob.glob(os.path.join(src, "**", "*.h"), recursive=True):
                target = os.path.join(dst, os.path.relpath(path, src))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(path, target)


with_cuda = want_cuda()


def read_cxx_flags():
    """cmake/cxx_flags.txt, the one list of compiler flags (CMakeLists.txt
    reads it too): one flag per line, '#' comment lines."""
    with open(os.path.join(ROOT, "cmake", "cxx_flags.txt")) as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]


cxx_flags = read_cxx_flags()


def read_isa_flags():
    """cmake/isa_flags.txt (CMakeLists.txt reads it too): per-ISA source under
    csrc/ops/cpu/ -> its extra flags. x86-64 only: elsewhere those files
    compile to their empty fallback."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    out = {}
    with open(os.path.join(ROOT, "cmake", "isa_flags.txt")) as f:
        for line in f:
            if line.strip() and not line.lstrip().startswith("#"):
                name, *flags = line.split()
                out[os.path.join("csrc", "ops", "cpu", name)] = flags
    return out


ISA_FLAGS = read_isa_flags()
# The library is also linked by C++ programs (torchext.cmake_prefix_path),
# where no `import torch` has loaded torch's libraries first: let it find
# them itself, next to it in site-packages or where it was built.
# The CUDA wheel keeps the CUDA runtime in site-packages/nvidia/cu*/lib. An
# RPATH (not RUNPATH) also serves the dependencies' own lookups, as torch's.
_site = os.path.dirname(os.path.dirname(torch.__file__))
_lib_dirs = ["torch/lib"] + sorted(os.path.relpath(d, _site) for d in
                                   glob.glob(os.path.join(_site, "nvidia", "cu[0-9]*", "lib")))
link_flags = ["-fopenmp", "-Wl,--disable-new-dtags"]
# pow and hypot through csrc/library/glibc_compat.cpp: no glibc symbol newer than 2.28
# (manylinux_2_28, as torch's wheels).
if sys.platform.startswith("linux") and platform.machine() == "x86_64" and \
        platform.libc_ver()[0] == "glibc":
    link_flags += ["-Wl,--wrap=pow", "-Wl,--wrap=hypot"]
for _d in _lib_dirs:
    link_flags += [f"-Wl,-rpath,$ORIGIN/../{_d}", f"-Wl,-rpath,{os.path.join(_site, _d)}"]


def links_libstdcxx_statically(cxx):
    """Whether `cxx` puts libstdc++ itself into a shared library (a GCC built
    without a shared libstdc++ in its own lib dir, or one whose specs say
    -static-libstdc++; seen with a GCC 13 in /opt/gcc on a GPU machine).
    Such a library holds a second copy of the locale machinery next to the
    one torch's process loaded, and formatting a number in an error message
    (TORCH_CHECK's c10::str) then picks the wrong locale facet and crashes
    the process. Probe: link a one-line shared library and see whether it
    defines an ostream number inserter itself."""
    import subprocess
    import tempfile
    if sys.platform != "linux":
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.so")
        with open(src, "w") as f:
            f.write("#include <sstream>\nstd::string f(unsigned long n) "
                    "{ std::ostringstream s; s << n; return s.str(); }\n")
        try:
            subprocess.run([cxx, "-shared", "-fPIC", src, "-o", lib], check=True,
                           capture_output=True, timeout=120)
            out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                                 capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return False  # no probe possible: keep the compiler's default
    return "_ZNSo9_M_insertImEERSoT_" in out


def loaded_libstdcxx():
    """The libstdc++.so.6 this Python process (with torch) has loaded: the
    one the library will share at run time."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libstdc++.so"):
                return path
    return None


if os.environ.get("TORCHEXT_SKIP_LIBSTDCXX_PROBE") != "1":
    _cxx = os.environ.get("CXX", "c++")
    if links_libstdcxx_statically(_cxx):
        _shared = loaded_libstdcxx()
        if _shared is None:
            raise SystemExit(f"setup.py: {_cxx} links libstdc++ statically into shared libraries "
                             "and no shared libstdc++ is loaded to link instead; a library built "
                             "so would crash on its first error message. Use a compiler with a "
                             "shared libstdc++ (CXX=...).")
        # Named before the compiler's own -lstdc++: every standard-library
        # symbol resolves to the shared library torch uses.
        print(f"setup.py: {_cxx} links libstdc++ statically; linking {_shared} instead")
        link_flags.append(_shared)
include_dirs = [os.path.join(ROOT, "csrc", "include"), GENERATED_INCLUDE]
# Every .cpp under csrc/ (docs/architecture.md, "Where a new op, validator or
# kernel goes"), the C++ API (csrc/api/) apart; the .cu files are under ops/cuda/.
cpp_sources = [f for f in sources("**/*.cpp")
               if not f.startswith(os.path.join("csrc", "api", ""))]
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
        cpp_sources + sources("**/*.cu"),
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
if BUILDING_SDIST:
    # Sources only: the files generated for a build (MANIFEST.in excludes
    # them) are written again by the build that unpacks it.
    full_version, torch_requirement = VERSION, "torch>=2.11"
else:
    # The library is tied to this torch's ABI: say which in the version, and
    # let pip install (or keep) exactly that torch next to it.
    full_version = f"{VERSION}+{local_version(with_cuda)}"
    torch_requirement = f"torch=={torch.__version__.split('+')[0]}"
    write_build_info(with_cuda, archs)
    write_version_files(with_cuda, full_version)

setup(
    name="torchext",
    version=full_version,
    description="Fused, compile-ready ASGD optimizer and AMP GradScaler as torch custom ops",
    long_description=open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    license_files=["LICENSE"],
    packages=find_packages(include=["torchext", "torchext.*"]),
    package_data={"torchext": ["share/cmake/torchext/*.cmake", "include/torchext/**/*.h"]},
    ext_modules=[ext],
    cmdclass={"build_ext": build_ext, "build_py": build_py},
    # Both the oldest Python of the supported torch range (torch 2.11: 3.10),
    # checked by tests/package/test_python_support.py.
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
    python_requires=">=3.10",
    install_requires=[torch_requirement],
    # `pip install torchext[bench]`: the progress bar and --plot of `torchext bench`.
    # `pip install torchext[integrations]`: the training frameworks that
    # tests/integrations runs torchext in (torchext/integrations).
    extras_require={"bench": ["tqdm", "matplotlib"], "integrations": integration_requirements()},
    entry_points={"console_scripts": ["torchext = torchext.cli:main_exit"]},
)
