"""torchext's compiled library: found next to the package, checked against
the running torch, loaded (which registers the ops), once, at ``import
torchext``. The home of what is known about it: ``library_path`` (public as
``torchext.library_path``; ctypes reads the library's exported C symbols
through it: ``torchext.cpu_isa()``, the scaler's state-dict version in
``amp/_checkpoint.py``) and ``build_info`` (``torchext.build_info``).
A shared private module: every torchext package imports from it, none
imports these from the package root (tests/package/test_import_rules.py).
"""
import glob
import os
import warnings

import torch

from ._version import __version__  # written by setup.py from version.txt

HERE = os.path.dirname(os.path.abspath(__file__))


def _find_library():
    candidates = sorted(glob.glob(os.path.join(HERE, "_C*.so")) +
                        glob.glob(os.path.join(HERE, "_C*.pyd")))
    return candidates[0] if candidates else None


def in_source_tree():
    """True for a source checkout (an in-place or editable build), False for
    an installed wheel (no csrc/ or setup.py next to the package)."""
    root = os.path.dirname(HERE)
    return (os.path.isdir(os.path.join(root, "csrc")) and
            os.path.isfile(os.path.join(root, "setup.py")))


def _wheel_label(torch_version):
    # The local version label of the torchext wheel for a torch (setup.py's
    # local_version): 2.14.1+cu130 -> torch2.14.1.cu130.
    base, _, variant = torch_version.partition("+")
    return f"torch{base}.{variant or 'cpu'}"


def wrong_torch_message(built_for):
    running = torch.__version__
    base = __version__.split("+")[0]
    text = (f"torchext {__version__} was built against torch {built_for}, but torch "
            f"{running} is installed (a custom-op library is tied to the torch ABI it was "
            "compiled with). ")
    if in_source_tree():
        return text + ("Rebuild it against this torch: `pip install --no-build-isolation -e "
                       f"{os.path.dirname(HERE)}`.")
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
            "torchext's compiled library is missing from " + HERE + ". Build it against the "
            "installed torch with `pip install --no-build-isolation -e .` in the torchext "
            "source tree.")
    if _build_info.TORCH_VERSION != torch.__version__:
        raise ImportError(wrong_torch_message(_build_info.TORCH_VERSION))
    try:
        torch.ops.load_library(path)
    except OSError as e:
        raise ImportError(f"torchext could not load its library {path}: {e}") from e
    return path, _build_info


#: The path of the loaded library (``torchext.library_path``).
library_path, _build_info = _load()

#: What the loaded library holds: CPU kernels always, CUDA kernels and their
#: archs when it was built with them (``torchext.build_info``).
build_info = {
    "version": __version__,
    "torch_version": _build_info.TORCH_VERSION,
    "cpu": True,
    "cuda": bool(_build_info.WITH_CUDA),
    "cuda_version": _build_info.CUDA_VERSION,
    "cuda_archs": (_build_info.CUDA_ARCHS.replace(";", " ").split()
                   if _build_info.CUDA_ARCHS else []),
}


def warn_if_stale():
    """Warns when the library is older than its sources. Only in a source
    tree (editable or in-place build): an installed wheel has no csrc/ next
    to it. Costs a few stat calls. Called by ``torchext/__init__.py``, so
    that the warning points at the package's import (stacklevel=2)."""
    if not in_source_tree():
        return
    root = os.path.dirname(HERE)
    from ._sources import stale_sources
    newer = stale_sources(root, library_path, HERE)
    if newer:
        names = ", ".join(os.path.relpath(f, root) for f in newer[:3])
        more = f" and {len(newer) - 3} more" if len(newer) > 3 else ""
        warnings.warn(
            f"torchext's compiled library {library_path} is older than its sources "
            f"({names}{more} changed since it was built), so it runs the old code. Rebuild: "
            f"`pip install --no-build-isolation -e {root}` (or `bash scripts/setup_env.sh` "
            "there).", UserWarning, stacklevel=2)
