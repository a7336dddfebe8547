"""Which torchext module may import what ("each module in its own room"),
read from the sources with ``ast`` (nothing is imported), every module
under ``torchext/``, every import statement (in functions too).

Each import is resolved to the dotted path it names: ``from ..optim._state
import SlotGroup`` in ``torchext/amp/x.py`` names ``torchext.optim._state``
and ``torchext.optim._state.SlotGroup``; ``from .. import _devices`` names
``torchext._devices`` (a submodule: a ``.py`` file or a package folder next
to it). Three rules:

(a) **No private import across packages.** A path one of whose components
    starts with ``_`` (dunders such as ``__version__`` aside) is private to
    the package that holds that component (for a private name defined in a
    module, the module's package), and only modules inside that package, at
    any depth, may import it: ``torchext.amp.apex.handle`` may import
    ``torchext.amp._grads``, ``torchext.amp._grads`` may not import
    ``torchext.optim._state`` (nor ``torchext.optim.asgd._x``). The package
    root holds the root-level private modules (``torchext/_devices.py``,
    ``_dtensor.py``, ``_library.py``, ``_compile_compat.py``...): they are
    the shared ones, and every module may import them.

(b) **Nothing from the package root's ``__init__``.** A ``from`` import of
    the root package itself (``from torchext import x``, or a relative
    ``from .. import x`` that resolves to ``torchext``) may name only
    submodules and subpackages (``from .. import _devices``, ``from . import
    amp``), never a name that ``torchext/__init__.py`` defines or re-exports
    (``library_path``, ``build_info``, ``__version__``...): those have a home
    module to import from (``_library``, ``_version``). ``import torchext``
    binds the package, not a name, and is not checked: the CLI and the
    benchmarks read the public API through it, as a user does.

(c) **Nothing outside torchext/nn imports from torchext.nn.** ``torchext/nn``
    holds the public drop-ins for torch functions
    (``torchext.nn.utils.clip_grad_norm_``) and nothing the rest of torchext
    builds on: an import that names ``torchext.nn`` or anything below it
    (``from ..nn.utils import clip_grad``, ``from .. import nn``, ``import
    torchext.nn.utils``) is refused outside ``torchext/nn/``, except for the
    root ``__init__``'s ``from . import nn``, which makes ``torchext.nn`` an
    attribute of the package. What torchext's optimizer and scaler share
    with the drop-ins goes in a root-level private module (the clip's
    machinery: ``torchext/_clip.py``).

Each test lists every violation (file:line, the statement, the path it
names), not only the first.
"""
from __future__ import annotations

import ast
import os
from typing import NamedTuple

import pytest

import torchext

PKG_DIR = os.path.dirname(os.path.abspath(torchext.__file__))
ROOT = "torchext"


class Import(NamedTuple):
    where: str         # "torchext/amp/_grads.py:10"
    source: str        # the statement as written
    importer: str      # the importing module's package: "torchext.amp"
    names: tuple       # each dotted path the statement names
    from_root: tuple   # names a `from` import takes from the root package itself
    pkg_dir: str       # the package's folder (to tell modules from other names)


def _package_of(relpath: str) -> str:
    """The package a module file belongs to (its own for an __init__.py)."""
    parts = relpath[:-len(".py")].split(os.sep)
    return ".".join(parts[:-1])


def _is_package(dotted: str, pkg_dir: str) -> bool:
    parts = dotted.split(".")
    return parts[0] == ROOT and os.path.isfile(os.path.join(pkg_dir, *parts[1:], "__init__.py"))


def _is_module(dotted: str, pkg_dir: str) -> bool:
    """A module or package of torchext (the compiled library too: ``_C*.so``)."""
    parts = dotted.split(".")
    if parts[0] != ROOT:
        return False
    if _is_package(dotted, pkg_dir):
        return True
    base = os.path.join(pkg_dir, *parts[1:])
    folder = os.path.dirname(base)
    return os.path.isfile(base + ".py") or (os.path.isdir(folder) and any(
        f.startswith(parts[-1] + ".") and f.endswith((".so", ".pyd")) for f in os.listdir(folder)))


