"""Per-sandbox control groups: resident memory, process count and CPU share, where the host allows.

rlimits bound each process on its own; a cgroup bounds the sandbox as a whole: resident memory of
every process plus the tmpfs pages they write (`/tmp` is memory), threads as well as processes,
and CPU bandwidth (`Limits.cpus` cores' worth however many processes it starts). It also measures
the tree: CPU time and peak memory, including processes killed rather than reaped. Both layouts:
v2 (one folder with `memory.max`, `memory.swap.max`, `pids.max`, `cpu.max`, created next to
tidal's own cgroup's children so the "no internal processes" rule does not bite; the controllers
must be enabled in the parent's subtree_control) and v1 (one folder per controller hierarchy,
found in /proc/self/mountinfo, under the cgroup tidal runs in). A controller the host lacks or
will not let us write is skipped and named in `Cgroup.missing`; with none usable, `Cgroups.create`
returns None and the sandbox runs on rlimits alone (`SandboxResult.detail` says so). Creating
cgroups needs root or a delegated subtree; bwrap.py uses them when tidal runs as root.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
CPU_PERIOD_US = 100_000
EXTRA_TASKS = 8  # bwrap's init, setpriv/prlimit and the shell that starts the command, beside `pids`
REMOVE_S = 2.0  # how long a cgroup may take to empty after its processes were killed


def _mounts(mountinfo: str) -> tuple[dict[str, Path], Path | None]:
    """v1 hierarchies by controller, and the v2 mount, from /proc/self/mountinfo text."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount_point, fstype, options = Path(fields[4]), tail[0], tail[2].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = mount_point
        elif fstype == "cgroup":
            for controller in CONTROLLERS:
                if controller in options and controller not in v1:
                    v1[controller] = mount_point
    return v1, v2


def _own_paths(proc_cgroup: str) -> tuple[dict[str, str], str | None]:
    """tidal's own cgroup path per v1 controller, and its v2 path, from /proc/self/cgroup text."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, names, path = parts
        if names == "":
            v2 = path
        for name in names.split(","):
            if name in CONTROLLERS:
                v1[name] = path
    return v1, v2


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError as error:
        log.debug("cgroup: cannot write %s to %s: %s", value, path, error)
        return False


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Cgroup:
    """One sandbox's cgroup folders (one per v1 hierarchy, or one v2 folder)."""

    folders: dict[str, Path]  # controller -> folder (v2: the same folder for all)
    version: int
    missing: list[str] = field(default_factory=list)

    def add(self, pid: int) -> None:
        """Move `pid` (and the children it starts from now on) into every folder."""
        for folder in set(self.folders.values()):
            (folder / "cgroup.procs").write_text(str(pid))

    def cpu_s(self) -> float | None:
        if self.version == 2 and "cpu" in self.folders:
            for line in _lines(self.folders["cpu"] / "cpu.stat"):
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
            return None
        if "cpuacct" in self.folders:
            usage = _read_int(self.folders["cpuacct"] / "cpuacct.usage")
            return usage / 1e9 if usage is not None else None
        return None

    def peak_mb(self) -> float | None:
        if "memory" not in self.folders:
            return None
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        peak = _read_int(self.folders["memory"] / name)
        return peak / (1024 * 1024) if peak is not None else None

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this sandbox at the memory limit."""
        if "memory" not in self.folders:
            return False
        if self.version == 2:
            for line in _lines(self.folders["memory"] / "memory.events"):
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value or 0) > 0:
                    return True
            return False
        fields = dict(line.partition(" ")[::2] for line in _lines(self.folders["memory"] / "memory.oom_control"))
        if "oom_kill" in fields:  # kernels since 4.13
            return int(fields["oom_kill"] or 0) > 0
        return bool(_read_int(self.folders["memory"] / "memory.failcnt"))

    def pids_limited(self) -> bool:
        """Whether a fork failed at pids.max."""
        if "pids" not in self.folders:
            return False
        for line in _lines(self.folders["pids"] / "pids.events"):
            key, _, value = line.partition(" ")
            if key == "max" and int(value or 0) > 0:
                return True
        return False

    def remove(self) -> None:
        """Kill what is left and delete the folders. A folder whose processes are still exiting
        is handed to a background thread, so the caller does not wait for the kernel."""
        busy = []
        for folder in set(self.folders.values()):
            if self.version == 2:
                _write(folder / "cgroup.kill", "1")
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                busy.append(folder)
        if busy:
            _REAPER.put(Cgroup({str(i): f for i, f in enumerate(busy)}, self.version))

    def remove_now(self) -> None:
        """Kill what is left and delete the folders, waiting up to REMOVE_S for them to empty."""
        for folder in set(self.folders.values()):
            deadline = time.monotonic() + REMOVE_S
            while True:
                if self.version == 2:
                    _write(folder / "cgroup.kill", "1")
                else:
                    for pid in _lines(folder / "cgroup.procs"):
                        try:
                            os.kill(int(pid), 9)
                        except (ProcessLookupError, ValueError, PermissionError):
                            pass
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as error:
                    if time.monotonic() >= deadline:
                        log.warning("cgroup: could not remove %s: %s", folder, error)
                        break
                    time.sleep(0.01)


class _Reaper:
    """One background thread deleting cgroups whose processes were still exiting; drained at exit."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Cgroup] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def put(self, group: Cgroup) -> None:
        self.queue.put(group)
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="tidal-cgroup-reaper", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                group = self.queue.get(timeout=5.0)
            except queue.Empty:
                return
            group.remove_now()

    def drain(self) -> None:
        while True:
            try:
                self.queue.get_nowait().remove_now()
            except queue.Empty:
                return


