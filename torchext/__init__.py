"""torchext: a fused, compile-ready ASGD optimizer and AMP GradScaler,
written once as C++/CUDA torch custom ops (``torch.ops.torchext.*``).

Importing the package loads the compiled library, which registers the ops
(``torchext/_library.py``).
"""
import os as _os

from ._version import __version__  # written by setup.py from version.txt
from ._library import HERE as _HERE
from ._library import build_info, library_path
from ._library import warn_if_stale as _warn_if_stale

_warn_if_stale()

# ---- C++ (LibTorch) users ---------------------------------------------------
#: Directory to add to CMAKE_PREFIX_PATH (next to torch.utils.cmake_prefix_path)
#: so that find_package(torchext) finds the config shipped in this package; its
#: torchext::torchext target links this package's own compiled library.
cmake_prefix_path = _os.path.join(_HERE, "share", "cmake")


def cpu_isa() -> str:
    """The instruction set the CPU kernels run here ("default", "avx2" or
    "avx512"), chosen like ATen's own (ATEN_CPU_CAPABILITY overrides it)."""
    import ctypes
    fn = ctypes.CDLL(library_path).torchext_cpu_isa
    fn.restype = ctypes.c_char_p
    return fn().decode().lower()


def has_cuda_kernels() -> bool:
    """True when the loaded library has CUDA kernels (not whether a GPU exists)."""
    return build_info["cuda"]


from . import amp, nn, optim  # noqa: E402,F401

__all__ = ["optim", "amp", "nn", "build_info", "cpu_isa", "has_cuda_kernels", "library_path",
           "cmake_prefix_path",
           "__version__"]
