"""The zygote: runs INSIDE a sandbox, imports slow modules once, then runs each job of a batch in a
forked child and puts the sandbox back in a clean state before the next one.

Not imported by tidal: `open_zygote` ships it as the harness file `tidal_zygote.py` (beside
zygote_clean.py, its checks between jobs, and where given zygote_forks.py, its templates and
companions) and runs `python <flags> tidal_zygote.py <workspace root> <modules to preload...>` as
the sandbox's command. Standard library only. The host trusts only the zygote's messages on the
control socket ($TIDAL_CONTROL_FD), never the jobs' output: docs/design/sandbox.md, "The zygote's
protocol". A job's child runs `python -m module args` in-process (runpy) in its own session, with
the job's environment, folder, rlimits, stdout/stderr and report channel (fd 3). The zygote is
non-dumpable, so a job (same uid) cannot read its memory; what a job can still do to it (kill,
stop, renice, lower its rlimits) ends it or is caught by the check after every job. Children
share its imports, a pytest plugin manager built once (`prebuilt_config`), and a frozen heap
(`gc.freeze`), so their collections do not copy its pages.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import gc
import json
import os
import resource
import select
import signal
import socket
import stat
import sys
import time

# The nursery is forked from a process that has imported this module and no more, and each answer's
# process out of process is a fork of it: what it imports here every such fork copies page tables
# for and tears down again (docs/design/sandbox.md, "Cost"). So no `typing` at run time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

import tidal_zygote_clean as clean  # shipped beside this file (zygote_clean.py)

CONTROL_ENV = "TIDAL_CONTROL_FD"
COMPANION_ENV = "TIDAL_COMPANION"  # in a job with a companion: "socket fd,status fd,pid"
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
SWEEP_S = 5.0  # how long the processes a job left may take to die before the sandbox counts as broken
SETUP_FAILED = 71  # exit code of a child whose setup failed before the job's code ran
SCRATCH = ("/tmp", "/dev/shm")  # writable places outside the workspace that outlive a process: emptied
MAX_MESSAGE = 1 << 20
FD_FLOOR = 10  # a job's extra fds (ready pipe, companion) live from here up
TEMPLATE_FORK_S = 10.0  # how long a template may take to fork a job
NURSERY_PREFIX = "companion:"  # a module named so is imported by the companions' nursery, not preloaded
PYTEST_PROG = "python -m pytest"  # what pytest calls itself when run as `python -m pytest`
RLIMITS = {
    "cpu": resource.RLIMIT_CPU,
    "as": resource.RLIMIT_AS,
    "fsize": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "nproc": resource.RLIMIT_NPROC,
    "core": resource.RLIMIT_CORE,
}


_FORKS: Any = None  # the tidal_zygote_forks module, when it was shipped


class Broken(Exception):
    """The zygote cannot restore or vouch for a clean sandbox."""


_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"prctl({option}, {value}): {os.strerror(number)}")


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as file:
        data = file.read()
    return int(data[data.rindex(b")") + 2:].split()[1])  # the field after the state letter


def _ancestors() -> set[int]:
    """This process and every process above it (in a new pid namespace: the namespace's init)."""
    found, pid = set(), os.getpid()
    while pid > 0 and pid not in found:
        found.add(pid)
        pid = _parent_of(pid)
    return found


def _others(protected: set[int]) -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and int(entry) not in protected]


def _reap() -> set[int]:
    """Collect every exited child (as subreaper, that includes the orphans of a job's processes)."""
    reaped = set()
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.add(pid)


def sweep(protected: set[int]) -> set[int]:
    """Kill every process but this one and its ancestors, until /proc shows none. A daemon that
    left the job's session (setsid) is found here, not through the process group. The pids reaped."""
    deadline = time.monotonic() + SWEEP_S
    reaped = set()
    while True:
        reaped |= _reap()
        others = _others(protected)
        if not others:
            return reaped
        if time.monotonic() > deadline:
            raise Broken(f"processes {others[:10]} survived SIGKILL for {SWEEP_S:g}s")
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            except PermissionError as error:
                raise Broken(f"cannot kill process {pid}: {error}") from error
        time.sleep(0.001)


