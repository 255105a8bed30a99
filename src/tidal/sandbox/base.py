"""The sandbox contract: one `run` call = one fresh private workspace, one process tree, one result.

A backend turns `run(argv, files, limits)` into a `SandboxResult`. Backends are picked by name
from a registry (`get_backend("bwrap")`), so a hardened backend (seccomp, images, cgroups,
snapshots) can replace the default without touching the verifiers that call it.
See docs/design/sandbox.md for what is isolated and what is not (yet).
"""

from __future__ import annotations

import enum
import os
import shutil
import signal
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, runtime_checkable

from tidal.errors import UnknownNameError
from tidal.types import Limits

# Defaults for the limits `Limits` does not carry (a later issue may move them into it).
OUTPUT_CAP_BYTES = 64 * 1024  # kept per stream (stdout, stderr); the rest is read and dropped
REPORT_CAP_BYTES = 4 * 1024 * 1024  # kept from the report channel
FILE_SIZE_MB = 64  # RLIMIT_FSIZE: the largest file one process may write
OPEN_FILES = 256  # RLIMIT_NOFILE

# Environment every sandboxed process starts from; nothing else of the host's leaks in.
BASE_ENV = {
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
    "LANG": "C.UTF-8",
    "TZ": "UTC",
}
# Names the backend sets for the sandboxed process (see `SandboxBackend.run`).
REPORT_FD_ENV = "TIDAL_REPORT_FD"
HARNESS_ENV = "TIDAL_HARNESS"


class SandboxStatus(str, enum.Enum):
    """How the sandboxed process ended. `ok` means it exited on its own, whatever its exit code."""

    OK = "ok"
    TIMEOUT = "timeout"  # wall clock (killed from outside) or the CPU-seconds limit
    MEMORY_LIMIT = "memory_limit"  # MemoryError/ENOMEM signature, or killed by the kernel
    CRASHED = "crashed"  # killed by another signal (segfault, file-size limit, ...)


@dataclass
class SandboxResult:
    """What one sandboxed run produced. Output streams are capped; the flags say when."""

    status: SandboxStatus
    exit_code: int | None  # None when the process was killed by a signal
    signal: int | None  # the signal that ended it, when one did
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    wall_s: float
    report: bytes = b""  # what the process wrote to the report channel, when one was opened
    report_truncated: bool = False
    after_value: Any = None  # what the `after` callback returned
    detail: str = ""  # why the status is what it is, for humans
    cpu_s: float | None = None  # CPU seconds (user + system) of the whole process tree, when measured
    # Peak memory: with a cgroup, what was charged to it (anonymous memory, tmpfs, page cache it
    # brought in; not shared libraries the host had cached); without one, the largest process's
    # peak RSS, or None when that cannot be told apart from the supervising process's own peak.
    max_rss_mb: float | None = None

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


AfterRun = Callable[[Path], Any]


@runtime_checkable
class SandboxBackend(Protocol):
    """Runs one command in a fresh workspace under resource limits.

    `run` writes `files` (relative path -> content) into a new private workspace, which is the
    process's working directory and `HOME`; runs `argv` there under `limits` with a scrubbed
    environment plus `env`; kills the whole process tree at `limits.timeout_s`; then calls
    `after(workspace)` (the host path, once every sandboxed process is gone) and deletes the
    workspace.

    Two channels bypass the workspace, which the candidate can write:
    - `harness_files` are written to a separate read-only folder named by `$TIDAL_HARNESS` and put
      first on `PYTHONPATH` (for a test-runner plugin, say);
    - `report_input`, when not None, opens a private socket whose fd number is in
      `$TIDAL_REPORT_FD`: the bytes are sent first and the harness side is then shut for writing;
      what the process writes back is returned in `SandboxResult.report`. It is not a file, so
      nothing in the sandbox can find it by path or write it after the process tree has ended.

    Raises `SandboxUnavailableError` when the sandbox itself cannot start; anything the command
    does (crash, hang, memory bomb) is a `SandboxResult`, never an exception.
    """

    name: str
    python: str  # the Python interpreter to put in argv, as seen from inside the sandbox

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
    ) -> SandboxResult: ...


@dataclass
class BatchJob:
    """One command of a batch: the arguments `SandboxBackend.run` takes, for `python -m module`."""

    argv: list[str]  # [backend.python, *interpreter flags, "-m", module, *args]
    files: dict[str, str | bytes]
    limits: Limits
    env: dict[str, str] | None = None
    after: AfterRun | None = None
    report_input: bytes | None = None


@runtime_checkable
class BatchBackend(SandboxBackend, Protocol):
    """A backend that also runs several `python -m` commands in ONE sandbox, one after another.

    `run_batch` starts the interpreter once, imports `preload` once, then runs each job in a forked
    child with the job's own fresh workspace, environment, limits, wall clock and report channel,
    and kills every process the job left before the next one starts. `harness_files` are shared
    by the jobs. Every job must use the same interpreter flags. Returns one entry per job, in
    order: its `SandboxResult`, exactly what `run(job.argv, ...)` would describe, or None when the
    batch could not vouch for it (the sandbox broke, or a job killed its harness); the caller runs
    those with `run`. Raises `ValueError` for a job `run` would refuse.
    """

    def run_batch(
        self,
        jobs: Sequence[BatchJob],
        *,
        harness_files: dict[str, str | bytes] | None = None,
        preload: Sequence[str] = (),
    ) -> list[SandboxResult | None]: ...