_REAPER = _Reaper()
atexit.register(_REAPER.drain)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


class Cgroups:
    """Finds where sandbox cgroups can go on this host, once, and creates one per run."""

    def __init__(self, mountinfo: str | None = None, proc_cgroup: str | None = None) -> None:
        if mountinfo is None:
            mountinfo = _read_text("/proc/self/mountinfo")
        if proc_cgroup is None:
            proc_cgroup = _read_text("/proc/self/cgroup")
        v1_mounts, v2_mount = _mounts(mountinfo)
        v1_own, v2_own = _own_paths(proc_cgroup)
        self.version = 0
        self.parents: dict[str, Path] = {}
        v2_parent = self._v2_parent(v2_mount, v2_own)
        if v2_parent is not None:
            self.version = 2
            self.parents = dict.fromkeys(self._v2_controllers(v2_parent), v2_parent)
        if not self.parents:
            self.version = 1
            for controller, mount in v1_mounts.items():
                parent = mount / v1_own.get(controller, "/").lstrip("/")
                if not parent.is_dir():
                    parent = mount
                if os.access(parent, os.W_OK):
                    self.parents[controller] = parent
        self.missing = [c for c in CONTROLLERS if c not in self.parents and not (c == "cpuacct" and self.version == 2)]

    @staticmethod
    def _v2_parent(mount: Path | None, own: str | None) -> Path | None:
        if mount is None or own is None:
            return None
        parent = mount / own.lstrip("/")
        return parent if parent.is_dir() and os.access(parent, os.W_OK) else None

    @staticmethod
    def _v2_controllers(parent: Path) -> list[str]:
        """Controllers a child of `parent` gets; tries to enable memory, pids and cpu first."""
        available = set(_read_text(str(parent / "cgroup.controllers")).split())
        enabled = set(_read_text(str(parent / "cgroup.subtree_control")).split())
        for controller in ("memory", "pids", "cpu"):
            if controller in available and controller not in enabled and _write(parent / "cgroup.subtree_control", f"+{controller}"):
                enabled.add(controller)
        return [c for c in ("memory", "pids", "cpu") if c in enabled]

    @property
    def usable(self) -> bool:
        return bool(self.parents)

    def create(self, memory_mb: int, pids: int, cpus: float) -> Cgroup | None:
        """A new cgroup with these limits, or None when the host gives us none."""
        if not self.parents:
            return None
        name = f"tidal-{secrets.token_hex(6)}"
        folders: dict[str, Path] = {}
        try:
            for controller, parent in self.parents.items():
                folder = parent / name
                if folder not in folders.values():
                    folder.mkdir()
                folders[controller] = folder
        except OSError as error:
            Cgroup(folders, self.version).remove_now()
            log.warning("cgroup: cannot create %s: %s; running on rlimits alone", name, error)
            return None
        group = Cgroup(folders, self.version, missing=list(self.missing))
        memory = str(memory_mb * 1024 * 1024)
        quota = str(max(1000, int(cpus * CPU_PERIOD_US)))
        if self.version == 2:
            folder = next(iter(folders.values()))
            settings = [("memory", "memory.max", memory), ("memory", "memory.swap.max", "0"),
                        ("pids", "pids.max", str(pids + EXTRA_TASKS)), ("cpu", "cpu.max", f"{quota} {CPU_PERIOD_US}")]
            for controller, name_, value in settings:
                if controller in folders:
                    _write(folder / name_, value)
        else:
            if "memory" in folders:
                _write(folders["memory"] / "memory.limit_in_bytes", memory)
                _write(folders["memory"] / "memory.memsw.limit_in_bytes", memory)  # no swap beyond it
            if "pids" in folders:
                _write(folders["pids"] / "pids.max", str(pids + EXTRA_TASKS))
            if "cpu" in folders:
                _write(folders["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(folders["cpu"] / "cpu.cfs_quota_us", quota)
        return group


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
