"""Templates and companions for the zygote (zygote.py): forks that are not plain jobs.

Not imported by tidal: shipped beside the zygote as the harness file `tidal_zygote_forks.py`, which
the zygote imports when it is there (the pool and `python_tests` ship it); pytest_template.py calls
`fork_point` in a template. It may use only the standard library and the zygote itself (imported as
`tidal_zygote`, the name the running zygote gives itself). The protocol and the guarantees are in
the zygote's docstring.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import resource
import select
import signal
import socket
import sys
import time
from typing import Any

import tidal_zygote as zygote

TEMPLATE_REPLY_S = 10.0  # how long a template may take to fork a job


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


# ----------------------------------------------------------------------------- companions


class Companion:
    """A job's companion process (module docstring): forked here, reaped here; `theirs` are the
    job's ends (its socket and the status pipe)."""

    def __init__(self, job: dict[str, Any], stdio: list[int], control: socket.socket) -> None:
        ours, theirs = socket.socketpair()
        self.status_read, self.status_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.status_read)
            os.close(self.status_write)
            theirs.detach()
            _companion(job, control, stdio, ours)
        ours.close()
        self.socket = theirs
        self.theirs = [theirs.fileno(), self.status_read]
        self.reported = False

    def handed_over(self) -> None:
        """The job's child has its ends: close ours."""
        self.socket.close()
        os.close(self.status_read)
        self.theirs = []

    def report(self, exclude: set[int], job: int) -> None:
        """The companion has exited: reap it and tell the job how it ended and what it left."""
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


def _companion(job: dict[str, Any], control: socket.socket, stdio: list[int], channel: socket.socket) -> None:
    """Become the job's companion (a fork of the zygote) and call its function. Never returns."""
    code = zygote.SETUP_FAILED
    try:
        control.detach()
        spec = job["companion"]
        drop = tuple(spec.get("env_drop", ())) + ("TIDAL_",)
        harness = os.path.dirname(os.path.abspath(__file__))
        env = {name: value for name, value in job["env"].items() if not name.startswith(drop)}
        env["PYTHONPATH"] = os.pathsep.join(path for path in env.get("PYTHONPATH", "").split(os.pathsep)
                                            if path and os.path.abspath(path) != harness)
        module, _, name = str(spec["call"]).partition(":")
        function = getattr(__import__(module, fromlist=["_"]), name)
        (fd,) = zygote.become_job({**job, "env": env}, stdio[:2], [channel.detach()], close_others=True)
        sys.path[:] = [job["cwd"], *(path for path in sys.path[1:] if os.path.abspath(path) != harness)]
        for loaded in [loaded for loaded in sys.modules if loaded not in zygote.BASE_MODULES]:
            del sys.modules[loaded]  # as in a fresh interpreter, they import anew (and are seen doing it)
    except BaseException:
        os._exit(code)
    try:
        code = zygote.run_main(lambda: function(fd))
    finally:
        os._exit(code)


# ----------------------------------------------------------------------------- templates


@dataclasses.dataclass
class _Template:
    """The zygote's view of its template process."""

    key: str
    pid: int
    channel: socket.socket
    state: dict[str, Any] | None = None  # its attributes a fork inherits, once it is ready


_TEMPLATE: _Template | None = None
_FORK_CHANNEL: socket.socket | None = None  # in a template process: its end of the zygote's socket
_FORKED = False  # in a job forked from a template


def _process_state(pid: int) -> tuple[dict[str, Any], str]:
    """What a fork of process `pid` inherits that another process of the same user can change, and
    its run state ('T': stopped)."""
    with open(f"/proc/{pid}/stat", "rb") as file:
        data = file.read()
    attributes = {
        "rlimits": {name: resource.prlimit(pid, number) for name, number in zygote.RLIMITS.items()},
        "nice": os.getpriority(os.PRIO_PROCESS, pid),
        "affinity": sorted(os.sched_getaffinity(pid)),
        "scheduler": os.sched_getscheduler(pid),
    }
    return attributes, data[data.rindex(b")") + 2:].split()[0].decode()


