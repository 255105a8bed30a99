"""The test side of `python_tests`' out_of_process mode: a stand-in for the answer's module whose
functions run in a separate candidate process, with values crossing only as data.

Not imported by tidal: shipped as the harness file `tidal_function_proxy.py`; the report plugin
imports it in the pytest process, and the candidate server (candidate_server.py) for the wire
codec only. Standard library only. Why: in process, the answer shares memory with the tests and
the plugin, so it can return objects that compare equal to anything, read the caller's frames,
patch pytest or find the report nonce. Here `sys.modules[<module>]` is a `ProxyModule`; `f(*args)`
encodes the arguments, sends them over a socket pair to the candidate process and decodes the
reply into fresh builtin objects. An exception comes back as its type name and message, raised as
a `CandidateError` that also subclasses the builtin of that name (`pytest.raises(ValueError)`
works). Nothing the candidate sends is unpickled or executed. Wire: 4-byte big-endian length +
UTF-8 JSON, values tagged (see `encode`) so tuples, non-string dict keys, sets, bytes and ranges
survive the trip.
"""

from __future__ import annotations

import builtins
import json
import math
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import types

# No `typing` at run time (the candidate side imports this module in the companions' nursery: see
# the zygote's imports). Nothing here is imported late: in the test process a late import looks
# in the workspace first, where the answer's process writes, and `PlantedModuleGuard` (below)
# refuses a module planted there as tampering.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

MAX_MESSAGE = 16 * 1024 * 1024  # bytes of one message; a larger reply is a protocol error
MAX_ITEMS = 100_000  # items taken from an iterator the answer returns
MAX_DEPTH = 200  # nesting of one value
MESSAGE_CAP = 2000  # characters of an exception message kept
TRACEBACK_CAP = 4000
STOP_S = 1.0  # how long the candidate may take to exit when asked
# pytest leaves this module's frames out of a failing test's traceback: the answer's own traceback
# is in the error's message, and formatting these frames (pytest parses their source) costs more
# than the rest of a failing test's report.
__tracebackhide__ = True
REAPED_S = 10.0  # how long a zygote may take to say how a companion it reaped ended


class ProtocolError(Exception):
    """A message that is not what the protocol allows (too big, malformed, an unknown tag)."""


class Unsupported(TypeError):
    """A value the tests pass that cannot cross the process boundary: the task's tests need
    in_process mode. Raised on the test side, never because of the answer."""


# ----------------------------------------------------------------------------- codec


