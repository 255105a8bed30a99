"""What the zygote (zygote.py) checks and cleans between jobs, so that no job leaves anything for
the next: scratch folders emptied, and a snapshot of what a job could change in the sandbox.

Not imported by tidal: shipped beside the zygote as the harness file `tidal_zygote_clean.py`
(`BwrapBackend.open_zygote`), which the zygote imports. It may use only the standard library.
"""

from __future__ import annotations

import os
import re
import resource
import stat

# No `typing` and no `shutil` at run time: the companions' nursery imports this module (see the
# zygote's imports).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

UNWATCHED_FILESYSTEMS = {"proc", "sysfs", "devpts", "devtmpfs", "mqueue", "cgroup", "cgroup2"}


def clean_scratch(modes: dict[str, int]) -> None:
    """Empty /tmp and /dev/shm and give them back their first mode (a job may own them)."""
    for folder, mode in modes.items():
        if stat.S_IMODE(os.stat(folder).st_mode) != mode:
            os.chmod(folder, mode)
        for entry in os.scandir(folder):
            if entry.is_dir(follow_symlinks=False):
                import shutil  # from the zygote's read-only import path, once a job left a folder

                shutil.rmtree(entry.path, onerror=_force)
            else:
                os.unlink(entry.path)


def _force(function: Any, path: str, _exc: Any) -> None:
    os.chmod(os.path.dirname(path), stat.S_IRWXU)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, stat.S_IRWXU)
    function(path)


def _under(path: str, folders: tuple[str, ...]) -> bool:
    return any(path == folder or path.startswith(folder.rstrip("/") + "/") for folder in folders)


def watched(skip: tuple[str, ...]) -> tuple[list[str], set[str]]:
    """The writable mounted folders nothing empties between jobs (with bwrap as a normal user, the
    sandbox's own / and /dev belong to the sandbox user), and every mount point."""
    roots, points = [], set()
    with open("/proc/self/mountinfo", encoding="utf-8") as file:
        for line in file:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), fields[4])  # "\040" is a space
            filesystem = fields[fields.index("-") + 1]
            points.add(point)
            if "rw" in fields[5].split(",") and filesystem not in UNWATCHED_FILESYSTEMS \
                    and not _under(point, skip) and os.path.isdir(point):
                roots.append(point)
    return roots, points


def _files(roots: list[str], points: set[str], skip: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """Mode, owner, size and mtime of every entry under `roots`, without entering other mounts."""
    found = {}
    pending = list(roots)
    for root in roots:
        info = os.stat(root)
        found[root] = (info.st_mode, info.st_uid, info.st_mtime_ns)
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except PermissionError:
            continue  # a folder this user cannot read, it cannot write either
        for entry in entries:
            if entry.path in points or _under(entry.path, skip):
                continue
            info = entry.stat(follow_symlinks=False)
            found[entry.path] = (info.st_mode, info.st_uid, info.st_size, info.st_mtime_ns)
            if stat.S_ISDIR(info.st_mode):
                pending.append(entry.path)
    return found


def state(watched: tuple[list[str], set[str]], skip: tuple[str, ...], rlimits: dict[str, int]) -> dict[str, Any]:
    """What a job could leave behind for the next one: attributes a fork inherits that another
    process of the same user can change from outside, files in writable places nothing empties,
    and System V IPC objects."""
    ipc = {}
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="utf-8") as file:
                ipc[kind] = file.read()
        except OSError:
            pass
    return {
        "rlimits": {name: resource.getrlimit(number) for name, number in rlimits.items()},
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "affinity": sorted(os.sched_getaffinity(0)),
        "scheduler": os.sched_getscheduler(0),
        "files": _files(*watched, skip),
        "System V IPC objects": ipc,
    }