def _drop_template(reaped: bool = False) -> None:
    """Forget the template; kill it unless it was reaped already (its pid may be reused by now)."""
    global _TEMPLATE
    template, _TEMPLATE = _TEMPLATE, None
    if template is None:
        return
    template.channel.close()
    if not reaped:
        try:
            os.kill(template.pid, signal.SIGKILL)
            os.waitpid(template.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def check_template(reaped: set[int]) -> None:
    """After a job: drop a template that died, stopped or was changed (the host starts another)."""
    template = _TEMPLATE
    if template is None:
        return
    if template.pid in reaped:
        _drop_template(reaped=True)
        return
    try:
        attributes, run_state = _process_state(template.pid)
    except (OSError, ValueError):
        attributes, run_state = {}, "gone"
    if template.state is None and run_state not in ("T", "t", "gone"):
        template.state = attributes  # first check, right after it became ready
    if run_state in ("T", "t", "gone") or attributes != template.state:
        _drop_template()


def open_template(job: dict[str, Any], fds: list[int], control: socket.socket, protected: set[int]) -> dict[str, Any]:
    """Start a template process for `job` (replacing any other) and wait until it is ready."""
    global _TEMPLATE
    _drop_template()
    config = zygote.prebuilt_config(job)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        ours.detach()
        _template(job, control, fds, theirs, config)
    theirs.close()
    for fd in fds:
        os.close(fd)
    fds.clear()
    reply = _await(ours, pid, time.monotonic() + float(job["timeout_s"]))
    _TEMPLATE = _Template(str(job["key"]), pid, ours)
    ready = reply.get("event") == "ready"
    if not ready:
        _drop_template()
    detail = "" if ready else str(reply.get("detail") or f"it exited with {reply.get('exit_code')}")
    return {"event": "template", "ready": ready, "detail": detail,
            "reaped": zygote.sweep(protected | ({pid} if ready else set()))}


def _await(channel: socket.socket, pid: int, deadline: float) -> dict[str, Any]:
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
        limits = {name: value for name, value in job["rlimits"].items() if name not in ("cpu", "nproc")}
        (fd,) = zygote.become_job({**job, "rlimits": limits}, stdio, [channel.detach()], close_others=True)
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
    """Called by a job's own code in a template process (see the module docstring): says the
    template is ready, then forks one process per templated job the zygote asks for, and returns
    only in those, each set up as its job. With `problem`, says the template cannot serve and exits.
    RuntimeError outside a template process."""
    global _FORK_CHANNEL, _FORKED
    channel = _FORK_CHANNEL
    if channel is None:
        raise RuntimeError("fork_point() called outside a template process")
    sys.stdout.flush()
    sys.stderr.flush()
    if problem is not None:
        zygote.send(channel, {"event": "ended", "detail": problem})
        os._exit(0)
    null = os.open(os.devnull, os.O_WRONLY)  # nobody reads the template's own output once it is ready
    for target in (1, 2):
        os.dup2(null, target)
    os.close(null)
    gc.collect()
    gc.freeze()
    zygote.send(channel, {"event": "ready"})
    while True:
        try:
            message, fds, flags, _ = socket.recv_fds(channel, zygote.MAX_MESSAGE, 8)
        except OSError:
            os._exit(0)
        if not message or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            os._exit(0)
        request = json.loads(message)
        pid = _fork_job(request, fds, channel)
        if pid is None:
            _FORK_CHANNEL, _FORKED = None, True
            return
        try:
            zygote.send(channel, {"event": "forked", "pid": pid})
        except OSError:
            os._exit(0)


def _fork_job(request: dict[str, Any], fds: list[int], channel: socket.socket) -> int | None:
    """In the template: fork the job's process through a middle process that exits at once, so the
    job's process is reparented to the zygote (the nearest subreaper); its pid, or None in it."""
    stdio, extra = fds[:request["stdio"]], fds[request["stdio"]:]
    pid_read, pid_write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(pid_read)
            child = os.fork()
        except BaseException:
            os._exit(1)
        if child == 0:
            try:
                os.close(pid_write)
                os.close(channel.detach())
                ready, *companion_fds = zygote.become_job(request, stdio, extra, close_others=False)
                if request.get("companion") is not None:
                    os.environ[zygote.COMPANION_ENV] = ",".join(map(str, [*companion_fds, request["companion"]]))
                os.write(ready, b"1")
                os.close(ready)
            except BaseException:
                os._exit(zygote.SETUP_FAILED)
            return None
        try:
            os.write(pid_write, str(child).encode())
        finally:
            os._exit(0)
    os.close(pid_write)
    for fd in fds:
        os.close(fd)
    os.waitpid(middle, 0)
    with os.fdopen(pid_read, "rb") as pipe:
        data = pipe.read()
    return int(data) if data else -1


def templated(job: dict[str, Any], stdio: list[int], extra: list[int], companion: int | None) -> int:
    """Ask the template for the job's process; its pid (the zygote's child by now)."""
    template = _TEMPLATE
    if template is None or template.key != job["template"]:
        raise zygote.Broken(f"the job asks for template {job['template']}, the zygote holds {template and template.key}")
    request = {"cwd": job["cwd"], "env": job["env"], "rlimits": job["rlimits"], "stdio": len(stdio),
               "companion": companion}
    try:
        socket.send_fds(template.channel, [json.dumps(request).encode()], stdio + extra)
        if not select.select([template.channel], [], [], TEMPLATE_REPLY_S)[0]:
            raise zygote.Broken("the template did not fork the job in time")
        reply = json.loads(template.channel.recv(zygote.MAX_MESSAGE) or b"{}")
    except (OSError, ValueError) as error:
        raise zygote.Broken(f"the template is gone ({error})") from error
    pid = reply.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        raise zygote.Broken(f"the template could not fork the job: {reply}")
    return pid




def template() -> tuple[str, int] | None:
    """The zygote's template: (key, pid), or None."""
    return (_TEMPLATE.key, _TEMPLATE.pid) if _TEMPLATE is not None else None