def _exit_code(value: Any) -> int:
    """The process exit status `SystemExit(value)` gives, as the interpreter computes it."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        print(value, file=sys.stderr)
    except Exception:
        pass
    return 1


def run_main(main: Callable[[], Any]) -> int:
    """`sys.exit(main())` in this process; the exit status, after the interpreter's own shutdown
    steps (join non-daemon threads, atexit, flush)."""
    import atexit
    import threading

    try:
        code = _exit_code(main())
    except SystemExit as error:
        code = _exit_code(error.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    for step in (threading._shutdown, atexit._run_exitfuncs):  # type: ignore[attr-defined]
        try:
            step()
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return code


def run_module(module: str, args: list[str]) -> int:
    """`python -m module args` in this process (see `run_main`)."""
    import runpy

    def main() -> None:
        sys.argv = ["-m", *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)

    return run_main(main)


def _plugin_exclusions(args: list[str]) -> tuple[str, ...]:
    """The `-p no:NAME` values of pytest's `args`, read as `PytestPluginManager.consider_preparse`
    reads them: all `_pytest.config.get_config` takes from the arguments besides storing them."""
    found, at = [], 0
    while at < len(args):
        option = args[at]
        at += 1
        if option == "-p":
            if at >= len(args):
                break
            value, at = args[at], at + 1
        elif option.startswith("-p"):
            value = option[2:]
        else:
            continue
        if value.strip().startswith("no:"):
            found.append(value.strip())
    return tuple(found)


_PREBUILT: dict[tuple[str, ...], Any] = {}  # plugin exclusions -> pytest Config (None: could not build)


def prebuilt_config(job: dict[str, Any]) -> Any:
    """For a pytest job: pytest's initial `Config` for the job's `-p no:` options, built once in the
    zygote (plugin manager, hook specs, default plugins and their options: much of a small
    session's start-up); None when the job is not a plain pytest run or it cannot be built (the
    child then builds it itself, as pytest always does)."""
    if job["module"] != "pytest" or "PYTEST_DEBUG" in job["env"] or "_pytest.config" not in sys.modules:
        return None
    key = _plugin_exclusions(job["args"])
    if key not in _PREBUILT:
        config = None
        try:
            from _pytest.config import get_config

            config = get_config([f"-p{value}" for value in key], None, prog=PYTEST_PROG)
        except Exception:
            pass
        _PREBUILT[key] = config
        gc.collect()
        gc.freeze()
    return _PREBUILT[key]


def hand_over(config: Any) -> None:
    """In the child: the first `get_config` call of its pytest session returns the zygote's `config`
    (its own copy), with the invocation parameters the call gives, as a freshly built one has."""
    import dataclasses
    import pathlib

    import _pytest.config

    original = _pytest.config.get_config

    def get_config(args: Any = None, plugins: Any = None, *, prog: str | None = None) -> Any:
        _pytest.config.get_config = original
        if plugins or prog != PYTEST_PROG or _plugin_exclusions(list(args or ())) != _plugin_exclusions(
                list(config.invocation_params.args)):
            return original(args, plugins, prog=prog)
        config.invocation_params = dataclasses.replace(
            config.invocation_params, args=tuple(args or ()), plugins=plugins, dir=pathlib.Path.cwd())
        return config

    _pytest.config.get_config = get_config


# ----------------------------------------------------------------------------- a job's process


def become_job(job: dict[str, Any], stdio: list[int], extra: list[int], close_others: bool) -> list[int]:
    """In a job's own process: its own session, dumpable again (as a freshly started process is),
    `stdio` (stdout, stderr[, report channel]) as fds 1, 2[, 3], the job's environment, folder,
    `sys.path[0]` and rlimits. `extra` fds move above FD_FLOOR (their new numbers are returned);
    with `close_others` every other fd is closed (a fork of the zygote holds nothing the job may
    have), else only the originals of `stdio` and `extra`."""
    os.setsid()
    prctl(PR_SET_DUMPABLE, 1)
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, FD_FLOOR) for fd in stdio]  # above the numbers they go to
    kept = [fcntl.fcntl(fd, fcntl.F_DUPFD, FD_FLOOR) for fd in extra]
    targets = range(1, len(moved) + 1)
    for fd in stdio + extra:
        if fd not in targets:  # one there is replaced by dup2
            os.close(fd)
    for target, fd in zip(targets, moved):
        os.dup2(fd, target)
        os.close(fd)
    if close_others:
        start = len(moved) + 1
        for fd in sorted(kept):
            os.closerange(start, fd)
            start = fd + 1
        os.closerange(start, max(resource.getrlimit(resource.RLIMIT_NOFILE)[1], start))
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    sys.path[0] = job["cwd"]  # what `python -m` puts first
    for name, (soft, hard) in job["rlimits"].items():
        resource.setrlimit(RLIMITS[name], (soft, hard))
    return kept


def _job_limits(job: dict[str, Any], beside: int) -> dict[str, Any]:
    """The job's rlimits, with room for `beside` more processes of the sandbox user (a template)
    as far as this process's own hard limit allows."""
    rlimits = dict(job["rlimits"])
    soft, hard = rlimits["nproc"]
    top = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    room = beside if top == resource.RLIM_INFINITY else max(0, min(beside, top - hard))
    rlimits["nproc"] = (soft + room, hard + room)
    return {**job, "rlimits": rlimits}


