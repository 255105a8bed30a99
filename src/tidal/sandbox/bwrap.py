"""The default backend: Linux namespaces through bubblewrap, rlimits through prlimit.

Inside: a new user, mount, pid, network, ipc, uts and cgroup namespace; an empty network
namespace (no interfaces but a downed loopback, so no network); uid/gid 65534 without
capabilities and with no_new_privs; read-only binds of /usr, /lib*, /bin, the Python installation
and the site-packages entries of the packages the harness needs (pytest by default); a private
/tmp, /proc and /dev; the workspace read-write at /workspace. Limits are set inside the sandbox,
after the user namespace exists, so RLIMIT_NPROC counts only this sandbox's processes.

On a root host the sandbox user must not map to host uid 0 (the kernel exempts uid 0 from
RLIMIT_NPROC, and a root-owned process is a bad place to run model code), so the uid map is
written from here (`--userns-block-fd`): 65534 inside is 65534 (nobody) on the host, and
`setpriv` drops from uid 0 to it before the command runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import resource
import secrets
import select
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from tidal.errors import SandboxUnavailableError
from tidal.sandbox.base import (
    BASE_ENV,
    FILE_SIZE_MB,
    HARNESS_ENV,
    OPEN_FILES,
    OUTPUT_CAP_BYTES,
    REPORT_CAP_BYTES,
    REPORT_FD_ENV,
    AfterRun,
    BatchJob,
    SandboxResult,
    SandboxStatus,
    chown_tree,
    classify,
    register_backend,
    remove_tree,
    write_tree,
)
from tidal.sandbox.batch import (
    CLEAN_FILE,
    CLEAN_SOURCE,
    CONTROL_ENV,
    FORKS_FILE,
    READY_S,
    ZYGOTE_FILE,
    ZYGOTE_SOURCE,
    BatchDriver,
    BatchLayout,
    Zygote,
    ZygoteLost,
    batch_flags,
)
from tidal.sandbox.cgroup import Cgroup, Cgroups
from tidal.sandbox.image import DEFAULT_IMAGE
from tidal.sandbox.leftovers import make_run_dir
from tidal.sandbox.mounts import image_mounts, parent_dirs, system_args
from tidal.sandbox.process import ProcessRun, supervise
from tidal.sandbox.seccomp import build_filter, filter_fd
from tidal.sandbox.workspace_fs import is_mount, mount_tmpfs, unmount
from tidal.types import Limits

log = logging.getLogger(__name__)

SANDBOX_UID = 65534  # "nobody" on Debian-like systems
WORKSPACE = "/workspace"
HARNESS_ROOT = "/opt/tidal/harness"
INSTALL_HINT = "install bubblewrap: apt-get install bubblewrap (Debian/Ubuntu) or dnf install bubblewrap"
ZYGOTE_MEMORY_MB = 256  # a zygote's own resident memory (interpreter, pytest), beside its widest job
HANDSHAKE_S = 10.0  # how long bwrap may take to report its child before the sandbox counts as broken


def _own_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _exit_and_signal(returncode: int) -> tuple[int | None, int | None]:
    """bwrap exits with 128 + N when signal N ended the command (as a shell does); a negative
    code means bwrap itself was killed."""
    if returncode < 0:
        return None, -returncode
    if returncode > 128:
        return None, returncode - 128
    return returncode, None


def _usage(run: ProcessRun, group: Cgroup | None) -> tuple[float | None, float | None, bool]:
    """(cpu_s, max_rss_mb, killed at the memory limit) of a run, from its cgroup when it had one."""
    if group is not None:
        cpu_s = group.cpu_s()
        # wait4's figure is polluted (below); the cgroup's peak is the sandbox's own memory.
        return (cpu_s if cpu_s is not None else run.cpu_s), group.peak_mb(), group.oom_killed()
    if run.max_rss_mb is not None and run.max_rss_mb <= _own_peak_mb():
        # Linux carries a process's peak RSS across fork and exec, so bwrap, started from
        # this (maybe large) process, reports at least our peak: no figure beats a wrong one.
        return run.cpu_s, None, False
    return run.cpu_s, run.max_rss_mb, False


def _raise_not_started(run: ProcessRun, limits: Limits) -> NoReturn:
    """Why a run whose start marker never came is the sandbox's failure, not the command's."""
    if run.timed_out and not run.stdout.data:
        raise SandboxUnavailableError(
            f"the sandbox did not start within {limits.timeout_s:g}s: {run.stderr.data[-2000:].decode(errors='replace')}"
        )
    raise SandboxUnavailableError(
        "bwrap could not set up the sandbox (exit code "
        f"{run.returncode}): {run.stderr.data[-2000:].decode(errors='replace').strip()}"
    )


@register_backend("bwrap")
class BwrapBackend:
    """bubblewrap sandbox (the default). See the module docstring and docs/design/sandbox.md."""

    name = "bwrap"

    def __init__(
        self,
        image: str = DEFAULT_IMAGE,
        image_root: str | None = None,
        hash_seed: int = 0,
        workdir: str | None = None,
        output_cap: int = OUTPUT_CAP_BYTES,
        report_cap: int = REPORT_CAP_BYTES,
        file_size_mb: int = FILE_SIZE_MB,
        open_files: int = OPEN_FILES,
        seccomp: bool = True,
        cgroups: bool = True,
        workspace_tmpfs: bool = True,
    ) -> None:
        self.bwrap = shutil.which("bwrap")
        if self.bwrap is None:
            raise SandboxUnavailableError(f"bubblewrap (bwrap) is not on PATH; {INSTALL_HINT}")
        tools = {name: shutil.which(name, path="/usr/bin:/bin") for name in ("prlimit", "setpriv", "sh")}
        missing = [name for name, path in tools.items() if path is None]
        if missing:
            raise SandboxUnavailableError(
                f"{', '.join(missing)} not found in /usr/bin or /bin; install util-linux (apt-get install util-linux)"
            )
        self.tools: dict[str, str] = {k: str(v) for k, v in tools.items()}
        self.image = image
        self.mounts = image_mounts(image, image_root)
        self.hash_seed = hash_seed
        self.workspace_tmpfs = workspace_tmpfs
        self.python = self.mounts.python
        self.workdir = workdir
        self.output_cap, self.report_cap = output_cap, report_cap
        self.file_size_mb, self.open_files = file_size_mb, open_files
        self.as_root = os.geteuid() == 0
        # The seccomp filter (seccomp.py) and per-run cgroups (cgroup.py); either may be missing
        # on a host, which `self.hardening` says and every result's detail repeats.
        self.seccomp = build_filter() if seccomp else None
        self.cgroups = Cgroups() if cgroups and self.as_root else None
        if self.cgroups is not None and not self.cgroups.usable:
            self.cgroups = None
        gaps = []
        if self.seccomp is None:
            gaps.append("no seccomp filter" + ("" if not seccomp else f" (no syscall table for {os.uname().machine})"))
        if self.cgroups is None:
            gaps.append("no cgroup limits" + ("" if not cgroups else " (needs root and a writable cgroup hierarchy)"))
        elif self.cgroups.missing:
            gaps.append(f"cgroup controllers missing: {', '.join(self.cgroups.missing)}")
        self.hardening = "; ".join(gaps)
        if gaps and seccomp and cgroups:
            log.warning("bwrap sandbox without full hardening: %s", self.hardening)

    # ------------------------------------------------------------------ command line

    def _bwrap_args(
        self, run_dir: Path, info_fd: int | None, block_fd: int | None, seccomp_fd: int | None = None
    ) -> list[str]:
        args = [
            str(self.bwrap),
            "--unshare-all",
            "--unshare-user",  # --unshare-all only tries; a sandbox without it is not one
            "--die-with-parent",
            "--new-session",  # no TIOCSTI into the caller's terminal
            "--hostname", "sandbox",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
        ]
        if info_fd is not None and block_fd is not None:
            args += ["--info-fd", str(info_fd), "--userns-block-fd", str(block_fd)]
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        args += system_args()
        args += parent_dirs([inside for _, inside in self.mounts.binds] + [HARNESS_ROOT])
        for host, inside in self.mounts.binds:
            args += ["--ro-bind", host, inside]
        args += ["--ro-bind", str(run_dir / "harness"), HARNESS_ROOT]
        args += ["--perms", "1777", "--size", str(self.file_size_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--perms", "1777", "--size", str(self.file_size_mb * 1024 * 1024), "--tmpfs", "/dev/shm"]  # POSIX semaphores
        args += ["--bind", str(run_dir / "workspace"), WORKSPACE, "--chdir", WORKSPACE]
        args += ["--remount-ro", "/"]  # the root tmpfs (the sandbox user owns it when run unprivileged)
        return args

    def rlimits(self, limits: Limits, extra_processes: int = 0) -> dict[str, tuple[int, int]]:
        """(soft, hard) per prlimit option name. `extra_processes` more processes of the sandbox user
        run beside the command (a batch's zygote), so RLIMIT_NPROC leaves the command as many."""
        cpu = max(1, math.ceil(limits.timeout_s))
        memory = limits.memory_mb * 1024 * 1024
        file_size = self.file_size_mb * 1024 * 1024
        pids = limits.pids + extra_processes
        return {"cpu": (cpu, cpu + 1), "as": (memory, memory), "fsize": (file_size, file_size),
                "nofile": (self.open_files, self.open_files), "nproc": (pids, pids), "core": (0, 0)}

    def _inner_prefix(self, rlimits: dict[str, tuple[int, int]], marker: str) -> list[str]:
        """What runs inside before the command: (drop to uid 65534,) print the start marker, set
        the limits, exec the command."""
        prefix: list[str] = []
        if self.as_root:
            prefix += [
                self.tools["setpriv"], f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--keep-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--",
            ]
        prefix += [self.tools["sh"], "-c", 'printf %s "$0"; exec "$@"', marker]
        prefix += [self.tools["prlimit"], *(f"--{name}={soft}:{hard}" for name, (soft, hard) in rlimits.items()), "--"]
        return prefix

    def _env(self, env: dict[str, str] | None, report_fd: int | None, home: str = WORKSPACE) -> dict[str, str]:
        python_bin = os.path.dirname(self.python)
        inner = dict(BASE_ENV)
        inner["PYTHONHASHSEED"] = str(self.hash_seed)
        inner.update(self.mounts.env)
        inner["PATH"] = f"{python_bin}:/usr/local/bin:/usr/bin:/bin"
        inner["HOME"] = home
        inner["PYTHONPATH"] = ":".join(p for p in (HARNESS_ROOT, self.mounts.site) if p)
        inner[HARNESS_ENV] = HARNESS_ROOT
        if self.mounts.ld_library_path:
            inner["LD_LIBRARY_PATH"] = self.mounts.ld_library_path
        if report_fd is not None:
            inner[REPORT_FD_ENV] = str(report_fd)
        inner.update(env or {})
        return inner

    # ------------------------------------------------------------------ run

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
        if not argv:
            raise ValueError("argv must name a command")
        run_dir = make_run_dir("tidal-sandbox-", self.workdir)
        try:
            workspace = self._prepare(run_dir, harness_files)
            self.prepare_workspace(workspace, limits)
            write_tree(workspace, files)
            if self.as_root:
                chown_tree(workspace, SANDBOX_UID, SANDBOX_UID)
            result = self._run_in(run_dir, argv, limits, env, report_input)
            if after is not None:
                result.after_value = after(workspace)
            return result
        finally:
            self.release_workspace(run_dir / "workspace")
            remove_tree(run_dir)

    def prepare_workspace(self, workspace: Path, limits: Limits) -> None:
        """Make the (empty) `workspace` folder a tmpfs of `limits.disk_mb` on root hosts."""
        if self.as_root and self.workspace_tmpfs:
            mount_tmpfs(workspace, limits.disk_mb)

    def release_workspace(self, workspace: Path) -> None:
        if self.as_root and self.workspace_tmpfs and is_mount(workspace):
            unmount(workspace)

    @property
    def workspace_owner(self) -> tuple[int, int] | None:
        """Who must own workspace files written from the host (the sandbox user on root hosts)."""
        return (SANDBOX_UID, SANDBOX_UID) if self.as_root else None

    def run_in(self, run_dir: Path, argv: list[str], limits: Limits, env: dict[str, str] | None = None,
               *, report_input: bytes | None = None) -> SandboxResult:
        """Run `argv` over the existing `run_dir/workspace` (kept afterwards) and `run_dir/harness`:
        sessions (session.py). `report_input` opens the report channel as `run` does."""
        if not argv:
            raise ValueError("argv must name a command")
        return self._run_in(run_dir, argv, limits, env, report_input)

    def _prepare(self, run_dir: Path, harness_files: dict[str, str | bytes] | None) -> Path:
        """The run folder's workspace (empty) and read-only harness folder; the workspace's path."""
        workspace, harness = run_dir / "workspace", run_dir / "harness"
        workspace.mkdir(mode=0o755)
        harness.mkdir(mode=0o755)
        write_tree(harness, harness_files or {}, mode=0o755)  # read-only inside; tools may be executables
        for folder, dirs, _ in os.walk(harness):
            for name in dirs:
                os.chmod(os.path.join(folder, name), 0o755)
        harness.chmod(0o755)
        return workspace

    def _run_in(
        self, run_dir: Path, argv: list[str], limits: Limits, env: dict[str, str] | None, report_input: bytes | None
    ) -> SandboxResult:
        marker = f"tidal-start-{secrets.token_hex(8)}:"
        parent_socket = child_socket = None
        if report_input is not None:
            parent_socket, child_socket = socket.socketpair()
        inner = self._inner_prefix(self.rlimits(limits), marker) + argv
        group = self.cgroups.create(limits.memory_mb, limits.pids, limits.cpus) if self.cgroups else None
        started = time.monotonic()
        try:
            with self._started(
                run_dir, inner, self._env(env, child_socket.fileno() if child_socket else None),
                [child_socket.fileno()] if child_socket else [], group,
            ) as (process, kill):
                if child_socket is not None:
                    child_socket.close()
                run = supervise(
                    process,
                    started=started,
                    deadline=started + limits.timeout_s,
                    kill=kill,
                    stdout_cap=self.output_cap + len(marker),
                    stderr_cap=self.output_cap,
                    report_cap=self.report_cap,
                    report_socket=parent_socket,
                    report_input=report_input,
                )
            usage = _usage(run, group)
        finally:
            for end in (child_socket, parent_socket):
                if end is not None:
                    end.close()
            if group is not None:
                group.remove()
        return self._result(run, marker, limits, *usage)

    def _result(self, run: ProcessRun, marker: str, limits: Limits, cpu_s: float | None,
                max_rss_mb: float | None, oom: bool) -> SandboxResult:
        """The `SandboxResult` of a supervised run whose stdout starts with `marker`;
        `SandboxUnavailableError` when it does not (bwrap failed before the command started)."""
        stdout = bytes(run.stdout.data)
        if not stdout.startswith(marker.encode()):
            _raise_not_started(run, limits)
        stdout = stdout[len(marker):]
        stdout_truncated = run.stdout.total - len(marker) > self.output_cap
        stdout = stdout[: self.output_cap]
        stderr = bytes(run.stderr.data)
        exit_code, sig = (None, signal.SIGKILL) if run.timed_out else _exit_and_signal(run.returncode)
        status, detail = classify(run.timed_out, exit_code, sig, stderr)
        if oom and not run.timed_out and status in (SandboxStatus.CRASHED, SandboxStatus.OK) and (sig or exit_code):
            status, detail = SandboxStatus.MEMORY_LIMIT, "killed by the kernel at the cgroup memory limit"
        elif oom:
            detail = f"{detail}; the kernel killed a process at the cgroup memory limit".lstrip("; ")
        if self.hardening:
            detail = f"{detail}; {self.hardening}" if detail else self.hardening
        return SandboxResult(
            status=status,
            exit_code=exit_code,
            signal=sig,
            stdout=stdout,
            stderr=stderr,
            stdout_truncated=stdout_truncated,
            stderr_truncated=run.stderr.truncated,
            wall_s=run.wall_s,
            report=bytes(run.report.data),
            report_truncated=run.report.truncated,
            detail=detail,
            cpu_s=cpu_s,
            max_rss_mb=max_rss_mb,
        )

    @contextlib.contextmanager
    def _started(
        self, run_dir: Path, inner: list[str], env: dict[str, str], fds: list[int], group: Cgroup | None = None
    ) -> Iterator[tuple[subprocess.Popen[bytes], Callable[[], None]]]:
        """bwrap running `inner` (prefix and command) with `fds` passed in, under the seccomp filter
        and, when given, in cgroup `group` (entered before bwrap may go on, so every sandboxed
        process is in it); yields the process and a function that kills the whole sandbox, and
        kills and reaps it on the way out."""
        ours = list(fds)  # descriptors the child gets
        info_read = block_write = None
        info_fd = block_fd = seccomp_fd = None
        if self.as_root:
            info_read, info_fd = os.pipe()
            block_fd, block_write = os.pipe()
            ours += [info_fd, block_fd]
        if self.seccomp is not None:
            seccomp_fd = filter_fd(self.seccomp)
            ours.append(seccomp_fd)
        try:
            process = subprocess.Popen(
                self._bwrap_args(run_dir, info_fd, block_fd, seccomp_fd) + inner,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                pass_fds=tuple(ours),
                start_new_session=True,
            )
        except OSError as error:
            for fd in (info_read, block_write):
                if fd is not None:
                    os.close(fd)
            raise SandboxUnavailableError(f"could not start bwrap: {error}; {INSTALL_HINT}") from error
        finally:
            for fd in (info_fd, block_fd, seccomp_fd):
                if fd is not None:
                    os.close(fd)

        def kill() -> None:
            if process.returncode is not None:
                return  # reaped: its process group id may belong to someone else by now
            try:
                os.killpg(process.pid, signal.SIGKILL)  # pid 1 of the sandbox dies with it, and its namespace
            except ProcessLookupError:
                pass

        try:
            if info_read is not None and block_write is not None:
                self._map_user(process, info_read, block_write, kill, group)
            yield process, kill
        finally:
            kill()
            if process.returncode is None:
                process.wait()
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
            for fd in (info_read, block_write):
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:
                        pass

    # ------------------------------------------------------------------ batch

    def run_batch(
        self,
        jobs: Sequence[BatchJob],
        *,
        harness_files: dict[str, str | bytes] | None = None,
        preload: Sequence[str] = (),
    ) -> list[SandboxResult | None]:
        """See `BatchBackend`. One sandbox whose command is the zygote (zygote.py), opened for these
        jobs and closed after them (a `SandboxPool` keeps zygotes across batches instead)."""
        if not jobs:
            return []
        flags, _ = batch_flags(jobs, self.python)
        widest = Limits(
            timeout_s=min(3600, sum(job.limits.timeout_s for job in jobs) + READY_S),
            memory_mb=max(job.limits.memory_mb for job in jobs),
            pids=max(job.limits.pids for job in jobs),
        )
        try:
            zygote = self.open_zygote(flags, widest, harness_files=harness_files, preload=preload)
        except SandboxUnavailableError as error:
            log.warning("sandbox batch: %s; every job runs in a sandbox of its own", error)
            return [None] * len(jobs)
        try:
            return zygote.run_all(jobs)
        finally:
            zygote.close()

    def open_zygote(
        self,
        flags: Sequence[str],
        limits: Limits,
        *,
        harness_files: dict[str, str | bytes] | None = None,
        preload: Sequence[str] = (),
    ) -> Zygote:
        """A started zygote sandbox for jobs run with the interpreter `flags` and at most `limits`
        (the zygote's own hard limits, which bound its children's); the workspace root is the
        host's (read-only to the jobs on a root host), each job's workspace a fresh folder in it,
        written and checked from here (batch.py). The caller closes it. Raises
        `SandboxUnavailableError` when the sandbox or the zygote does not start. bwrap dies with
        the thread that calls this (`--die-with-parent`): open zygotes that outlive a call from a
        thread that lives as long as they do."""
        run_dir = make_run_dir("tidal-batch-", self.workdir)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        stack = contextlib.ExitStack()
        stack.callback(remove_tree, run_dir)
        stack.callback(theirs.close)
        stack.callback(ours.close)
        try:
            workspace = self._prepare(run_dir, {**(harness_files or {}), ZYGOTE_FILE: ZYGOTE_SOURCE, CLEAN_FILE: CLEAN_SOURCE})
            # The jobs' folders live (one at a time) in a tmpfs of the widest job's disk size, and
            # the whole sandbox in one cgroup: the widest job's memory plus the zygote's own.
            self.prepare_workspace(workspace, limits)
            stack.callback(self.release_workspace, workspace)
            group = None
            # Beside the jobs' processes: the zygote, and with templates and companions its three
            # helpers (the nursery, a base and a task's template; zygote_forks.py), so a job still
            # gets its whole `limits.pids`.
            extra = 4 if FORKS_FILE in (harness_files or {}) else 1
            if self.cgroups is not None:
                group = self.cgroups.create(limits.memory_mb + ZYGOTE_MEMORY_MB, limits.pids + extra, limits.cpus)
                if group is not None:
                    stack.callback(group.remove)
            env = self._env(None, None)
            env[CONTROL_ENV] = str(theirs.fileno())
            command = [self.python, *flags, f"{HARNESS_ROOT}/{ZYGOTE_FILE}", WORKSPACE, *preload]
            inner = self._inner_prefix(self.rlimits(limits, extra_processes=extra), f"tidal-start-{secrets.token_hex(8)}:")
            layout = BatchLayout(
                workspace=workspace,
                inside=WORKSPACE,
                owner=(SANDBOX_UID, SANDBOX_UID) if self.as_root else None,
                env=lambda job_env, home, report: self._env(job_env, 3 if report else None, home=home),
                rlimits=lambda job_limits: self.rlimits(job_limits, extra_processes=1),
                exit_status=lambda code, sig: _exit_and_signal(code) if code is not None else (None, sig),
                output_cap=self.output_cap,
                report_cap=self.report_cap,
            )
            process, _ = stack.enter_context(self._started(run_dir, inner + command, env, [theirs.fileno()], group))
            theirs.close()
            assert process.stdout is not None and process.stderr is not None
            driver = BatchDriver(ours, [process.stdout.fileno(), process.stderr.fileno()], layout)
            driver.start()
        except ZygoteLost as error:
            stack.close()
            raise SandboxUnavailableError(str(error)) from error
        except BaseException:
            stack.close()
            raise
        return Zygote(driver, self.python, list(flags), limits, stack.close, process.pid)

    def _map_user(
        self,
        process: subprocess.Popen[bytes],
        info_read: int,
        block_write: int,
        kill: Callable[[], None],
        group: Cgroup | None = None,
    ) -> None:
        """Root hosts: map uid/gid 0 and 65534 to themselves in bwrap's new user namespace, move
        the sandbox's first process into `group`, then let bwrap continue (it waits on the block fd)."""
        deadline = time.monotonic() + HANDSHAKE_S
        buffer = b""
        pid = None
        while pid is None and select.select([info_read], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(info_read, 4096)
            if not chunk:
                break
            buffer += chunk
            try:
                pid = int(json.loads(buffer)["child-pid"])
            except (ValueError, KeyError, TypeError):
                continue
        problem = "" if pid is not None else "bwrap did not report its sandbox process"
        if pid is not None:
            mapping = f"0 0 1\n{SANDBOX_UID} {SANDBOX_UID} 1\n"
            try:
                Path(f"/proc/{pid}/uid_map").write_text(mapping)
                Path(f"/proc/{pid}/setgroups").write_text("deny")
                Path(f"/proc/{pid}/gid_map").write_text(mapping)
            except OSError as error:
                problem = f"could not map the sandbox user: {error}"
        if pid is not None and not problem and group is not None:
            try:
                group.add(pid)
            except OSError as error:
                problem = f"could not move the sandbox into its cgroup: {error}"
        if problem:
            kill()
            _, err = process.communicate()
            raise SandboxUnavailableError(
                f"{problem} (bwrap exit code {process.returncode}): {err.decode(errors='replace').strip()}; "
                "is namespace creation allowed on this host (containers often forbid it)?"
            )
        os.write(block_write, b"1")
