"""Templates and companions for the zygote (zygote.py): job processes that are not plain forks of it.

Not imported by tidal: shipped beside the zygote as the harness file `tidal_zygote_forks.py` (the
pool and `python_tests` ship it), which the zygote imports when it is there; pytest_template.py
calls `fork_point` in a template. Standard library and the running zygote (`tidal_zygote`) only.
Up to three long-lived helpers run beside the zygote, each forked from it, in its own session,
non-dumpable, serving forks over a socket only the zygote holds: the *nursery* (forked before the
zygote preloads anything; companions are its forks, so they start as small as a fresh interpreter),
the *template* of the task at hand and the *base* that may have forked it (docs/design/sandbox.md,
"Templates and companions"). What they fork is the zygote's child (CLONE_PARENT, else through a
middle process that exits at once), which the zygote reaps and sweeps after as any job. After every
job the zygote checks each helper against what a job could change from outside (alive, not stopped,
its rlimits, nice value, CPU affinity, scheduler): a changed template or base is dropped and
started again when asked for; a changed nursery retires the zygote.
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import json
import os
import resource
import select
import signal
import socket
import sys
import threading
import time

# No `typing` at run time: the nursery below imports this module (see the zygote's imports).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

import tidal_zygote as zygote

REPLY_S = 10.0  # how long a helper may take to fork a process
_LIBC = ctypes.PyDLL(None, use_errno=True)  # a PyDLL call holds the GIL, as os.fork does across fork()
_LIBC.syscall.restype = ctypes.c_long
CLONE_PARENT = 0x00008000  # the new process is a child of the caller's parent
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(os.uname().machine)  # clone(2): flags first on both


class _Helper:
    """The zygote's view of a helper process."""

    def __init__(self, pid: int, channel: socket.socket, key: str = "") -> None:
        self.pid = pid
        self.channel = channel
        self.key = key  # a template: the key of the jobs it serves
        self.state: dict[str, Any] | None = None  # what its forks inherit, taken once it is ready


_NURSERY: _Helper | None = None
_BASE: _Helper | None = None
_TEMPLATE: _Helper | None = None
_FAILED_BASES: set[str] = set()  # keys of bases that did not start here: their tasks' templates start alone
_FORK_CHANNEL: socket.socket | None = None  # in a template process: its end of the zygote's socket
_FORKED = False  # in a job forked from a template
_TEMPLATE_REQUEST: dict[str, Any] = {}  # in a template forked from a base: what the zygote asked for


def helpers() -> set[int]:
    """The pids of the helpers alive now (the sweep spares them)."""
    return {helper.pid for helper in (_NURSERY, _BASE, _TEMPLATE) if helper is not None}


def template() -> str | None:
    """The key of the template the zygote holds, if any."""
    return _TEMPLATE.key if _TEMPLATE is not None else None


def _process_state(pid: int) -> tuple[dict[str, Any], bool]:
    """What a fork of process `pid` inherits that another process of the same user can change, and
    whether it still serves: not stopped, not dying, no signal on its way to it (a job's last act
    may have been to kill it; the kernel delivers that later)."""
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as file:
        fields = dict(line.split(":", 1) for line in file if ":" in line)
    attributes = {
        "rlimits": {name: resource.prlimit(pid, number) for name, number in zygote.RLIMITS.items()},
        "nice": os.getpriority(os.PRIO_PROCESS, pid),
        "affinity": sorted(os.sched_getaffinity(pid)),
        "scheduler": os.sched_getscheduler(pid),
    }
    pending = int(fields.get("SigPnd", "0").strip(), 16) | int(fields.get("ShdPnd", "0").strip(), 16)
    serving = fields.get("State", "?").strip()[:1] in ("S", "R", "D") and not pending
    return attributes, serving