def encode(value: Any, depth: int = 0) -> Any:
    """`value` as JSON-ready data: None, bool, int, float, str, lists and one-key tag objects.
    Subclasses of builtin types are encoded as their base type (an int subclass with a custom
    __eq__ arrives as a plain int). Raises `Unsupported` for anything else."""
    if depth > MAX_DEPTH:
        raise Unsupported(f"a value nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return str.__str__(value) if isinstance(value, str) else value
    if isinstance(value, int):
        return int.__index__(value) if type(value) is not bool else value
    if isinstance(value, float):
        number = float.__float__(value)
        return number if math.isfinite(number) else {"f": repr(number)}
    if isinstance(value, complex):
        return {"c": [encode(value.real), encode(value.imag)]}
    if isinstance(value, (bytes, bytearray)):
        return {"b" if isinstance(value, bytes) else "ba": bytes(value).hex()}
    if isinstance(value, range):
        return {"r": [value.start, value.stop, value.step]}
    if isinstance(value, list):
        return [encode(item, depth + 1) for item in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"t": [encode(item, depth + 1) for item in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(value)]}
    if isinstance(value, frozenset):
        return {"fs": [encode(item, depth + 1) for item in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"s": [encode(item, depth + 1) for item in set.__iter__(value)]}
    views = {type({}.keys()): "dk", type({}.values()): "dv", type({}.items()): "di"}
    if type(value) in views:
        return {views[type(value)]: [encode(item, depth + 1) for item in value]}
    if isinstance(value, types.GeneratorType) or type(value).__name__.endswith("iterator") or isinstance(
            value, (map, filter, zip, enumerate, reversed)):
        items = []
        for item in value:
            if len(items) >= MAX_ITEMS:
                raise Unsupported(f"an iterator of more than {MAX_ITEMS} items")
            items.append(encode(item, depth + 1))
        return {"it": items}
    raise Unsupported(f"a {type(value).__module__}.{type(value).__qualname__} cannot cross the process "
                      "boundary (only None, bool, int, float, complex, str, bytes, list, tuple, dict, set, "
                      "frozenset, range and iterators of those)")


def decode(data: Any, depth: int = 0) -> Any:
    """The value `encode` produced, built from builtin types only; `ProtocolError` otherwise."""
    if depth > MAX_DEPTH:
        raise ProtocolError("value nested too deep")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode(item, depth + 1) for item in data]
    if type(data) is not dict or len(data) != 1:
        raise ProtocolError(f"not a value: {type(data).__name__}")
    (tag, body), = data.items()
    try:
        if tag == "f" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "c":
            real, imag = (decode(part, depth + 1) for part in body)
            return complex(float(real), float(imag))
        if tag in ("b", "ba"):
            raw = bytes.fromhex(body)
            return raw if tag == "b" else bytearray(raw)
        if tag == "r":
            start, stop, step = (int(part) if type(part) is int else None for part in body)
            return range(start, stop, step)  # type: ignore[arg-type]
        items = [decode(item, depth + 1) for item in body] if type(body) is list else None
        if items is None:
            raise ProtocolError(f"tag {tag!r} without a list")
        if tag == "t":
            return tuple(items)
        if tag == "d":
            return {key: value for key, value in items}
        if tag == "s":
            return set(items)
        if tag == "fs":
            return frozenset(items)
        if tag == "dk":
            return dict.fromkeys(items).keys()
        if tag == "dv":
            return dict(enumerate(items)).values()
        if tag == "di":
            return dict(items).items()
        if tag == "it":
            return iter(items)
    except ProtocolError:
        raise
    except (TypeError, ValueError) as error:  # unhashable keys, bad hex, wrong arity
        raise ProtocolError(f"bad {tag!r} value: {error}") from error
    raise ProtocolError(f"unknown tag {tag!r}")


def send(channel: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message, allow_nan=False).encode("utf-8", errors="surrogatepass")
    channel.sendall(struct.pack(">I", len(data)) + data)


def receive(channel: socket.socket, deadline: float | None = None) -> dict[str, Any] | None:
    """One message; None at end of stream; `TimeoutError` past `deadline` (monotonic)."""
    header = _read(channel, 4, deadline)
    if header is None:
        return None
    (size,) = struct.unpack(">I", header)
    if size > MAX_MESSAGE:
        raise ProtocolError(f"a message of {size} bytes (cap {MAX_MESSAGE})")
    body = _read(channel, size, deadline)
    if body is None:
        raise ProtocolError("the stream ended inside a message")
    try:
        message = json.loads(body.decode("utf-8", errors="surrogatepass"))
    except (ValueError, RecursionError) as error:
        raise ProtocolError(f"malformed message: {type(error).__name__}") from error
    if type(message) is not dict:
        raise ProtocolError("a message must be an object")
    return message


def _read(channel: socket.socket, size: int, deadline: float | None) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([channel], [], [], left)[0]:
                raise TimeoutError
        chunk = channel.recv(min(size - got, 1 << 20))
        if not chunk:
            if got:
                raise ProtocolError("the stream ended inside a message")
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# ----------------------------------------------------------------------------- remote errors


class CandidateError(Exception):
    """An exception raised by the answer in its own process (or the process failing), re-raised
    in the test. `remote_type` is the answer's exception type name."""

    remote_type = ""


_ERRORS: dict[str, type[CandidateError]] = {}


def remote_error(type_name: str, message: str) -> CandidateError:
    """A `CandidateError` that is also the builtin exception `type_name` when there is one (so
    `pytest.raises(KeyError)` works), named like it so reports read naturally."""
    base = getattr(builtins, type_name, None)
    cls = _ERRORS.get(type_name)
    if cls is None:
        cls = CandidateError
        if isinstance(base, type) and issubclass(base, Exception) and base is not Exception:
            try:
                cls = type(type_name, (CandidateError, base), {"__module__": "builtins"})
                cls("probe")
            except TypeError:  # a builtin that needs special arguments (UnicodeDecodeError, ...)
                cls = CandidateError
        _ERRORS[type_name] = cls
    error = cls(message)
    error.remote_type = type_name
    return error


# ----------------------------------------------------------------------------- the candidate process


class Companion:
    """The answer's process when a zygote forked it (its companion, see the zygote's docstring), as
    much of a `subprocess.Popen` as `CandidateProcess` uses. Not this process's child: the zygote
    reaps it and writes its wait status, and the processes that outlived it, on `status_fd`."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid, self.status_fd = pid, status_fd
        self.returncode: int | None = None
        self.left: list[tuple[int, str]] = []  # processes that outlived it (they were its, or its children's)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        limit = REAPED_S if timeout is None else timeout
        if not select.select([self.status_fd], [], [], limit)[0]:
            raise subprocess.TimeoutExpired(f"the answer's process {self.pid}", limit)
        chunks = []
        while chunk := os.read(self.status_fd, 65536):
            chunks.append(chunk)
        os.close(self.status_fd)
        try:
            message = json.loads(b"".join(chunks) or b"{}")
            status = int(message["status"])
            self.left = [(int(pid), str(name)) for pid, name in message.get("left", [])]
        except (ValueError, KeyError, TypeError):
            status = signal.SIGKILL  # the zygote said nothing: it ended the sandbox's processes
        self.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return self.returncode


class CandidateProcess:
    """The answer's module, imported in a separate process, called by name.

    Started once the tests are collected (and deleted from disk), so the answer never runs while
    the tests exist anywhere it can read. One process per session: once it has died or timed out,
    every later call fails. `on_event(kind, **fields)` is how findings reach the report.
    `companion` (socket fd, status fd, pid): a process a zygote forked for this, waiting for its
    start message; without it, a fresh interpreter runs `server`."""

    def __init__(self, server: str, module: str, workspace: str, call_timeout_s: float, test_paths: list[str],
                 on_event: Callable[..., None], import_timeout_s: float | None = None,
                 companion: tuple[int, ...] | None = None) -> None:
        self.server, self.module, self.workspace = server, module, workspace
        self.call_timeout_s, self.test_paths, self.on_event = call_timeout_s, test_paths, on_event
        # The import is bounded like in process, by the run's own clock: a slow start is not a slow answer.
        self.import_timeout_s = import_timeout_s or call_timeout_s
        self.companion = companion
        self.process: subprocess.Popen[bytes] | Companion | None = None
        self.channel: socket.socket | None = None
        self.failure: CandidateError | None = None  # set once the process cannot serve calls
        self.calls = 0
        self.lock = threading.Lock()

    @property
    def left(self) -> list[tuple[int, str]]:
        """Processes that outlived a companion (a Popen's are this process's own descendants)."""
        return list(getattr(self.process, "left", []))

    def start(self) -> None:
        if self.companion is not None:
            sock, status, pid = self.companion
            self.process, self.channel = Companion(pid, status), socket.socket(fileno=sock)
            os.set_inheritable(sock, False)
            os.set_inheritable(status, False)
            try:
                send(self.channel, {"module": self.module, "workspace": self.workspace, "tests": self.test_paths})
            except OSError as error:
                self._stop("exited", f"the answer's process is gone ({error})", "start")
                return
        else:
            self._spawn()
            if self.channel is None:
                return
        reply = self._exchange(None, "import", self.import_timeout_s)
        if reply is not None and "ready" not in reply:
            self._fail_with(reply)

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        harness = os.path.dirname(self.server)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDAL_", "PYTEST_"))}
        env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                            if p and os.path.abspath(p) != harness)
        argv = [sys.executable, "-B", self.server, str(theirs.fileno()), self.module, self.workspace,
                json.dumps(self.test_paths)]
        try:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, cwd=self.workspace, env=env,
                                            pass_fds=(theirs.fileno(),), start_new_session=True)
        except OSError as error:
            ours.close()
            self.failure = remote_error("OSError", f"the answer's process could not start: {error}")
            self.on_event("candidate", status="start_failed", detail=str(error))
            return
        finally:
            theirs.close()
        self.channel = ours

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            request = {"op": "call", "name": name, "args": encode(list(args)), "kwargs": encode(kwargs)}
        except (Unsupported, RecursionError) as error:
            self.on_event("unsupported", detail=f"{self.module}.{name}() was called with {error}")
            raise Unsupported(f"{self.module}.{name}(): the test passes {error}; this task needs "
                              "verifier mode in_process") from None
        with self.lock:
            if self.failure is not None:
                raise self.failure.with_traceback(None)
            self.calls += 1
            request["id"] = self.calls
            reply = self._exchange(request, f"{self.module}.{name}()")
            if reply is None:
                assert self.failure is not None
                raise self.failure.with_traceback(None)
            if reply.get("id") != self.calls:
                self._stop("protocol", f"a reply to call {reply.get('id')!r} came for call {self.calls}")
                raise self.failure.with_traceback(None)  # type: ignore[misc]
            if "ok" in reply:
                try:
                    return decode(reply["ok"])
                except (ProtocolError, RecursionError) as error:
                    self._stop("protocol", f"the reply to {name}() is not a value: {error}")
                    raise self.failure.with_traceback(None) from None  # type: ignore[misc]
            raise self._error_of(reply)

    def _exchange(self, request: dict[str, Any] | None, what: str, limit_s: float | None = None) -> dict[str, Any] | None:
        """Send `request` (None: just wait for the first message) and return the reply; on
        death, timeout or garbage, stop the process and return None (`self.failure` says why)."""
        assert self.channel is not None
        limit_s = limit_s or self.call_timeout_s
        deadline = time.monotonic() + limit_s
        try:
            if request is not None:
                send(self.channel, request)
            reply = receive(self.channel, deadline)
        except TimeoutError:
            self._stop("timeout", f"{what} ran past the {limit_s:g}s {'call ' if request else ''}limit")
            return None
        except (ProtocolError, OSError) as error:
            self._stop("protocol", f"{what}: {error}")
            return None
        if reply is None:
            self._stop("exited", f"the answer's process ended during {what}", what)
            return None
        for finding in reply.pop("audit", None) or []:
            self.on_event("tamper", detail=f"answer process: {str(finding)[:300]}")
        return reply

    def _error_of(self, reply: dict[str, Any]) -> CandidateError:
        error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        type_name = str(error.get("type", "Exception"))[:100]
        message = str(error.get("message", ""))[:MESSAGE_CAP]
        trace = str(error.get("traceback", ""))[-TRACEBACK_CAP:]
        return remote_error(type_name, f"{message}\n(raised in the answer's process)\n{trace}".rstrip())

    def _fail_with(self, reply: dict[str, Any]) -> None:
        """The import failed: every call raises the import's error."""
        self.failure = self._error_of(reply)
        self.on_event("candidate", status="import_error", exception=self.failure.remote_type,
                      detail=str(self.failure)[:500])
        self._stop(None, "")

    def _stop(self, status: str | None, detail: str, what: str = "") -> None:
        """End the process and record how it ended. `status` None: asked to exit (it may finish
        its atexit steps; only the process itself is killed if it does not, so what it leaves
        running is found by the plugin's process scan); otherwise its whole group is killed."""
        process, channel = self.process, self.channel
        self.channel = None
        if channel is not None:
            try:
                channel.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            channel.close()
        code: int | None = None
        if process is not None:
            try:
                code = process.wait(STOP_S if status in (None, "exited") else 0.0)
            except subprocess.TimeoutExpired:
                code = None
            kills = (os.kill,) if status is None else (os.killpg, os.kill)
            for kill in kills:
                try:
                    kill(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if code is None:
                try:
                    code = process.wait()
                except subprocess.TimeoutExpired:
                    code = None
        if status is None:
            return
        if status == "exited":
            if code == 0:
                self.on_event("tamper", detail=f"the answer's process exited with status 0 during {what}")
            detail += f" (exit status {code})" if code is not None and code >= 0 else f" (signal {-(code or 0)})"
        if self.failure is None:
            self.failure = remote_error("TimeoutError" if status == "timeout" else "CandidateError", detail)
        self.on_event("candidate", status=status, exit_code=code, detail=detail)

    def close(self) -> None:
        """Ask the process to exit (its atexit steps and non-daemon threads run), then kill it."""
        if self.channel is not None:
            try:
                send(self.channel, {"op": "exit"})
            except OSError:
                pass
        self._stop(None, "")


class PlantedModuleGuard:
    """In the test process, once the tests are collected: a module that appears in a writable
    folder of its import path (the workspace, say) is candidate code; importing it is refused, and
    `tamper` says so (the report plugin's `tamper`)."""

    def __init__(self, tamper: Callable[[str], None]) -> None:
        self.tamper = tamper
        self.before = {d: set(os.listdir(d)) for d in {os.path.abspath(p or ".") for p in sys.path}
                       if os.path.isdir(d) and os.access(d, os.W_OK)}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if path is not None:
            return
        for folder, before in self.before.items():
            try:
                planted = [e for e in os.listdir(folder) if e.split(".")[0] == name and e not in before]
            except OSError:
                continue
            if planted:
                self.tamper(f"the answer planted {os.path.join(folder, planted[0])} on the tests' import path")
                raise ImportError(f"{name} was planted by the answer")


class ProxyModule(types.ModuleType):
    """Stands in for the answer's module in the test process: every attribute is a function that
    calls the answer's function of that name in the candidate process."""

    def __init__(self, name: str, get_candidate: Callable[[], CandidateProcess]) -> None:
        super().__init__(name, f"the answer's module {name}, running in its own process")
        self.__dict__["_get_candidate"] = get_candidate

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        get_candidate = self.__dict__["_get_candidate"]
        module = self.__name__

        def remote(*args: Any, **kwargs: Any) -> Any:
            return get_candidate().call(attribute, args, kwargs)

        remote.__name__ = remote.__qualname__ = attribute
        remote.__module__ = module
        return remote
