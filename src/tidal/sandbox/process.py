"""Supervise one sandboxed process tree: read its output within caps, enforce the wall clock.

Shared by every backend. The wall-clock limit is enforced from outside the sandbox: when it
passes, `kill` (the backend's way of killing the whole tree) is called, so a child that ignores
signals, forks or sleeps cannot outlive it.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

POLL_S = 0.05  # how often an exit is checked while orphans still hold the output pipes
DRAIN_S = 1.0  # how long output is still read after the process ended or was killed


@dataclass
class Capped:
    """A byte stream kept up to `cap` bytes; the rest is counted and dropped."""

    cap: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)


@dataclass
class ProcessRun:
    """The raw facts of one supervised run; backends turn them into a `SandboxResult`."""

    returncode: int
    timed_out: bool
    stdout: Capped
    stderr: Capped
    report: Capped
    wall_s: float
    cpu_s: float | None = None  # user + system time of the process and the descendants it reaped
    max_rss_mb: float | None = None  # the largest of those processes' peak resident memory


def reap(process: subprocess.Popen[bytes]) -> tuple[float | None, float | None]:
    """Wait for `process` like `Popen.wait`, and return its (cpu_s, max_rss_mb) from wait4."""
    if process.returncode is not None:
        return None, None
    try:
        _, status, usage = os.wait4(process.pid, 0)
    except ChildProcessError:  # reaped elsewhere
        process.wait()
        return None, None
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def _exited(pid: int) -> bool:
    """Whether `pid` has exited, without reaping it (so its process group id cannot be reused)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def supervise(
    process: subprocess.Popen[bytes],
    *,
    started: float,
    deadline: float,
    kill: Callable[[], None],
    stdout_cap: int,
    stderr_cap: int,
    report_cap: int,
    report_socket: socket.socket | None = None,
    report_input: bytes | None = None,
) -> ProcessRun:
    """Read stdout, stderr and the report socket until the tree is gone or the deadline passes.

    `kill` is called at the deadline, and also once the main process has exited, so that
    leftover children (which would hold the pipes open) do not keep running.
    """
    stdout, stderr, report = Capped(stdout_cap), Capped(stderr_cap), Capped(report_cap)
    selector = selectors.DefaultSelector()
    assert process.stdout is not None and process.stderr is not None
    selector.register(process.stdout.fileno(), selectors.EVENT_READ, stdout)
    selector.register(process.stderr.fileno(), selectors.EVENT_READ, stderr)
    if report_socket is not None:
        _open_report(report_socket, report_input, deadline)
        selector.register(report_socket.fileno(), selectors.EVENT_READ, report)

    state = _State()
    try:
        _read_until_gone(process, selector, deadline, kill, state)
    finally:
        selector.close()
        if state.drain_until is None:
            # Every stream closed on its own; the process may still be running (it closed them).
            while not _exited(process.pid):
                if time.monotonic() >= deadline:
                    state.timed_out = True
                    break
                time.sleep(POLL_S / 5)
        kill()  # before reaping, so the process group id cannot have been reused
        cpu_s, max_rss_mb = reap(process)
    return ProcessRun(
        returncode=process.returncode,
        timed_out=state.timed_out,
        stdout=stdout,
        stderr=stderr,
        report=report,
        wall_s=time.monotonic() - started,
        cpu_s=cpu_s,
        max_rss_mb=max_rss_mb,
    )


def _open_report(report_socket: socket.socket, report_input: bytes | None, deadline: float) -> None:
    """Send `report_input` on the harness's end of the report channel, shut it for writing, and
    leave it non-blocking for reading."""
    if report_input:
        # A process that never reads the channel must not stall the harness past the deadline.
        report_socket.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            report_socket.sendall(report_input)
        except OSError:
            pass  # gone, or not reading; its result says why
    try:
        report_socket.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    report_socket.setblocking(False)


@dataclass
class _State:
    """Where a supervised run stands, kept outside the read loop so that `supervise`'s clean-up sees
    it however the loop ended."""

    timed_out: bool = False
    drain_until: float | None = None  # set once the process ended or was killed


def _read_until_gone(process: subprocess.Popen[bytes], selector: selectors.BaseSelector, deadline: float,
                     kill: Callable[[], None], state: _State) -> None:
    """Read every registered stream into its `Capped` until all are closed, or until DRAIN_S after
    the process exited or was killed at `deadline` (which `state` records)."""
    while selector.get_map():
        now = time.monotonic()
        if state.drain_until is None:
            if now >= deadline:
                state.timed_out = True
                kill()
                state.drain_until = now + DRAIN_S
            elif _exited(process.pid):
                kill()
                state.drain_until = now + DRAIN_S
        elif now >= state.drain_until:
            break
        limit = state.drain_until if state.drain_until is not None else deadline
        for key, _ in selector.select(timeout=max(0.0, min(POLL_S, limit - now))):
            try:
                chunk = os.read(key.fd, 65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk = b""
            if chunk:
                key.data.add(chunk)
            else:
                selector.unregister(key.fd)
