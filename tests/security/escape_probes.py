"""Helpers for the escape probes: run a probe program in the sandbox, and look at the host.

A probe is a Python program run by `ProbeRunner.run` in a fresh bwrap sandbox. It starts with
`PRELUDE` (raw syscalls through ctypes, `attempt`, `report`) and ends by printing one
`PROBE {...}` JSON line that the test reads back. What the probe prints is only half of each
test: wherever the host can look for itself (a listener that got no connection, a file that does
not exist, a process that is gone), the test looks.

Every process a probe starts carries `TIDAL_PROBE_MARKER=<marker>` in its environment, so the
host can find the processes of one test among those of other sandboxes running at the same time
(several engineers and CI jobs share a host, and all sandboxes run as uid 65534).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from textwrap import dedent
from typing import Any

from tidal.sandbox import SandboxBackend, SandboxResult
from tidal.types import Limits

SANDBOX_UID = 65534
MARKER_ENV = "TIDAL_PROBE_MARKER"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
SYSCALLS = {
    "clone": 56, "ptrace": 101, "mount": 165, "init_module": 175, "add_key": 248, "request_key": 249,
    "keyctl": 250, "unshare": 272, "perf_event_open": 298, "setns": 308, "process_vm_readv": 310,
    "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
    "clone3": 435, "kexec_load": 246,
}

PRELUDE = f'''\
import ctypes, errno, json, os, sys
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
SYS = {SYSCALLS!r}


def errname(number):
    return errno.errorcode.get(number, str(number))


def syscall(name, *args):
    """The raw syscall's return value, or the errno name when it failed."""
    ctypes.set_errno(0)
    ret = _libc.syscall(ctypes.c_long(SYS[name]), *(ctypes.c_long(a) for a in args))
    return errname(ctypes.get_errno()) if ret == -1 else ret


def attempt(action, *args, **kwargs):
    """Return "ok" when `action` succeeded, else the errno name of the OSError it raised."""
    try:
        action(*args, **kwargs)
    except OSError as error:
        return errname(error.errno) if error.errno is not None else repr(error)
    return "ok"


def report(**values):
    print("PROBE " + json.dumps(values), flush=True)