def _kill(helper: _Helper, reaped: bool = False) -> None:
    """End a helper; it is not killed when it was reaped already (its pid may be reused by now)."""
    helper.channel.close()
    if not reaped:
        try:
            os.kill(helper.pid, signal.SIGKILL)
            os.waitpid(helper.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _unchanged(helper: _Helper, reaped: set[int]) -> bool:
    if helper.pid in reaped:
        return False
    try:
        attributes, serving = _process_state(helper.pid)
    except (OSError, ValueError):
        return False
    if helper.state is None:
        helper.state = attributes  # the first check, right after it started
    return serving and not zygote.exited(helper.pid) and attributes == helper.state


def check_helpers(reaped: set[int]) -> str | None:
    """After a job: drop a helper that died, stopped or was changed; why the zygote must retire
    (the nursery is gone), or None."""
    global _NURSERY, _BASE, _TEMPLATE
    if _TEMPLATE is not None and not _unchanged(_TEMPLATE, reaped):
        _kill(_TEMPLATE, _TEMPLATE.pid in reaped)
        _TEMPLATE = None
    if _BASE is not None and not _unchanged(_BASE, reaped):
        _kill(_BASE, _BASE.pid in reaped)
        _BASE = None
    if _NURSERY is not None and not _unchanged(_NURSERY, reaped):
        _kill(_NURSERY, _NURSERY.pid in reaped)
        _NURSERY = None
        return "a job killed, stopped or changed the companions' nursery"
    return None


def _ask(helper: _Helper, request: dict[str, Any], fds: list[int]) -> None:
    """Have `helper` fork a process for `request` (`fds` go to it; the last is its ready pipe)."""
    try:
        socket.send_fds(helper.channel, [json.dumps(request).encode()], fds)
    except OSError as error:
        raise zygote.Broken(f"a helper is gone ({error})") from error


def _fork_through(fds: list[int], become: Callable[[], None]) -> bool:
    """In a helper: fork a process that is the zygote's child, then run `become` in it (which says
    it is ready, with its pid: from then on it owes the helper nothing, and may even kill it).
    True in it; False in the helper.

    When the helper has no other thread, the process is its sibling: clone(2) with CLONE_PARENT,
    with the interpreter's before- and after-fork steps around it, as `os.fork` takes them.
    Otherwise (or where that clone fails) it goes through a middle process that exits at once, so
    that it is reparented to the zygote (the nearest subreaper), and it waits until it is. The
    middle process only forks again (with `os.fork`, so the process gets every after-fork step a
    fork of the helper would) and exits; it is forked by libc's fork() when the helper has no
    other thread: the interpreter's own after-fork steps would buy it nothing. A middle process
    is one more copy of a template's page tables to make and tear down for every job."""
    sys.stdout.flush()
    sys.stderr.flush()
    if threading.active_count() == 1 and _SYS_CLONE is not None:
        sibling = _sibling()
        if sibling == 0:
            try:
                become()
            except BaseException:
                os._exit(zygote.SETUP_FAILED)
            return True
        if sibling is not None:
            for fd in fds:
                os.close(fd)
            return False
    zygote_pid = os.getppid()
    middle = _LIBC.fork() if threading.active_count() == 1 else os.fork()
    if middle < 0:
        number = ctypes.get_errno()
        raise OSError(number, f"fork: {os.strerror(number)}")
    if middle == 0:
        try:
            child = os.fork()
        except BaseException:
            os._exit(1)
        if child != 0:
            os._exit(0)
        try:
            _reparented(zygote_pid)
            become()
        except BaseException:
            os._exit(zygote.SETUP_FAILED)
        return True
    for fd in fds:
        os.close(fd)
    os.waitpid(middle, 0)
    return False


def _sibling() -> int | None:
    """`os.fork`, but the child's parent is this process's parent (CLONE_PARENT): its pid here, 0
    in it, None when the kernel refuses (nothing was forked). Only for a single-threaded process:
    libc's own fork steps (its locks, the thread id it keeps) are skipped, which is safe only
    when no other thread can hold them."""
    api = ctypes.pythonapi
    api.PyOS_BeforeFork()
    pid = _LIBC.syscall(ctypes.c_long(_SYS_CLONE), ctypes.c_long(CLONE_PARENT | signal.SIGCHLD), ctypes.c_long(0),
                        ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    api.PyOS_AfterFork_Parent()
    return pid if pid > 0 else None


def _reparented(zygote_pid: int) -> None:
    """Wait until this process's parent is the zygote (its middle parent has exited)."""
    while (parent := os.getppid()) != zygote_pid:
        try:
            handle = os.pidfd_open(parent)
        except ProcessLookupError:
            continue
        try:
            select.select([handle], [], [], REPLY_S)
        finally:
            os.close(handle)


def _serve(channel: socket.socket, fork: Callable[[dict[str, Any], list[int]], bool]) -> None:
    """A helper's loop: one process per request; returns only in a forked process."""
    while True:
        try:
            message, fds, flags, _ = socket.recv_fds(channel, zygote.MAX_MESSAGE, 8)
        except OSError:
            os._exit(0)
        if not message or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            os._exit(0)
        if fork(json.loads(message), fds):
            return


def _helper_fds(control: socket.socket, channel: socket.socket) -> int:
    """In a new helper: the zygote's socket dropped, its own moved up, every other fd above the
    standard streams closed; its own fd."""
    control.detach()
    fd = fcntl.fcntl(channel.detach(), fcntl.F_DUPFD, zygote.FD_FLOOR)
    os.closerange(3, fd)
    os.closerange(fd + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    return fd


# ----------------------------------------------------------------------------- companions


def open_nursery(control: socket.socket, modules: list[str]) -> None:
    """Called by the zygote before it preloads anything: start the nursery, which imports
    `modules` (what companions call) once for all of them."""
    global _NURSERY
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = zygote.SETUP_FAILED
        try:
            ours.detach()
            os.setsid()
            channel = socket.socket(fileno=_helper_fds(control, theirs))
        except BaseException:
            os._exit(code)
        for module in modules:
            try:
                __import__(module)
            except Exception:  # noqa: BLE001 - the companion's own import says what is wrong
                pass
        _serve(channel, _fork_companion)
        os._exit(code)  # not reached: a companion never returns from `_fork_companion`
    theirs.close()
    _NURSERY = _Helper(pid, ours)


def _fork_companion(request: dict[str, Any], fds: list[int]) -> bool:
    """In the nursery: fork a companion (the callee is imported here, once, for the later ones)."""
    module, _, name = str(request["companion"]["call"]).partition(":")
    try:
        function = getattr(__import__(module, fromlist=["_"]), name)
    except (ImportError, AttributeError):
        for fd in fds:
            os.close(fd)  # its ready pipe closes unwritten: the zygote gives up on the job
        return False
    if _fork_through(fds, lambda: _companion(request, fds, function)):
        os._exit(zygote.SETUP_FAILED)  # not reached: a companion never returns
    return False


def _companion(job: dict[str, Any], fds: list[int], function: Callable[[int], Any]) -> None:
    """Become the job's companion (`fds`: stdout, stderr, its socket, its ready pipe), say so and
    call its function. Never returns."""
    spec = job["companion"]
    drop = tuple(spec.get("env_drop", ())) + ("TIDAL_",)
    harness = os.path.dirname(os.path.abspath(__file__))
    env = {name: value for name, value in job["env"].items() if not name.startswith(drop)}
    env["PYTHONPATH"] = os.pathsep.join(path for path in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if path and os.path.abspath(path) != harness)
    fd, ready = zygote.become_job({**job, "env": env}, fds[:2], fds[2:], close_others=True)
    sys.path[:] = [job["cwd"], *(path for path in sys.path[1:] if os.path.abspath(path) != harness)]
    zygote.say_ready(ready)
    code = zygote.SETUP_FAILED
    try:
        code = zygote.run_main(lambda: function(fd))
    finally:
        os._exit(code)


class Companion:
    """A job's companion (zygote docstring), forked by the nursery, reaped here; `theirs` are the
    job's ends (its socket and the status pipe)."""

    def __init__(self, job: dict[str, Any], stdio: list[int]) -> None:
        if _NURSERY is None:
            raise zygote.Broken("the companions' nursery is gone")
        ours, theirs = socket.socketpair()
        ready_read, ready_write = os.pipe()
        request = {"cwd": job["cwd"], "env": job["env"], "rlimits": job["rlimits"], "companion": job["companion"]}
        try:
            _ask(_NURSERY, request, [*stdio[:2], ours.fileno(), ready_write])
        finally:
            ours.close()
            os.close(ready_write)
        try:
            self.pid = zygote.read_ready(ready_read, REPLY_S)
        finally:
            os.close(ready_read)
        self.status_read, self.status_write = os.pipe()
        self.socket = theirs
        self.theirs = [theirs.fileno(), self.status_read]
        self.reported = False

    def handed_over(self) -> None:
        """The job's process has its ends: close ours."""
        self.socket.close()
        os.close(self.status_read)
        self.theirs = []

    def report(self, exclude: set[int], job: int) -> None:
        """The companion has exited: reap it and tell the job how it ended and what it left (every
        process but the job's own tree and `exclude`)."""
        _, status = os.waitpid(self.pid, 0)
        table = _table()
        exclude = exclude | _tree(table, job)
        left = [[pid, name] for pid, (_, name) in sorted(table.items()) if pid not in exclude]
        try:
            os.write(self.status_write, json.dumps({"status": status, "left": left[:20]}).encode())
        except OSError:
            pass  # the job is gone or closed its end
        self.close()

    def close(self) -> None:
        if not self.reported:
            self.reported = True
            os.close(self.status_write)


def _table() -> dict[int, tuple[int, str]]:
    """Every live process of the sandbox: pid -> (parent pid, name); zombies left out."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                data = file.read()
        except OSError:
            continue
        close = data.rindex(b")")
        state, parent = data[close + 2:].split()[:2]
        if state != b"Z":
            found[int(entry)] = (int(parent), data[data.index(b"(") + 1:close].decode(errors="replace"))
    return found


def _tree(table: dict[int, tuple[int, str]], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, pending = {root}, [root]
    while pending:
        for pid in children.get(pending.pop(), []):
            found.add(pid)
            pending.append(pid)
    return found


# ----------------------------------------------------------------------------- templates


def open_template(job: dict[str, Any], fds: list[int], control: socket.socket, protected: set[int]) -> dict[str, Any]:
    """Start a template process for `job` (replacing any other) and wait until it is ready: forked
    by the base `job["base"]` names when there is one (started here if need be), else by the zygote."""
    global _TEMPLATE
    if _TEMPLATE is not None:
        _kill(_TEMPLATE)
        _TEMPLATE = None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = _from_base(job, fds, theirs, control) if job.get("base") else None
    if pid is None:
        helper, reply = _spawn(job, control, list(fds), str(job["key"]), (ours, theirs))
    else:
        theirs.close()
        for fd in fds:
            os.close(fd)
        helper = _Helper(pid, ours, key=str(job["key"]))
        reply = _first_word(ours, pid, time.monotonic() + float(job["timeout_s"]))
    fds.clear()
    ready = reply.get("event") == "ready"
    if ready:
        _TEMPLATE = helper
    else:
        _kill(helper)
    detail = "" if ready else str(reply.get("detail") or f"it exited with {reply.get('exit_code')}")
    return {"event": "template", "ready": ready, "detail": detail, "reaped": zygote.sweep(protected | helpers()),
            "base": _BASE.key if _BASE is not None else None}


def _template_limits(job: dict[str, Any]) -> dict[str, Any]:
    """A template's (and a base's) rlimits: the job's, but the zygote's CPU-seconds and processes."""
    return {name: value for name, value in job["rlimits"].items() if name not in ("cpu", "nproc")}


def _from_base(job: dict[str, Any], fds: list[int], channel: socket.socket, control: socket.socket) -> int | None:
    """Have the base `job["base"]` names (started first if the zygote holds another or none) fork
    the job's template, with `fds` (stdout, stderr, report channel) and `channel` as its own; the
    template's pid, or None when no base serves (one that did not start is not tried again)."""
    global _BASE
    base = job["base"]
    if _BASE is not None and _BASE.key != base["key"]:
        _kill(_BASE)
        _BASE = None
    if _BASE is None and base["key"] not in _FAILED_BASES:
        _BASE = _start_base({**job, "args": list(base["args"])}, str(base["key"]), fds, control)
        if _BASE is None:
            _FAILED_BASES.add(str(base["key"]))
    if _BASE is None:
        return None
    ready_read, ready_write = os.pipe()
    try:
        request = {"cwd": job["cwd"], "env": job["env"], "rlimits": _template_limits(job),
                   "paths": list(base["paths"])}
        try:
            _ask(_BASE, request, [*fds, channel.fileno(), ready_write])
        finally:
            os.close(ready_write)
        return zygote.read_ready(ready_read, REPLY_S)
    finally:
        os.close(ready_read)


def _start_base(job: dict[str, Any], key: str, fds: list[int], control: socket.socket) -> _Helper | None:
    """Fork a base for `job` (its command without the task's own arguments) and wait for it to
    reach its fork point; None when it does not. Its output goes where the template's would."""
    report, report_theirs = socket.socketpair()
    stdio = [os.dup(fds[0]), os.dup(fds[1]), report_theirs.detach()]
    try:
        report.sendall(json.dumps({"template": "base"}).encode("ascii"))  # the report plugin's settings
    finally:
        report.close()
    helper, reply = _spawn(job, control, stdio, key, socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET))
    if reply.get("event") == "ready":
        return helper
    _kill(helper)
    return None


def _spawn(job: dict[str, Any], control: socket.socket, stdio: list[int], key: str,
           pair: tuple[socket.socket, socket.socket]) -> tuple[_Helper, dict[str, Any]]:
    """Fork a template or a base (the zygote's child that runs `job` up to its fork point), with
    `stdio` (closed here) and the second end of `pair` as its channel; it and its first word."""
    ours, theirs = pair
    config = zygote.prebuilt_config(job)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        ours.detach()
        _template(job, control, stdio, theirs, config)
    theirs.close()
    for fd in stdio:
        os.close(fd)
    return _Helper(pid, ours, key=key), _first_word(ours, pid, time.monotonic() + float(job["timeout_s"]))


def _first_word(channel: socket.socket, pid: int, deadline: float) -> dict[str, Any]:
    """The template's first message, or why there is none."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return {"detail": "the template was not ready in time"}
        if select.select([channel], [], [], min(left, 0.05))[0]:
            data = channel.recv(zygote.MAX_MESSAGE)
            if not data:
                return {"detail": "the template process ended before its fork point"}
            return json.loads(data)
        if zygote.exited(pid):
            return {"detail": "the template process ended before its fork point"}


def _template(job: dict[str, Any], control: socket.socket, stdio: list[int], channel: socket.socket,
              config: Any) -> None:
    """Become the template process (a fork of the zygote): the job's command up to its fork point.
    It stays non-dumpable and keeps the zygote's CPU-seconds and process limits. Never returns."""
    global _FORK_CHANNEL
    code = zygote.SETUP_FAILED
    try:
        control.detach()
        (fd,) = zygote.become_job({**job, "rlimits": _template_limits(job)}, stdio, [channel.detach()], close_others=True)
        zygote.prctl(zygote.PR_SET_DUMPABLE, 0)
        _FORK_CHANNEL = socket.socket(fileno=fd)
        if config is not None:
            zygote.hand_over(config)
    except BaseException:
        os._exit(code)
    code = zygote.run_module(job["module"], job["args"])
    if not _FORKED:  # the command ended without reaching its fork point
        try:
            zygote.send(_FORK_CHANNEL, {"event": "ended", "exit_code": code})
        except OSError:
            pass
    os._exit(code)


def fork_point(problem: str | None = None) -> None:
    """Called by a job's own code in a template process (see the zygote's docstring): says the
    template is ready, then forks one process per templated job the zygote asks for, and returns
    only in those, each set up as its job. With `problem`, says the template cannot serve and
    exits. RuntimeError outside a template process."""
    global _FORK_CHANNEL, _FORKED
    channel = _FORK_CHANNEL
    if channel is None:
        raise RuntimeError("fork_point() called outside a template process")
    if problem is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        zygote.send(channel, {"event": "ended", "detail": problem})
        os._exit(0)
    _serve(_ready(channel), _fork_job)
    _FORK_CHANNEL, _FORKED = None, True  # a job's process, from here on


def base_point() -> dict[str, Any]:
    """Called by a job's own code in a base process (see `_from_base`): as `fork_point`, but forks
    a template per request, set up as one (and with a channel of its own to the zygote), and
    returns in it the request (its "paths": the task's own arguments)."""
    if _FORK_CHANNEL is None:
        raise RuntimeError("base_point() called outside a base process")
    _serve(_ready(_FORK_CHANNEL), _fork_template)
    return _TEMPLATE_REQUEST


def _ready(channel: socket.socket) -> socket.socket:
    """A template or base at its fork point: its output to nowhere (nobody reads it any more), its
    heap frozen, and ready said."""
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    for target in (1, 2):
        os.dup2(null, target)
    os.close(null)
    gc.collect()
    gc.freeze()
    zygote.send(channel, {"event": "ready"})
    return channel


def _fork_template(request: dict[str, Any], fds: list[int]) -> bool:
    """In a base: fork a task's template (`fds`: stdout, stderr, report channel, its channel to the
    zygote, its ready pipe)."""
    def become() -> None:
        global _FORK_CHANNEL, _TEMPLATE_REQUEST
        assert _FORK_CHANNEL is not None
        os.close(_FORK_CHANNEL.detach())
        ready, channel = zygote.become_job(request, fds[:3], [fds[4], fds[3]], close_others=False)
        zygote.prctl(zygote.PR_SET_DUMPABLE, 0)
        _FORK_CHANNEL, _TEMPLATE_REQUEST = socket.socket(fileno=channel), request
        zygote.say_ready(ready)

    return _fork_through(fds, become)


def _fork_job(request: dict[str, Any], fds: list[int]) -> bool:
    """In the template: fork a job's process, set up as the job."""
    def become() -> None:
        assert _FORK_CHANNEL is not None
        os.close(_FORK_CHANNEL.detach())
        stdio, extra = fds[:request["stdio"]], fds[request["stdio"]:]
        ready, *companion = zygote.become_job(request, stdio, extra, close_others=False)
        if request.get("companion") is not None:
            os.environ[zygote.COMPANION_ENV] = ",".join(map(str, [*companion, request["companion"]]))
        zygote.say_ready(ready)

    return _fork_through(fds, become)


def templated(job: dict[str, Any], stdio: list[int], extra: list[int], companion: int | None) -> None:
    """Have the template fork the job's process (`extra[0]`: its ready pipe, which gets its pid)."""
    if _TEMPLATE is None or _TEMPLATE.key != job["template"]:
        raise zygote.Broken(f"the job asks for template {job['template']}, the zygote holds {template()}")
    request = {"cwd": job["cwd"], "env": job["env"], "rlimits": job["rlimits"], "stdio": len(stdio),
               "companion": companion}
    _ask(_TEMPLATE, request, stdio + extra)