def _sources(pkg_dir: str):
    for dirpath, dirnames, filenames in os.walk(pkg_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                yield os.path.join(ROOT, os.path.relpath(path, pkg_dir)), path


def imports(pkg_dir: str = PKG_DIR) -> list[Import]:
    """Every import of a torchext module in the sources of the package in
    ``pkg_dir`` (default: the torchext under test)."""
    found = []
    for rel, path in _sources(pkg_dir):
        package = _package_of(rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        nodes = (n for n in ast.walk(ast.parse(text, path))
                 if isinstance(n, (ast.Import, ast.ImportFrom)))
        for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset)):
            if isinstance(node, ast.Import):
                names = tuple(a.name for a in node.names
                              if a.name == ROOT or a.name.startswith(ROOT + "."))
                from_root = ()
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    if node.level - 1 >= len(base):
                        raise AssertionError(f"{rel}:{node.lineno}: relative import beyond "
                                             "the package")
                    module = ".".join(base[:len(base) - (node.level - 1)])
                    if node.module:
                        module += "." + node.module
                elif node.module == ROOT or (node.module or "").startswith(ROOT + "."):
                    module = node.module
                else:
                    continue
                # the module, and each imported name below it (a submodule or
                # a name defined there: both are paths rule (a) looks at)
                names = (module, *(f"{module}.{a.name}" for a in node.names if a.name != "*"))
                from_root = tuple(a.name for a in node.names) if module == ROOT else ()
            if names or from_root:
                found.append(Import(f"{rel}:{node.lineno}", ast.get_source_segment(text, node),
                                    package, names, from_root, pkg_dir))
    return found


