"""The host side of a batched run: hand the jobs one at a time to the zygote (zygote.py) that runs
inside one sandbox, collect each job's output, report channel and exit status, check and delete
its workspace, and give up on the zygote at the first sign that it cannot be trusted.

A backend starts the sandbox with the zygote as its command and a control socket, and wraps it
in a `Zygote`, which runs jobs one at a time for as long as its owner keeps it (one batch in
`run_batch`, many tasks in a `SandboxPool`). What the driver trusts: the zygote's messages on the control socket (the jobs
never hold that socket, and cannot reach the zygote's memory) and its own clock. A job's
workspace is written here, on the host, only after the previous job's processes are all gone,
and its report channel and nonce are created only when the job starts.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import select
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tidal.sandbox.base import (
    BatchJob,
    SandboxBackend,
    SandboxResult,
    chown_tree,
    classify,
    remove_tree,
    split_module_argv,
    write_tree,
)
from tidal.sandbox.process import DRAIN_S, Capped
from tidal.types import Limits

log = logging.getLogger(__name__)

ZYGOTE_FILE = "tidal_zygote.py"
ZYGOTE_SOURCE = (Path(__file__).parent / "zygote.py").read_text(encoding="utf-8")
# Templates and companions (zygote_forks.py): a zygote has them when this file is among its harness files.
CLEAN_FILE = "tidal_zygote_clean.py"  # the zygote's checks between jobs, which it imports
CLEAN_SOURCE = (Path(__file__).parent / "zygote_clean.py").read_text(encoding="utf-8")
FORKS_FILE = "tidal_zygote_forks.py"
FORKS_SOURCE = (Path(__file__).parent / "zygote_forks.py").read_text(encoding="utf-8")
CONTROL_ENV = "TIDAL_CONTROL_FD"  # must match zygote.py
READY_S = 60.0  # how long the zygote may take to start and import the preloaded modules
GRACE_S = 10.0  # beyond a job's timeout: for the zygote's sweep and clean-up, before it counts as hung
# A job the zygote reports as finished in time, but that the host saw run longer than this past its
# timeout (a job can stop the zygote's clock with SIGSTOP), is not trusted: it is rerun alone.
LATE_S = 1.0
# A job's output and report are read every BATCH_S while it runs (`_receive`), through pipes of
# PIPE_BYTES, so that a job that writes much is held up rarely, and then for less than BATCH_S.
BATCH_S = 0.01
PIPE_BYTES = 1 << 20
DIAGNOSTIC_CAP = 16 * 1024  # kept of the zygote's own stdout/stderr, for messages


class ZygoteLost(Exception):
    """The zygote died, hung, said it is broken, or said something that does not add up."""


@dataclass
class Template:
    """What the jobs of one task share, set up once per zygote (zygote.py, "Templates"): the
    workspace the template process starts in (the job's files but the answer) and its report
    channel's input. Jobs with the same `key` must differ only in files the template never reads."""

    key: str
    files: dict[str, str | bytes]
    report_input: bytes
    base: Base | None = None  # a base that may fork this template


@dataclass
class Base:
    """A process that serves the templates of many tasks (zygote_forks.py, "base"): the job's
    command with `args` (its own arguments without the task's `paths`) run up to its base point.
    Templates with the same `key` must differ only in `paths` and in files the base never reads."""

    key: str
    args: list[str]
    paths: list[str]


@dataclass
class Companion:
    """A second process for a job, forked from the zygote (zygote.py, "Companions"): it calls `call`
    ("module:function") with its end of a socket pair; `env_drop`: prefixes of the variables of the
    job's environment it does not get (the harness's own, TIDAL_*, never)."""

    call: str
    env_drop: tuple[str, ...] = ()


@dataclass
class ZygoteJob(BatchJob):
    """A `BatchJob` with what only a zygote that has zygote_forks.py does with it: a template to fork
    it from, a companion. Elsewhere (a single run, a zygote without the file) it runs as it is."""

    template: Template | None = None
    companion: Companion | None = None


@runtime_checkable
class ZygoteBackend(SandboxBackend, Protocol):
    """A backend that can start a zygote (zygote.py) which outlives one batch: what a `SandboxPool`
    needs, so the scorer wraps every such backend in one. `open_zygote` starts a sandbox whose
    command is the zygote, for jobs run with the interpreter `flags` and at most `limits`, and
    raises `SandboxUnavailableError` when it does not start; the caller closes it."""

    def open_zygote(
        self,
        flags: Sequence[str],
        limits: Limits,
        *,
        harness_files: dict[str, str | bytes] | None = None,
        preload: Sequence[str] = (),
    ) -> Zygote: ...


def batch_flags(jobs: Sequence[BatchJob], python: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The interpreter flags every job shares, and each job's (module, args); ValueError if the
    jobs are not all `python [flags] -m module ...` with the same flags."""
    flags: list[str] | None = None
    commands = []
    for job in jobs:
        job_flags, module, args = split_module_argv(job.argv, python)
        if flags is not None and job_flags != flags:
            raise ValueError(f"every job of a batch must use the same interpreter flags: {flags} != {job_flags}")
        flags = job_flags
        commands.append((module, args))
    return flags or [], commands


@dataclass
class BatchLayout:
    """What the backend decides for each job: where workspaces live, who owns them, and how a job's
    environment, rlimits and exit status look in this backend."""

    workspace: Path  # host folder bound into the sandbox at `inside`; each job gets a fresh subfolder
    inside: str
    owner: tuple[int, int] | None  # chown each job's workspace to this (uid, gid); None: leave it
    # (job env, its workspace as seen inside, whether it has a report channel) -> its environment
    env: Callable[[dict[str, str] | None, str, bool], dict[str, str]]
    rlimits: Callable[[Limits], dict[str, tuple[int, int]]]  # the job's (soft, hard), by zygote.RLIMITS name
    # (exit code, signal) as the zygote saw them -> as `run` would report them
    exit_status: Callable[[int | None, int | None], tuple[int | None, int | None]]
    output_cap: int
    report_cap: int


class BatchDriver:
    """Runs jobs through one zygote. `control` is the host end of the control socket; `streams` are
    the sandbox process's own stdout and stderr (drained, kept for messages)."""

    def __init__(self, control: socket.socket, streams: Sequence[int], layout: BatchLayout) -> None:
        self.control = control
        self.layout = layout
        self.diagnostics = {fd: Capped(DIAGNOSTIC_CAP) for fd in streams}
        self.jobs = 0  # jobs handed to the zygote so far; job n runs in `<workspace>/<n>`...
        self.forks = False  # whether the zygote has templates...
        self.companions = False  # ...and companions
        self.template: str | None = None  # the key of the template the zygote holds...
        self.template_folder = ""  # ...whose jobs run in `<workspace>/<this>`, where it started
        self.base: str | None = None  # the key of the base the zygote holds...
        self.base_folder = ""  # ...which started (and whose templates start) in `<workspace>/<this>`
        self.templates = 0  # templates started so far...
        self.from_bases = 0  # ...of which a base forked these
        self.unusable: set[str] = set()  # keys of templates that did not start here
        self.retired: str | None = None  # why the zygote must run nothing more, once it must not

    def start(self) -> None:
        """Wait for the zygote's `ready`; ZygoteLost when it does not come (not a job's doing: the
        host or the sandbox is not fit for batches)."""
        ready = self._receive({}, time.monotonic() + READY_S, "start")
        if ready.get("event") != "ready":
            raise ZygoteLost(f"the zygote did not start: {ready}{self._tail()}")
        if ready.get("failed"):
            log.info("sandbox batch: preloading %s failed; the jobs import them themselves", ready["failed"])
        self.forks, self.companions = bool(ready.get("forks")), bool(ready.get("companions"))

    def run_job(self, job: BatchJob, module: str, args: list[str]) -> SandboxResult:
        """Run one job; ZygoteLost (and `retired` set) when the zygote cannot vouch for it. A
        result can come with `retired` set: it stands, but the zygote runs nothing more."""
        if self.retired is not None:
            raise ZygoteLost(f"the zygote was retired: {self.retired}")
        index, self.jobs = self.jobs, self.jobs + 1
        try:
            return self._run_job(index, job, module, args)
        except ZygoteLost as error:
            self.retired = str(error)
            raise

    def _tail(self) -> str:
        text = b"".join(bytes(c.data) for c in self.diagnostics.values()).decode(errors="replace").strip()
        return f" (zygote output: {text[-1000:]})" if text else ""

    def _fresh_workspace(self, index: int) -> tuple[Path, str]:
        """An empty folder for job `index`, after removing whatever an earlier job left in the root
        (a backend where jobs may write there) and resetting the root's mode."""
        root = self.layout.workspace
        for entry in os.scandir(root):
            if entry.is_dir(follow_symlinks=False):
                remove_tree(Path(entry.path))
            else:
                os.unlink(entry.path)
        os.chmod(root, 0o755)
        for name in os.listxattr(root, follow_symlinks=False):
            if name.startswith("system.posix_acl"):  # a default ACL would reach the next job's files
                os.removexattr(root, name, follow_symlinks=False)
        folder = root / str(index)
        folder.mkdir(mode=0o755)
        return folder, f"{self.layout.inside}/{index}"

    def _run_job(self, index: int, job: BatchJob, module: str, args: list[str]) -> SandboxResult:
        layout = self.layout
        zygote_job = job if isinstance(job, ZygoteJob) else None
        template = zygote_job.template if zygote_job is not None and self.forks and job.report_input is not None else None
        if template is not None and template.key != self.template and template.key not in self.unusable:
            self._open_template(job, template, module, args)
        templated = template is not None and template.key == self.template
        folder, inside = self._fresh_workspace(self.template_folder if templated else str(index))
        write_tree(folder, job.files)
        if layout.owner is not None:
            chown_tree(folder, *layout.owner)
        message: dict[str, Any] = {
            "op": "run", "cwd": inside, "module": module, "args": args, "timeout_s": job.limits.timeout_s,
            "env": layout.env(job.env, inside, job.report_input is not None),
            "rlimits": layout.rlimits(job.limits),
        }
        if templated:
            message["template"] = self.template
        companion = zygote_job.companion if zygote_job is not None and self.companions else None
        if companion is not None:
            message["companion"] = {"call": companion.call, "env_drop": list(companion.env_drop)}
        stdout, stderr, report = Capped(layout.output_cap), Capped(layout.output_cap), Capped(layout.report_cap)
        done, elapsed = self._exchange(index, job, message, stdout, stderr, report)
        result = self._result(index, job, done, elapsed, stdout, stderr, report)
        if job.after is not None:
            result.after_value = job.after(folder)  # every process of the job is gone (the zygote swept)
        remove_tree(folder)
        return result

    def _exchange(self, index: int, job: BatchJob, message: dict[str, Any], stdout: Capped, stderr: Capped,
                  report: Capped) -> tuple[dict[str, Any], float]:
        """Send job `index`'s `message` with its fresh stdout, stderr and report channel, read them
        into the sinks until the zygote says it is done; that message and the host's elapsed time."""
        out_read, out_write = _pipe()
        err_read, err_write = _pipe()
        ours, theirs = socket.socketpair() if job.report_input is not None else (None, None)
        streams = {out_read: stdout, err_read: stderr}
        started = time.monotonic()
        try:
            fds = [out_write, err_write] + ([theirs.fileno()] if theirs is not None else [])
            try:
                socket.send_fds(self.control, [json.dumps(message).encode()], fds)
            except OSError as error:
                raise ZygoteLost(f"the zygote is gone ({error})") from error
            finally:
                for fd in (out_write, err_write):
                    os.close(fd)
                if theirs is not None:
                    theirs.close()
            deadline = started + job.limits.timeout_s + GRACE_S
            if ours is not None:
                _send_report_input(ours, job.report_input or b"", deadline)
                ours.setblocking(False)
                streams[ours.fileno()] = report
            done = self._receive(streams, deadline, f"job {index}", batch_s=BATCH_S)
        finally:
            for fd in (out_read, err_read):
                os.close(fd)
            if ours is not None:
                ours.close()
        return done, time.monotonic() - started

    def _result(self, index: int, job: BatchJob, done: dict[str, Any], elapsed: float, stdout: Capped,
                stderr: Capped, report: Capped) -> SandboxResult:
        """Job `index`'s result from the zygote's `done` message; ZygoteLost when that does not add up."""
        if done.get("event") != "done":
            raise ZygoteLost(f"job {index}: unexpected message {done}")
        self._held(done)
        if done.get("retire"):
            self.retired = f"job {index} left the sandbox changed: {done['retire']}"
        timed_out = bool(done.get("timed_out"))
        if not timed_out and elapsed > job.limits.timeout_s + LATE_S:
            raise ZygoteLost(
                f"job {index} took {elapsed:.1f}s on the host clock, past its {job.limits.timeout_s:g}s limit")
        if timed_out:
            exit_code, sig = None, signal.SIGKILL
        else:
            exit_code, sig = self.layout.exit_status(done.get("exit_code"), done.get("signal"))
        stderr_bytes = bytes(stderr.data)
        status, detail = classify(timed_out, exit_code, sig, stderr_bytes)
        return SandboxResult(
            status=status,
            exit_code=exit_code,
            signal=sig,
            stdout=bytes(stdout.data),
            stderr=stderr_bytes,
            stdout_truncated=stdout.truncated,
            stderr_truncated=stderr.truncated,
            wall_s=float(done.get("wall_s", elapsed)),
            report=bytes(report.data),
            report_truncated=report.truncated,
            detail=detail,
            cpu_s=_number(done.get("cpu_s")),
            max_rss_mb=_number(done.get("max_rss_mb")),
        )

    def _held(self, message: dict[str, Any]) -> None:
        """What the zygote says it holds after a job: a template it dropped is gone."""
        if message.get("template") != self.template:
            self.template = None

    def _open_template(self, job: BatchJob, template: Template, module: str, args: list[str]) -> None:
        """Have the zygote start `template` in a folder of its own (where its jobs will run); a
        template that does not start is not tried again here (its jobs run whole sessions)."""
        layout = self.layout
        base = template.base if template.base is not None and template.base.key not in self.unusable else None
        name = self.base_folder if base is not None and base.key == self.base else f"t{self.templates}"
        self.templates += 1
        folder, inside = self._fresh_workspace(name)
        write_tree(folder, template.files)
        if layout.owner is not None:
            chown_tree(folder, *layout.owner)
        message = {
            "op": "template", "key": template.key, "cwd": inside, "module": module, "args": args,
            "timeout_s": job.limits.timeout_s, "env": layout.env(job.env, inside, True),
            "rlimits": layout.rlimits(job.limits),
        }
        if base is not None:
            message["base"] = {"key": base.key, "args": base.args, "paths": base.paths}
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        ours, theirs = socket.socketpair()
        output = Capped(DIAGNOSTIC_CAP)
        deadline = time.monotonic() + job.limits.timeout_s + GRACE_S
        try:
            try:
                socket.send_fds(self.control, [json.dumps(message).encode()], [out_write, err_write, theirs.fileno()])
            except OSError as error:
                raise ZygoteLost(f"the zygote is gone ({error})") from error
            finally:
                for fd in (out_write, err_write):
                    os.close(fd)
                theirs.close()
            _send_report_input(ours, template.report_input, deadline)
            # A template that is ready keeps its output open (it writes nothing more): no waiting for its end.
            reply = self._receive({out_read: output, err_read: output}, deadline, f"template {template.key[:12]}",
                                  drain=lambda reply: not reply.get("ready"))
        finally:
            for fd in (out_read, err_read):
                os.close(fd)
            ours.close()
        if reply.get("event") != "template":
            raise ZygoteLost(f"template {template.key[:12]}: unexpected message {reply}")
        if reply.get("retire"):
            self.retired = f"a template left the sandbox changed: {reply['retire']}"
        if base is not None and reply.get("base") != base.key:
            self.unusable.add(base.key)  # it did not start here: this zygote's templates start alone
        elif base is not None and reply.get("ready"):
            self.from_bases += 1
        if reply.get("base") != self.base:
            self.base, self.base_folder = reply.get("base"), name
        if reply.get("ready") and reply.get("template") == template.key:
            self.template, self.template_folder = template.key, name
        else:
            self.template = None
            self.unusable.add(template.key)
            text = bytes(output.data).decode(errors="replace").strip()[-1000:]
            log.info("sandbox zygote: template %s did not start (%s)%s; its jobs run whole sessions",
                     template.key[:12], reply.get("detail"), f": {text}" if text else "")

    def _receive(self, streams: dict[int, Capped], deadline: float, what: str,
                 drain: Callable[[dict[str, Any]], bool] = lambda message: True, batch_s: float = 0.0) -> dict[str, Any]:
        """Read `streams` and the zygote's output until the zygote sends a message and `streams`
        are closed (or have been drained for DRAIN_S after it; not at all when `drain(message)` is
        false); the message. With `batch_s`, `streams` are read every `batch_s` until the message
        (whatever they hold then) rather than whenever a line arrives: a job writes its report a line
        at a time, and this thread woke up (and the job's process waited for a core) for each."""
        selector = selectors.DefaultSelector()
        open_streams = dict(streams)
        batched = dict(streams) if batch_s > 0 else {}  # read in passes until the message
        for fd, sink in {**self.diagnostics, **streams}.items():
            if fd not in batched:
                selector.register(fd, selectors.EVENT_READ, sink)
        selector.register(self.control.fileno(), selectors.EVENT_READ, None)
        message: dict[str, Any] | None = None
        drain_until = None
        next_pass = time.monotonic() + batch_s
        try:
            while message is None or open_streams:
                now = time.monotonic()
                if message is None and now >= deadline:
                    raise ZygoteLost(f"no word from the zygote on {what} in time")
                if drain_until is not None and now >= drain_until:
                    break
                if batched and now >= next_pass:
                    _read_ready(batched, open_streams)
                    next_pass = now + batch_s
                limit = drain_until if drain_until is not None else deadline
                if batched:
                    limit = min(limit, next_pass)
                for key, _ in selector.select(timeout=max(0.0, limit - now)):
                    if key.data is None:
                        try:
                            data = self.control.recv(1 << 20)
                        except OSError as error:  # ECONNRESET: it exited with our message unread
                            raise ZygoteLost(f"the zygote is gone during {what} ({error})") from error
                        if not data:
                            raise ZygoteLost(f"the zygote exited during {what}")
                        message = _parse(data)
                        if message.get("event") == "broken":
                            raise ZygoteLost(f"the zygote gave up during {what}: {message.get('detail')}")
                        selector.unregister(key.fd)
                        for fd, sink in batched.items():  # from now on, read to their end
                            if fd in open_streams:
                                selector.register(fd, selectors.EVENT_READ, sink)
                        batched = {}
                        drain_until = time.monotonic() + (DRAIN_S if drain(message) else 0.0)
                        continue
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
                        open_streams.pop(key.fd, None)
        finally:
            selector.close()
        assert message is not None
        return message


def _pipe() -> tuple[int, int]:
    """A pipe whose read end does not block, with room for PIPE_BYTES where the host allows it."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    try:
        fcntl.fcntl(read, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:  # over the user's limit (/proc/sys/fs/pipe-max-size): the default 64 KiB
        pass
    return read, write


def _read_ready(streams: dict[int, Capped], open_streams: dict[int, Capped]) -> None:
    """Read what `streams` hold now, without waiting; a stream at its end leaves both dicts."""
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN)
    for fd, _ in poller.poll(0):
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:
                streams.pop(fd)
                open_streams.pop(fd, None)
                break
            streams[fd].add(chunk)
            if len(chunk) < 1 << 16:
                break


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _parse(data: bytes) -> dict[str, Any]:
    try:
        message = json.loads(data)
    except ValueError as error:
        raise ZygoteLost(f"the zygote sent something that is not JSON: {data[:200]!r}") from error
    if not isinstance(message, dict):
        raise ZygoteLost(f"the zygote sent {message!r}")
    return message


def _send_report_input(channel: socket.socket, data: bytes, deadline: float) -> None:
    """As `supervise` does: send, shut our side for writing, then only read."""
    if data:
        channel.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            channel.sendall(data)
        except OSError:
            pass  # the job is gone or not reading; its result says why
    try:
        channel.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    channel.setblocking(False)


class Zygote:
    """A started zygote sandbox, used by one thread at a time: runs jobs until it is closed, lost
    (it died, hung or said something wrong) or retired (a job left the sandbox changed).

    `flags` are the interpreter flags it was started with (every job must use them); `limits` the
    widest limits a job may ask for (the zygote's own hard limits bound its children's); `close`
    kills the sandbox and deletes its folder. A backend makes one with `open_zygote`.
    """

    def __init__(self, driver: BatchDriver, python: str, flags: list[str], limits: Limits,
                 close: Callable[[], None], pid: int) -> None:
        self.driver, self.python, self.flags, self.limits = driver, python, list(flags), limits
        self.pid = pid  # the host pid of the sandbox's outermost process (bwrap)
        self._close = close
        self._lock = threading.Lock()
        self.closed = False

    @property
    def usable(self) -> bool:
        return not self.closed and self.driver.retired is None

    @property
    def jobs(self) -> int:
        return self.driver.jobs

    def fits(self, job: BatchJob) -> bool:
        """Whether `job` can run here: same interpreter flags, limits within the zygote's own."""
        try:
            flags, _, _ = split_module_argv(job.argv, self.python)
        except ValueError:
            return False
        return flags == self.flags and job.limits.memory_mb <= self.limits.memory_mb \
            and job.limits.pids <= self.limits.pids and job.limits.timeout_s <= self.limits.timeout_s

    def run(self, job: BatchJob) -> SandboxResult | None:
        """The job's result, or None when the zygote could not vouch for it (the caller runs it in a
        sandbox of its own). ValueError for a job that does not fit (see `fits`)."""
        if not self.fits(job):
            raise ValueError(f"job {job.argv[:6]!r} does not fit this zygote (flags {self.flags}, {self.limits})")
        _, module, args = split_module_argv(job.argv, self.python)
        with self._lock:
            if not self.usable:
                return None
            try:
                return self.driver.run_job(job, module, args)
            except ZygoteLost as error:
                log.info("sandbox zygote: %s; the job runs in a sandbox of its own%s", error, self.driver._tail())
                return None

    def run_all(self, jobs: Sequence[BatchJob]) -> list[SandboxResult | None]:
        """`run` for each job in turn; once the zygote is lost or retired, None for the rest."""
        results = [self.run(job) for job in jobs]
        if None in results:
            lost = results.index(None)
            log.info("sandbox batch: the %d job(s) from job %d on run one sandbox each", len(jobs) - lost, lost)
        return results

    def close(self) -> None:
        """Kill the sandbox (every process in it) and delete its folder; idempotent."""
        with self._lock:
            if not self.closed:
                self.closed = True
                self._close()
