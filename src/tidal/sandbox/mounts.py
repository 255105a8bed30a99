"""Where the sandbox's system folders and its Python come from: the read-only binds bwrap.py makes.

The host's /usr, /lib*, /bin and /sbin are bound read-only (or recreated as the symlinks they
are); an environment image (image.py) supplies the interpreter at /opt/tidal/python and its
packages at /opt/tidal/site. Nothing of the host's own Python installation, virtual environment
or project checkout is mounted.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from tidal.sandbox.image import DEFAULT_IMAGE, find_image

PYTHON_ROOT = "/opt/tidal/python"
SITE_ROOT = "/opt/tidal/site"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class PythonMounts:
    """Where the interpreter and the harness packages come from, and where they appear inside."""

    binds: tuple[tuple[str, str], ...]  # (host path, path inside), bound read-only
    python: str  # the interpreter, inside
    site: str | None  # folder inside holding the bound packages (put on PYTHONPATH)
    ld_library_path: str | None  # for interpreters linked to libpython by an absolute RUNPATH
    env: tuple[tuple[str, str], ...] = ()  # the image's own environment variables


def _inside_system_dirs(path: str) -> bool:
    return any(path == d or path.startswith(d + "/") for d in SYSTEM_DIRS)


@functools.lru_cache(maxsize=16)
def image_mounts(name: str = DEFAULT_IMAGE, root: str | None = None) -> PythonMounts:
    """Read-only binds that make environment image `name` (image.py) the sandbox's Python: its
    interpreter tree at /opt/tidal/python and its packages at /opt/tidal/site. Nothing of the
    host's Python installation, virtual environment or project checkout is mounted."""
    image = find_image(name, root)
    python = f"{PYTHON_ROOT}/{image.executable}"
    binds = ((str(image.python_root), PYTHON_ROOT), (str(image.site), SITE_ROOT))
    env = tuple(sorted(image.manifest.get("spec", {}).get("env", {}).items()))
    return PythonMounts(binds, python, SITE_ROOT, f"{PYTHON_ROOT}/lib" if image.needs_libpython else None, env)


def system_args() -> list[str]:
    args: list[str] = []
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    if os.path.exists("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return args


def parent_dirs(paths: list[str]) -> list[str]:
    """`--dir` entries (world-readable) for every parent of `paths`, so uid 65534 can traverse
    them (bwrap creates missing parents 0700)."""
    args: list[str] = []
    seen: set[str] = set()
    for path in paths:
        parts = Path(path).parent.parts[1:]
        for i in range(len(parts)):
            folder = "/" + "/".join(parts[: i + 1])
            if folder not in seen and not _inside_system_dirs(folder):
                seen.add(folder)
                args += ["--perms", "0755", "--dir", folder]
    return args