'''


def host_path(backend: SandboxBackend, inside: str) -> str | None:
    """Where path `inside` of the sandbox lives on the host, through the backend's read-only binds
    of the interpreter and its packages (None when no bind holds it)."""
    binds = backend.mounts.binds  # type: ignore[attr-defined]  # bwrap's (host, inside) pairs
    for host, mount_point in sorted(binds, key=lambda bind: -len(bind[1])):
        if inside == mount_point or inside.startswith(mount_point + "/"):
            return host + inside[len(mount_point):]
    return None


def probe_output(result: SandboxResult) -> dict[str, Any]:
    """The values the probe reported (its last `PROBE` line); AssertionError with the output if none."""
    for line in reversed(result.stdout_text.splitlines()):
        if line.startswith("PROBE "):
            return dict(json.loads(line[len("PROBE "):]))
    raise AssertionError(
        f"the probe reported nothing (status {result.status.value}, exit {result.exit_code}, "
        f"signal {result.signal}):\nstdout: {result.stdout_text[-2000:]}\nstderr: {result.stderr_text[-2000:]}"
    )


def boot_ticks() -> int:
    """Now, in the clock ticks since boot that /proc/<pid>/stat's starttime uses."""
    with open("/proc/uptime") as file:
        return int(float(file.read().split()[0]) * CLOCK_TICKS)


@dataclass
class HostProcess:
    pid: int
    cpu_s: float  # user + system
    rss_kb: int


def marked_processes(marker: str, since_ticks: int = 0) -> list[HostProcess]:
    """Live host processes of the sandbox uid, started at `since_ticks` or later, whose environment
    holds `marker`: the processes of one test's sandboxes, seen from the host."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != SANDBOX_UID:
                continue
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
            if fields[0] in ("Z", "X") or int(fields[19]) < since_ticks:
                continue  # a zombie runs nothing and holds nothing but its pid
            with open(f"/proc/{entry}/environ", "rb") as file:
                if needle not in file.read():
                    continue
            rss_kb = int(fields[21]) * os.sysconf("SC_PAGE_SIZE") // 1024
            found.append(HostProcess(int(entry), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, rss_kb))
        except (OSError, IndexError, ValueError):
            continue  # gone while we looked
    return found


def wait_until_gone(marker: str, since_ticks: int, within_s: float = 3.0) -> list[HostProcess]:
    """The marked processes still alive after up to `within_s` seconds (the kernel tears a pid
    namespace down asynchronously)."""
    deadline = time.monotonic() + within_s
    while (left := marked_processes(marker, since_ticks)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@dataclass
class Sampler:
    """Samples one test's sandbox processes from the host while a probe runs, in a thread."""

    marker: str
    since_ticks: int
    interval_s: float = 0.05
    max_count: int = 0
    max_cpu_s: float = 0.0  # largest sum of the live processes' CPU time seen at once
    max_rss_kb: int = 0  # largest sum of their resident memory seen at once
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:  # noqa: PYI034 - a final dataclass
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            processes = marked_processes(self.marker, self.since_ticks)
            self.max_count = max(self.max_count, len(processes))
            self.max_cpu_s = max(self.max_cpu_s, sum(p.cpu_s for p in processes))
            self.max_rss_kb = max(self.max_rss_kb, sum(p.rss_kb for p in processes))
            self._stop.wait(self.interval_s)


@dataclass
class ProbeRunner:
    """Runs probe programs for one test; `marker` tags every process they start."""

    backend: SandboxBackend
    marker: str
    since_ticks: int

    def run(
        self,
        code: str,
        *,
        timeout_s: float = 4.0,
        memory_mb: int = 256,
        pids: int = 16,
        files: dict[str, str | bytes] | None = None,
        env: dict[str, str] | None = None,
        after: Callable[[Any], Any] | None = None,
        limits: Limits | None = None,
    ) -> SandboxResult:
        """Run `PRELUDE + code` as /workspace/probe.py."""
        return self.backend.run(
            [self.backend.python, "probe.py"],
            {"probe.py": PRELUDE + dedent(code), **(files or {})},
            limits or Limits(timeout_s=timeout_s, memory_mb=memory_mb, pids=pids),
            env={MARKER_ENV: self.marker, **(env or {})},
            after=after,
        )

    def sampler(self) -> Sampler:
        return Sampler(self.marker, self.since_ticks)


# ----------------------------------------------------------------------------- host fixtures' records


@dataclass
class Listeners:
    """Sockets on the host that nothing in the sandbox may reach."""

    tcp: socket.socket  # 127.0.0.1, listening
    udp: socket.socket  # 127.0.0.1
    unix_path: socket.socket  # a path in the host's /tmp, listening
    unix_abstract: socket.socket  # an abstract name, listening

    @property
    def tcp_port(self) -> int:
        return int(self.tcp.getsockname()[1])

    @property
    def udp_port(self) -> int:
        return int(self.udp.getsockname()[1])

    def contacted(self) -> list[str]:
        """The listeners that received a connection or a datagram (none, if contained)."""
        hits = []
        for name, sock in (("tcp", self.tcp), ("unix_path", self.unix_path), ("unix_abstract", self.unix_abstract)):
            try:
                connection, _ = sock.accept()
                connection.close()
                hits.append(name)
            except BlockingIOError:
                pass
        try:
            self.udp.recvfrom(1024)
            hits.append("udp")
        except BlockingIOError:
            pass
        return hits


@dataclass
class HostSecret:
    path: Path  # in the host's /tmp, readable by everyone on the host
    value: str


@dataclass
class HostSleeper:
    process: subprocess.Popen[bytes]
    tag: str  # its unique argument, findable in /proc/<pid>/cmdline
