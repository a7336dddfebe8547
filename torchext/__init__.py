"""torchext: a fused, compile-ready ASGD optimizer and AMP GradScaler,
written once as C++/CUDA torch custom ops (``torch.ops.torchext.*``).

Importing the package loads the compiled library, which registers the ops.
"""
import glob as _glob
import os as _os
import warnings as _warnings

import torch as _torch

from ._version import __version__  # written by setup.py from version.txt

_HERE = _os.path.dirname(_os.path.abspath(__file__))


def _find_library():
    candidates = sorted(_glob.glob(_os.path.join(_HERE, "_C*.so")) +
                        _glob.glob(_os.path.join(_HERE, "_C*.pyd")))
    return candidates[0] if candidates else None


def _in_source_tree():
    """True for a source checkout (an in-place or editable build), False for
    an installed wheel (no csrc/ or setup.py next to the package)."""
    root = _os.path.dirname(_HERE)
    return (_os.path.isdir(_os.path.join(root, "csrc")) and
            _os.path.isfile(_os.path.join(root, "setup.py")))


def _wheel_label(torch_version):
    # The local version label of the torchext wheel for a torch (setup.py's
    # local_version): 2.14.1+cu130 -> torch2.14.1.cu130.
    base, _, variant = torch_version.partition("+")
    return f"torch{base}.{variant or 'cpu'}"


def _wrong_torch_message(built_for):
    running = _torch.__version__
    base = __version__.split("+")[0]
    text = (f"torchext {__version__} was built against torch {built_for}, but torch "
            f"{running} is installed (a custom-op library is tied to the torch ABI it was "
            "compiled with). ")
    if _in_source_tree():
        return text + ("Rebuild it against this torch: `pip install --no-build-isolation -e "
                       f"{_os.path.dirname(_HERE)}`.")
    if built_for.split("+")[0] == running.split("+")[0]:
        # Same version, another build of it (CPU vs CUDA): pip's torch==X
        # requirement cannot tell them apart.
        back = (f"or install the torch build it is for: `pip install \"torch=={built_for}\"` "
                "(from the package index that carries that build)")
    else:
        back = f"or go back to `pip install torch=={built_for.split('+')[0]}`"
    return text + (f"Install the torchext wheel built for torch {running}: "
                   f"`pip install \"torchext=={base}+{_wheel_label(running)}\"` (the wheels "
                   f"carry the torch they are for in their version), {back}; for any other "
                   "torch, build torchext from source against it (`pip install "
                   "--no-build-isolation` in a torchext checkout or sdist).")


def _load():
    try:
        from . import _build_info
    except ImportError:
        _build_info = None
    path = _find_library()
    if path is None or _build_info is None:
        raise ImportError(
            "torchext's compiled library is missing from " + _HERE + ". Build it against the "
            "installed torch with `pip install --no-build-isolation -e .` in the torchext "
            "source tree.")
    if _build_info.TORCH_VERSION != _torch.__version__:
        raise ImportError(_wrong_torch_message(_build_info.TORCH_VERSION))
    try:
        _torch.ops.load_library(path)
    except OSError as e:
        raise ImportError(f"torchext could not load its library {path}: {e}") from e
    return path, _build_info


library_path, _build_info = _load()


def _warn_if_stale():
    # Only in a source tree (editable or in-place build): an installed wheel
    # has no csrc/ next to it. Costs a few stat calls.
    if not _in_source_tree():
        return
    root = _os.path.dirname(_HERE)
    from ._sources import stale_sources
    newer = stale_sources(root, library_path, _HERE)
    if newer:
        names = ", ".join(_os.path.relpath(f, root) for f in newer[:3])
        more = f" and {len(newer) - 3} more" if len(newer) > 3 else ""
        _warnings.warn(
            f"torchext's compiled library {library_path} is older than its sources "
            f"({names}{more} changed since it was built), so it runs the old code. Rebuild: "
            f"`pip install --no-build-isolation -e {root}` (or `bash scripts/setup_env.sh` "
            "there).", UserWarning, stacklevel=2)


_warn_if_stale()

# ---- C++ (LibTorch) users ---------------------------------------------------
#: Directory to add to CMAKE_PREFIX_PATH (next to torch.utils.cmake_prefix_path)
#: so that find_package(torchext) finds the config shipped in this package; its
#: torchext::torchext target links this package's own compiled library.
cmake_prefix_path = _os.path.join(_HERE, "share", "cmake")

#: What the loaded library holds: CPU kernels always, CUDA kernels and their
#: archs when it was built with them.
build_info = {
    "version": __version__,
    "torch_version": _build_info.TORCH_VERSION,
    "cpu": True,
    "cuda": bool(_build_info.WITH_CUDA),
    "cuda_version": _build_info.CUDA_VERSION,
    "cuda_archs": (_build_info.CUDA_ARCHS.replace(";", " ").split()
                   if _build_info.CUDA_ARCHS else []),
}


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