@runtime_checkable
class SessionBackend(SandboxBackend, Protocol):
    """A backend that also runs commands over a workspace that outlives them (session.py).

    `run_in` runs `argv` as `run` does, over the existing `run_dir/workspace` (kept afterwards)
    and the read-only `run_dir/harness`; `prepare_workspace` and `release_workspace` bracket a
    workspace's life (bwrap: a size-limited tmpfs on root hosts); files the host writes into it
    are given to `workspace_owner` (uid, gid), when not None."""

    @property
    def workspace_owner(self) -> tuple[int, int] | None: ...

    def prepare_workspace(self, workspace: Path, limits: Limits) -> None: ...

    def release_workspace(self, workspace: Path) -> None: ...

    def run_in(self, run_dir: Path, argv: list[str], limits: Limits, env: dict[str, str] | None = None,
               *, report_input: bytes | None = None) -> SandboxResult: ...


def split_module_argv(argv: list[str], python: str) -> tuple[list[str], str, list[str]]:
    """`[python, *flags, "-m", module, *args]` as (flags, module, args); ValueError otherwise."""
    if not argv or argv[0] != python or "-m" not in argv:
        raise ValueError(f"a batch job must run {python} -m <module>, not {argv[:4]!r}")
    at = argv.index("-m")
    flags = argv[1:at]
    if at + 1 >= len(argv) or any(not flag.startswith("-") for flag in flags):
        raise ValueError(f"a batch job must run {python} [flags] -m <module> [args], not {argv!r}")
    return flags, argv[at + 1], argv[at + 2:]


# ----------------------------------------------------------------------------- registry

BackendFactory = Callable[..., SandboxBackend]
_BACKENDS: dict[str, BackendFactory] = {}


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
    """Register a sandbox backend factory (usually the class) under `name`."""

    def decorate(factory: BackendFactory) -> BackendFactory:
        if name in _BACKENDS and _BACKENDS[name] is not factory:
            raise ValueError(f"sandbox backend {name!r} is already registered by {_BACKENDS[name]!r}")
        _BACKENDS[name] = factory
        return factory

    return decorate


def known_backends() -> set[str]:
    return set(_BACKENDS)


def get_backend(name: str = "bwrap", **options: Any) -> SandboxBackend:
    """A new backend instance by name; `UnknownNameError` lists the known ones.

    May raise `SandboxUnavailableError` when the backend cannot work on this host.
    """
    if name not in _BACKENDS:
        raise UnknownNameError("sandbox backend", name, list(_BACKENDS))
    return _BACKENDS[name](**options)


# ----------------------------------------------------------------------------- shared helpers


def safe_relative_path(name: str) -> PurePosixPath:
    """`name` as a path that stays inside its folder; ValueError for absolute paths or `..`."""
    path = PurePosixPath(name)
    if not name or "\0" in name or path.is_absolute() or any(p in ("..", "") for p in path.parts):
        raise ValueError(f"file name {name!r} must be a relative path without '..'")
    if path.parts == (".",) or not path.parts:
        raise ValueError(f"file name {name!r} names no file")
    return path


def write_tree(root: Path, files: dict[str, str | bytes], mode: int = 0o644) -> None:
    """Write `files` under `root`, creating folders; text is written as UTF-8. ValueError for a
    name that escapes `root` or clashes with another (a file where a folder must be)."""
    for name, content in files.items():
        target = root / safe_relative_path(name)
        data = content.encode("utf-8") if isinstance(content, str) else content
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except OSError as error:  # e.g. "a" and "a/b" both given: not a host problem
            raise ValueError(f"cannot write file {name!r}: {error.strerror}") from error
        target.chmod(mode)


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give `root` and everything under it to uid:gid (the sandbox user), without following links."""
    os.chown(root, uid, gid, follow_symlinks=False)
    for folder, dirs, names in os.walk(root):
        for entry in dirs + names:
            os.chown(os.path.join(folder, entry), uid, gid, follow_symlinks=False)


def remove_tree(root: Path) -> None:
    """Delete a workspace the candidate may have made hard to delete (folders without permissions)."""

    def make_writable(function: Any, path: str, _exc: Any) -> None:
        parent = os.path.dirname(path)
        for target in (parent, path):
            try:
                if not os.path.islink(target):
                    os.chmod(target, stat.S_IRWXU)
            except OSError:
                pass
        function(path)

    if root.exists():
        shutil.rmtree(root, onerror=make_writable)


MEMORY_SIGNATURES = (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc", b"out of memory")


def has_memory_signature(stderr: bytes) -> bool:
    """Whether stderr shows an allocation failure (the address-space limit makes malloc fail)."""
    return any(signature in stderr for signature in MEMORY_SIGNATURES)


def classify(timed_out: bool, exit_code: int | None, sig: int | None, stderr: bytes) -> tuple[SandboxStatus, str]:
    """The status of a run that was killed at the deadline (`timed_out`), exited with
    `exit_code`, or was ended by signal `sig`; and a detail for humans."""
    if timed_out:
        return SandboxStatus.TIMEOUT, "killed at the wall-clock limit"
    if sig == signal.SIGXCPU:
        return SandboxStatus.TIMEOUT, "CPU-seconds limit reached"
    if has_memory_signature(stderr) and (sig is not None or exit_code != 0):
        return SandboxStatus.MEMORY_LIMIT, "allocation failed at the memory limit"
    if sig is not None:
        name = signal.Signals(sig).name if sig in set(signal.Signals) else f"signal {sig}"
        hints = {signal.SIGKILL: " (the CPU-seconds hard limit, or the kernel)", signal.SIGXFSZ: " (file-size limit)"}
        return SandboxStatus.CRASHED, f"killed by {name}{hints.get(sig, '')}"
    return SandboxStatus.OK, ""