def _child(job: dict[str, Any], control: socket.socket, stdio: list[int], extra: list[int],
           companion: int | None, config: Any) -> None:
    """Become the job (a fork of the zygote): say so on `extra[0]` (the ready pipe), then run it.
    Never returns."""
    code = SETUP_FAILED
    try:
        control.detach()  # its fd is closed below; the object must not close a reused number later
        ready, *companion_fds = become_job(job, stdio, extra, close_others=True)
        if companion is not None:
            os.environ[COMPANION_ENV] = ",".join(map(str, [*companion_fds, companion]))
        if config is not None:
            hand_over(config)
        say_ready(ready)
    except BaseException:
        os._exit(code)
    try:
        code = run_module(job["module"], job["args"])
    finally:
        os._exit(code)


def say_ready(ready: int) -> None:
    """In a job's process, set up: its pid on its ready pipe."""
    os.write(ready, str(os.getpid()).encode())
    os.close(ready)


def read_ready(ready: int, timeout_s: float) -> int:
    """The pid a job's process (or a companion) wrote on its ready pipe; Broken when the pipe
    closes without one (it could not set up, or the helper forking it is gone) or stays silent."""
    data, deadline = b"", time.monotonic() + timeout_s
    while select.select([ready], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = os.read(ready, 32)
        if not chunk:
            break
        data += chunk
    if not data.isdigit():
        raise Broken(f"a job's process did not say it was ready ({data!r})")
    return int(data)


def exited(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


# ----------------------------------------------------------------------------- the zygote's loop


def _wait(pid: int, deadline: float, companion: Any, exclude: set[int]) -> bool:
    """Wait for the child to exit; at `deadline`, kill its process group. True when it was killed.
    A companion that ends first is reported to the job."""
    watched = [pid] + ([companion.pid] if companion is not None else [])
    handles: dict[int, int] = {}
    try:
        for process in watched:
            try:
                handles[process] = os.pidfd_open(process)
            except (AttributeError, OSError):
                pass
        while True:
            if companion is not None and not companion.reported and exited(companion.pid):
                companion.report(exclude | {pid}, pid)
                if companion.pid in handles:
                    os.close(handles.pop(companion.pid))
                watched.remove(companion.pid)
            if exited(pid):
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return True
            if len(handles) == len(watched):
                select.select(list(handles.values()), [], [], left)
            else:
                time.sleep(min(left, 0.005))
    finally:
        for handle in handles.values():
            os.close(handle)


def _run(job: dict[str, Any], fds: list[int], control: socket.socket, protected: set[int]) -> dict[str, Any]:
    config = None if job.get("template") else prebuilt_config(job)
    stdio = list(fds)
    fds.clear()
    if (job.get("template") or job.get("companion")) and _FORKS is None:
        raise Broken("the job asks for a template or a companion, but tidal_zygote_forks is not here")
    helpers = _FORKS.helpers() if _FORKS is not None else set()
    if helpers:
        job = _job_limits(job, beside=len(helpers))
    companion = _FORKS.Companion(job, stdio) if job.get("companion") else None
    ready_read, ready_write = os.pipe()
    extra = [ready_write, *(companion.theirs if companion is not None else [])]
    companion_pid = companion.pid if companion is not None else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = None
    try:
        if job.get("template"):
            _FORKS.templated(job, stdio, extra, companion_pid)
        else:
            pid = os.fork()
            if pid == 0:
                _child(job, control, stdio, extra, companion_pid, config)
    finally:
        os.close(ready_write)
        for fd in stdio:
            os.close(fd)  # the job's ends now live only in the job
        if companion is not None:
            companion.handed_over()
    if pid is None:  # forked by the template: its pid comes on the ready pipe
        try:
            pid = read_ready(ready_read, TEMPLATE_FORK_S)
        finally:
            os.close(ready_read)
        ready_read = -1
    try:
        timed_out = _wait(pid, started + float(job["timeout_s"]), companion, protected | helpers)
        _, status, usage = os.wait4(pid, 0)
    finally:
        if companion is not None:
            companion.close()
    wall_s = time.monotonic() - started
    reaped = sweep(protected | helpers)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child and every process it left, reaped
    started_ok = ready_read < 0
    if ready_read >= 0:
        os.set_blocking(ready_read, False)
        try:
            started_ok = os.read(ready_read, 32) == str(pid).encode()
        except BlockingIOError:
            started_ok = False
        os.close(ready_read)
    if not started_ok:
        raise Broken(f"the child could not set up the job (wait status {status})")
    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"event": "done", "exit_code": exit_code, "signal": sig, "timed_out": timed_out, "wall_s": wall_s,
            "cpu_s": cpu_s, "max_rss_mb": usage.ru_maxrss / 1024, "retire": None, "reaped": reaped}


def send(control: socket.socket, message: dict[str, Any]) -> None:
    control.sendall(json.dumps(message).encode())


def main(argv: list[str]) -> int:
    """`argv`: the jobs' workspace root (the host checks it), then the modules to preload."""
    global _FORKS
    sys.modules.setdefault("tidal_zygote", sys.modules[__name__])  # the name tidal_zygote_forks imports
    control = socket.socket(fileno=int(os.environ.pop(CONTROL_ENV)))
    os.set_inheritable(control.fileno(), False)
    protected = _ancestors()
    strays = _others(protected)
    if strays:  # not alone in a fresh pid namespace: the sweep would kill what is not ours
        send(control, {"event": "broken", "detail": f"not alone in its pid namespace (processes {strays[:10]})"})
        return 2
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    skip = ("/proc", argv[0], *SCRATCH)
    try:
        import tidal_zygote_forks as forks

        _FORKS = forks
    except Exception:  # not shipped (or broken): plain jobs only, which the host learns from `ready`
        pass
    nursery = [name.removeprefix(NURSERY_PREFIX) for name in argv[1:] if name.startswith(NURSERY_PREFIX)]
    if nursery and _FORKS is not None:
        _FORKS.open_nursery(control, nursery)
    failed = []
    for name in argv[1:]:
        if not name.startswith(NURSERY_PREFIX):
            try:
                __import__(name)
            except Exception:
                failed.append(name)
    modes = {folder: stat.S_IMODE(os.stat(folder).st_mode) for folder in SCRATCH if os.path.isdir(folder)}
    watched = clean.watched(skip)
    baseline = clean.state(watched, skip, RLIMITS)
    gc.collect()
    gc.freeze()  # children's collections skip (and so do not copy) everything imported so far
    send(control, {"event": "ready", "failed": failed, "forks": _FORKS is not None,
                   "companions": _FORKS is not None and bool(_FORKS.helpers())})
    while True:
        message, fds, flags, _ = socket.recv_fds(control, MAX_MESSAGE, 3)
        try:
            if not message:
                return 0
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise Broken("a control message was cut short")
            job = json.loads(message)
            if job.get("op") == "template":
                if _FORKS is None:
                    raise Broken("a template, but tidal_zygote_forks is not here")
                result = _FORKS.open_template(job, fds, control, protected)
            else:
                result = _run(job, fds, control, protected)
            clean.clean_scratch(modes)
            reaped = result.pop("reaped")
            result["retire"] = _FORKS.check_helpers(reaped) if _FORKS is not None else None
            state = clean.state(watched, skip, RLIMITS)
            changed = [key for key, value in state.items() if value != baseline[key]]
            if changed:  # this job's own result stands; the next job would not run in a clean sandbox
                paths = sorted({path for path, _ in set(state["files"].items()) ^ set(baseline["files"].items())})
                result["retire"] = f"a job changed the sandbox's {', '.join(changed)} {paths[:5] if paths else ''}".rstrip()
            result["template"] = _FORKS.template() if _FORKS is not None else None
        except Exception as error:  # whatever went wrong, the host must not trust this sandbox any more
            detail = str(error) if isinstance(error, Broken) else f"{type(error).__name__}: {error}"
            if not (isinstance(error, OSError) and error.errno == errno.EPIPE):
                send(control, {"event": "broken", "detail": detail})
            return 3
        finally:
            for fd in fds:
                os.close(fd)
        send(control, result)
        if result["retire"]:
            return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
