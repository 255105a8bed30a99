"""`unsafe_local`: runs the command as a plain child process. No isolation at all.

For development on hosts without bubblewrap only. The command sees the host's files, network and
user; only the rlimits (CPU, address space, file size, open files, core) and the wall clock hold.
RLIMIT_NPROC is not set: outside a user namespace it would count every process of the host user.
Every run logs a warning.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tidal.sandbox.base import (
    BASE_ENV,
    FILE_SIZE_MB,
    HARNESS_ENV,
    OPEN_FILES,
    OUTPUT_CAP_BYTES,
    REPORT_CAP_BYTES,
    REPORT_FD_ENV,
    AfterRun,
    SandboxResult,
    classify,
    register_backend,
    remove_tree,
    write_tree,
)
from tidal.sandbox.leftovers import make_run_dir
from tidal.sandbox.process import ProcessRun, supervise
from tidal.types import Limits

log = logging.getLogger(__name__)


@register_backend("unsafe_local")
class UnsafeLocalBackend:
    """No isolation: the command runs as this user, on this machine, with its network."""

    name = "unsafe_local"

    def __init__(
        self,
        workdir: str | None = None,
        output_cap: int = OUTPUT_CAP_BYTES,
        report_cap: int = REPORT_CAP_BYTES,
        file_size_mb: int = FILE_SIZE_MB,
        open_files: int = OPEN_FILES,
    ) -> None:
        self.python = sys.executable
        self.workdir = workdir
        self.output_cap, self.report_cap = output_cap, report_cap
        self.file_size_mb, self.open_files = file_size_mb, open_files

    def run(
        self,
        argv: list[str],
        files: dict[str, str | bytes],
        limits: Limits,
        env: dict[str, str] | None = None,
        after: AfterRun | None = None,
        *,
        harness_files: dict[str, str | bytes] | None = None,
        report_input: bytes | None = None,
    ) -> SandboxResult:
        log.warning(
            "sandbox backend 'unsafe_local' runs model code WITHOUT isolation (host files, network, "
            "processes); use it only for development, and 'bwrap' for anything else"
        )
        if not argv:
            raise ValueError("argv must name a command")
        run_dir = make_run_dir("tidal-unsafe-", self.workdir)
        try:
            workspace, harness = run_dir / "workspace", run_dir / "harness"
            workspace.mkdir()
            harness.mkdir()
            write_tree(workspace, files)
            write_tree(harness, harness_files or {})
            result = self._run_in(workspace, harness, argv, limits, env, report_input)
            if after is not None:
                result.after_value = after(workspace)
            return result
        finally:
            remove_tree(run_dir)

    workspace_owner = None  # the workspace stays this user's

    def prepare_workspace(self, workspace: Path, limits: Limits) -> None:
        """Nothing to do: the workspace is a plain folder (no disk limit without a tmpfs)."""

    def release_workspace(self, workspace: Path) -> None:
        """Nothing to do (see `prepare_workspace`)."""

    def run_in(self, run_dir: Path, argv: list[str], limits: Limits, env: dict[str, str] | None = None,
               *, report_input: bytes | None = None) -> SandboxResult:
        """Run `argv` over the existing `run_dir/workspace` (kept afterwards) and `run_dir/harness`:
        sessions (session.py). `report_input` opens the report channel as `run` does."""
        log.warning("sandbox backend 'unsafe_local' runs model code WITHOUT isolation")
        if not argv:
            raise ValueError("argv must name a command")
        return self._run_in(run_dir / "workspace", run_dir / "harness", argv, limits, env, report_input)

    def _run_in(
        self,
        workspace: Path,
        harness: Path,
        argv: list[str],
        limits: Limits,
        env: dict[str, str] | None,
        report_input: bytes | None,
    ) -> SandboxResult:
        parent_socket = child_socket = None
        if report_input is not None:
            parent_socket, child_socket = socket.socketpair()
        inner = self._env(workspace, harness, env, child_socket)
        set_limits = self._rlimits(limits)
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                argv,
                cwd=workspace,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=inner,
                pass_fds=(child_socket.fileno(),) if child_socket else (),
                start_new_session=True,
                preexec_fn=set_limits,
            )
        finally:
            if child_socket is not None:
                child_socket.close()

        def kill() -> None:
            if process.returncode is not None:
                return
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        try:
            run = supervise(
                process,
                started=started,
                deadline=started + limits.timeout_s,
                kill=kill,
                stdout_cap=self.output_cap,
                stderr_cap=self.output_cap,
                report_cap=self.report_cap,
                report_socket=parent_socket,
                report_input=report_input,
            )
        finally:
            kill()
            if process.returncode is None:
                process.wait()
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
            if parent_socket is not None:
                parent_socket.close()
        return _result(run)

    def _env(self, workspace: Path, harness: Path, env: dict[str, str] | None,
             child_socket: socket.socket | None) -> dict[str, str]:
        """The command's whole environment: the scrubbed base, the harness's variables, then `env`."""
        inner = dict(BASE_ENV)
        inner["PATH"] = f"{os.path.dirname(self.python)}:/usr/local/bin:/usr/bin:/bin"
        inner["HOME"] = str(workspace)
        inner["PYTHONPATH"] = str(harness)
        inner[HARNESS_ENV] = str(harness)
        if child_socket is not None:
            inner[REPORT_FD_ENV] = str(child_socket.fileno())
        inner.update(env or {})
        return inner

    def _rlimits(self, limits: Limits) -> Callable[[], None]:
        """What the child runs before exec: every rlimit but RLIMIT_NPROC (module docstring)."""
        cpu = max(1, math.ceil(limits.timeout_s))
        memory = limits.memory_mb * 1024 * 1024
        file_size = self.file_size_mb * 1024 * 1024
        open_files = self.open_files

        def set_limits() -> None:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        return set_limits


def _result(run: ProcessRun) -> SandboxResult:
    """The `SandboxResult` of a supervised run (a negative return code: killed by that signal)."""
    stderr = bytes(run.stderr.data)
    if run.timed_out:
        exit_code, sig = None, signal.SIGKILL
    else:
        exit_code, sig = (None, -run.returncode) if run.returncode < 0 else (run.returncode, None)
    status, detail = classify(run.timed_out, exit_code, sig, stderr)
    return SandboxResult(
        status=status,
        exit_code=exit_code,
        signal=sig,
        stdout=bytes(run.stdout.data),
        stderr=stderr,
        stdout_truncated=run.stdout.truncated,
        stderr_truncated=run.stderr.truncated,
        wall_s=run.wall_s,
        report=bytes(run.report.data),
        report_truncated=run.report.truncated,
        detail=detail,
    )
