"""What a killed run leaves behind, and the sweep that removes it.

A run folder (`tidal-sandbox-*`, `tidal-batch-*` for a zygote, `tidal-unsafe-*`, a session store
`tidal-sessions-*`) is deleted by the process that made it when the run, pool or session closes.
A process killed outright cannot: its folders stay, on root hosts each still holding its
workspace's tmpfs mount (whose memory is not given back until the mount goes), and a bwrap killed
while it was starting can outlive its parent. So each run folder holds an owner file (pid, its
start time, so a reused pid does not pass for it, its pid namespace and boot). `sweep(folder)`
deletes the run folders whose owner is gone: first it kills the bwrap processes started with the
folder among their arguments, then detaches every mount under it. A folder is left alone when its
owner lives, when its owner file is missing or unreadable, and when its owner ran in another pid
namespace of this boot (a container sharing the folder: its pids mean nothing here). The first run
folder a process makes in a folder sweeps that folder (`make_run_dir`).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from tidal.sandbox.base import remove_tree
from tidal.sandbox.workspace_fs import unmount

log = logging.getLogger(__name__)

OWNER_FILE = ".tidal-owner"
PREFIXES = ("tidal-sandbox-", "tidal-batch-", "tidal-unsafe-", "tidal-sessions-")

_SWEPT: set[str] = set()
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Owner:
    pid: int
    start: int  # the process's start time, in clock ticks after boot (/proc/PID/stat, field 22)
    pid_namespace: int  # the inode of its pid namespace
    boot: str  # /proc/sys/kernel/random/boot_id

    def line(self) -> str:
        return f"{self.pid} {self.start} {self.pid_namespace} {self.boot}\n"

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        parts = text.split()
        if len(parts) != 4 or not all(part.isdigit() for part in parts[:3]):
            return None
        return cls(int(parts[0]), int(parts[1]), int(parts[2]), parts[3])


@dataclass
class Swept:
    """What `sweep` removed."""

    folders: int = 0
    mounts: int = 0
    processes: int = 0


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": field 3 onwards
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def _boot() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    except OSError:
        return "unknown"


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def me() -> Owner:
    return Owner(os.getpid(), _start_time(os.getpid()) or 0, _pid_namespace(), _boot())


def make_run_dir(prefix: str, folder: str | Path | None = None) -> Path:
    """`tempfile.mkdtemp(prefix=prefix, dir=folder)` with this process's owner file in it; the
    first call for a folder sweeps it first."""
    sweep_once(folder)
    run_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=folder))
    try:
        (run_dir / OWNER_FILE).write_text(me().line())
    except OSError:
        remove_tree(run_dir)
        raise
    return run_dir


def sweep_once(folder: str | Path | None = None) -> Swept | None:
    """`sweep(folder)` the first time this process asks for that folder; None after that."""
    key = os.path.realpath(folder or tempfile.gettempdir())
    with _LOCK:
        if key in _SWEPT:
            return None
        _SWEPT.add(key)
    try:
        return sweep(key)
    except OSError as error:  # a sweep that cannot read the folder must not stop the run
        log.warning("could not sweep %s for what killed runs left: %s", key, error)
        return None


def _dead(owner: Owner, here: Owner) -> bool:
    if owner.boot != here.boot:
        return True  # the machine restarted since: that process is gone
    if owner.pid_namespace != here.pid_namespace or owner.start == 0:
        return False  # another container's process (its pid means nothing here), or no start time to tell
    return _start_time(owner.pid) != owner.start


def sweep(folder: str | Path | None = None) -> Swept:
    """Delete the run folders in `folder` (default: the temporary folder) whose owner is gone."""
    root = Path(folder or tempfile.gettempdir())
    here, swept = me(), Swept()
    for entry in os.scandir(root):
        if not entry.name.startswith(PREFIXES) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            owner = Owner.parse((Path(entry.path) / OWNER_FILE).read_text())
        except (OSError, UnicodeDecodeError):
            continue
        if owner is None or not _dead(owner, here):
            continue
        run_dir = Path(entry.path)
        try:
            swept.processes += _kill_bwraps(run_dir)
            mounts = _mounts_under(run_dir)
            for mount in sorted(mounts, key=len, reverse=True):  # the deepest first
                unmount(Path(mount))
            swept.mounts += len(mounts)
            remove_tree(run_dir)
        except OSError as error:  # another user's folder, or one a process still holds: the next one
            log.warning("could not remove %s, which a killed run left: %s", run_dir, error)
            continue
        swept.folders += 1
    if swept.folders:
        log.info("removed %d run folder(s) that killed runs left in %s (%d mount(s), %d process(es))",
                 swept.folders, root, swept.mounts, swept.processes)
    return swept


def _mounts_under(path: Path) -> list[str]:
    """The mount points at or below `path` in this process's mount namespace."""
    prefix = str(path).rstrip("/") + "/"
    points = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            point = _unescape(fields[4])
            if point == str(path) or point.startswith(prefix):
                points.append(point)
    return points


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes ("\\040" is a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def _kill_bwraps(run_dir: Path) -> int:
    """SIGKILL the bwrap processes whose arguments name `run_dir` (or a path in it)."""
    needle = os.fsencode(str(run_dir).rstrip("/"))
    killed = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or os.path.basename(argv[0]) != b"bwrap":
            continue
        if any(arg == needle or arg.startswith(needle + b"/") for arg in argv):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed
