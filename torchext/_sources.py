"""The sources torchext's compiled library is built from (csrc/**, setup.py, version.txt, cmake/*.in),
for rebuild decisions: the import-time staleness warning (torchext/__init__.py),
the stamp setup.py writes after a build, and scripts/setup_env.sh.

Imports neither torch nor torchext, so setup.py and shell scripts run it as a
file:  python torchext/_sources.py digest ROOT [EXTRA_FILE ...]
"""
import hashlib
import os
import sys

STAMP = "_build_stamp"  # in the package directory, next to the library


def source_files(root):
    # version.txt and cmake/*.in: setup.py generates version.h and the CMake
    # package config from them.
    files = [os.path.join(root, f) for f in ("setup.py", "version.txt")]
    for top in ("csrc", "cmake"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            files += [os.path.join(dirpath, f) for f in sorted(filenames)]
    return [f for f in files if os.path.isfile(f)]


def digest(root, extra=()):
    """sha256 over the sources' relative paths and contents."""
    h = hashlib.sha256()
    for path in source_files(root) + [os.path.join(root, e) for e in extra]:
        h.update(os.path.relpath(path, root).encode() + b"\0")
        if os.path.isfile(path):
            with open(path, "rb") as f:
                h.update(f.read())
        h.update(b"\0")
    return h.hexdigest()


def write_stamp(root, package_dir):
    with open(os.path.join(package_dir, STAMP), "w") as f:
        f.write(digest(root) + "\n")


def stale_sources(root, library, package_dir):
    """Sources changed since `library` was built: those newer than it (a few
    stat calls), unless the stamp written after that build says their
    contents are the same (a checkout that only touched them)."""
    built = os.stat(library).st_mtime
    newer = [f for f in source_files(root) if os.stat(f).st_mtime > built]
    if newer:
        try:
            with open(os.path.join(package_dir, STAMP)) as f:
                if f.read().strip() == digest(root):
                    return []
        except OSError:
            pass
    return newer


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "digest":
        sys.exit(__doc__)
    print(digest(sys.argv[2], sys.argv[3:]))