def _private_owner(dotted: str, pkg_dir: str) -> str | None:
    """The package a private path belongs to, or None for a public path."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            holder = ".".join(parts[:i])
            while not _is_package(holder, pkg_dir):  # a name in a module: the module's package
                holder = holder.rsplit(".", 1)[0]
            return holder
    return None


def _inside(package: str, owner: str) -> bool:
    return package == owner or package.startswith(owner + ".")


def _report(violations: list[str], rule: str) -> str:
    return (f"{len(violations)} import(s) break rule {rule} (see this file's docstring):\n  "
            + "\n  ".join(violations))


def private_imports_across_packages(found: list[Import]) -> list[str]:
    bad = []
    for imp in found:
        for name in imp.names:
            owner = _private_owner(name, imp.pkg_dir)
            if owner is not None and not _inside(imp.importer, owner):
                bad.append(f"{imp.where}: `{imp.source}` imports {name}, private to {owner}")
                break  # one line per statement
    return bad


def names_from_the_root(found: list[Import]) -> list[str]:
    bad = []
    for imp in found:
        for name in imp.from_root:
            if name == "*" or not _is_module(f"{ROOT}.{name}", imp.pkg_dir):
                bad.append(f"{imp.where}: `{imp.source}` imports {name!r} from "
                           "torchext/__init__.py")
    return bad


def imports_of_nn(found: list[Import]) -> list[str]:
    bad = []
    for imp in found:
        if _inside(imp.importer, f"{ROOT}.nn"):
            continue
        for name in imp.names:
            if not _inside(name, f"{ROOT}.nn"):
                continue
            if imp.importer == ROOT and name == f"{ROOT}.nn" and imp.where.startswith(
                    os.path.join(ROOT, "__init__.py") + ":"):
                continue  # `from . import nn`: the public subpackage as an attribute
            bad.append(f"{imp.where}: `{imp.source}` imports {name} from outside torchext/nn")
            break
    return bad


def test_the_scan_sees_the_imports_it_judges():
    # If the walk or the resolution broke, every rule would pass on nothing.
    found = imports()
    where = {i.where.rsplit(":", 1)[0] for i in found}
    assert os.path.join(ROOT, "amp", "grad_scaler.py") in where
    names = {n for i in found for n in i.names}
    assert {"torchext._devices", "torchext._compile_compat.param_groups",
            "torchext._library.library_path", "torchext.optim.asgd.ASGD"} <= names, names
    assert any(i.from_root and "_devices" in i.from_root for i in found)


@pytest.mark.parametrize("importer, source, rule", [
    # (a)
    ("torchext/amp/x.py", "from ..optim._state import SlotGroup", "a"),
    ("torchext/amp/x.py", "from ..optim import _state", "a"),
    ("torchext/amp/x.py", "import torchext.optim._op", "a"),
    ("torchext/amp/x.py", "from ..optim.asgd import _hooked_step", "a"),
    ("torchext/_y.py", "from .optim._state import SlotGroup", "a"),
    ("torchext/amp/x.py", "from .apex._casting import x", "a"),  # private to amp.apex
    # (b)
    ("torchext/amp/x.py", "from .. import library_path", "b"),
    ("torchext/cli/x.py", "from torchext import build_info", "b"),
    ("torchext/optim/x.py", "from .. import _devices, __version__", "b"),
    ("torchext/amp/x.py", "from torchext import *", "b"),
    # (c)
    ("torchext/amp/x.py", "from ..nn.utils import clip_grad", "c"),
    ("torchext/optim/x.py", "from .. import nn", "c"),
    ("torchext/bench/x.py", "import torchext.nn.utils", "c"),
    ("torchext/_y.py", "from .nn.utils.clip_grad import clip_grad_norm_", "c"),
])
def test_each_rule_refuses_what_it_says(tmp_path, importer, source, rule):
    found = _imports_of(tmp_path, importer, source)
    checks = {"a": private_imports_across_packages, "b": names_from_the_root,
              "c": imports_of_nn}
    assert [r for r, check in checks.items() if check(found)] == [rule]


@pytest.mark.parametrize("importer, source", [
    ("torchext/amp/apex/x.py", "from .._grads import GradsByDevice"),  # inside amp
    ("torchext/optim/x.py", "from .._devices import pick"),  # root-level: shared
    ("torchext/optim/x.py", "from .. import _devices, _dtensor"),
    ("torchext/amp/x.py", "from .._version import __version__"),
    ("torchext/cli/x.py", "import torchext"),
    ("torchext/__init__.py", "from . import amp, nn, optim"),
    ("torchext/nn/utils/x.py", "from ... import _devices"),
    ("torchext/nn/x.py", "from .utils.clip_grad import clip_grad_norm_"),
    ("torchext/bench/x.py", "from ..optim import ASGD"),
])
def test_each_rule_allows_what_it_says(tmp_path, importer, source):
    found = _imports_of(tmp_path, importer, source)
    bad = (private_imports_across_packages(found) + names_from_the_root(found)
           + imports_of_nn(found))
    assert bad == []


def _imports_of(tmp_path, importer, source):
    """The imports of one made-up module, ``source`` in ``importer``, in a
    copy of the package's layout (empty modules)."""
    pkg = tmp_path / ROOT
    for dirpath, dirnames, filenames in os.walk(PKG_DIR):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        dst = pkg / os.path.relpath(dirpath, PKG_DIR)
        dst.mkdir(parents=True, exist_ok=True)
        for f in filenames:
            if f.endswith(".py") or f.endswith((".so", ".pyd")):
                (dst / f).write_text("")
    (pkg / os.path.dirname(importer[len(ROOT) + 1:]) / os.path.basename(importer)).write_text(
        source + "\n")
    return [i for i in imports(str(pkg)) if i.where.startswith(importer + ":")]


def test_no_private_import_across_packages():
    bad = private_imports_across_packages(imports())
    assert not bad, _report(bad, "(a)")


def test_nothing_is_imported_from_the_package_root():
    bad = names_from_the_root(imports())
    assert not bad, _report(bad, "(b)")


def test_nothing_outside_nn_imports_from_nn():
    bad = imports_of_nn(imports())
    assert not bad, _report(bad, "(c)")
