"""The candidate side of `python_tests`' out_of_process mode: imports the answer's module and runs
its functions on request, replying with data only.

Not imported by tidal: shipped as the harness file `tidal_candidate_server.py`. In a zygote it is
the job's companion (`serve`: forked before the job's pytest process exists, it waits on its socket
for the start message {"module", "workspace", "tests"}, which the report plugin sends once the
tests are collected and deleted from disk); alone, the report plugin starts it then (`python -B
tidal_candidate_server.py <fd> <module> <workspace> <test paths as JSON>`). Standard library and
tidal_function_proxy (the wire codec) only. It runs the answer, so nothing here is trusted; what
the answer cannot do is reach the test process (separate, non-dumpable, with a report channel it
never had) or the tests (gone from disk before it started). The audit findings it sends are
advisory: an answer can suppress its own, and any it sends only count against it.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
import traceback

TYPE_CHECKING = False
if TYPE_CHECKING:  # no `typing` at run time: see the zygote's imports
    from typing import Any

import tidal_function_proxy as wire

# Modules of the test framework and the harness: no answer has a reason to import them.
FRAMEWORK = ("pytest", "_pytest", "pluggy", "tidal_pytest_report", "tidal_function_proxy",
             "tidal_candidate_server", "tidal_zygote")
MAX_FINDINGS = 20
FRAME_READS = {"f_code", "tb_frame", "gi_frame", "__code__", "__globals__"}
HARNESS = os.path.dirname(os.path.abspath(__file__)) + "/"


class Audit:
    """Records the answer's attempts to read the tests or import the test framework."""

    def __init__(self, test_paths: list[str]) -> None:
        self.tests = {os.path.realpath(path) for path in test_paths}
        self.test_names = {os.path.basename(path) for path in test_paths}
        self.findings: list[str] = []
        self.busy = False

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if self.busy or len(self.findings) >= MAX_FINDINGS or event not in (
                "open", "import", "sys._getframe", "object.__getattr__"):
            return
        self.busy = True
        try:
            if event == "open" and isinstance(args[0], (str, bytes)):
                path = os.fsdecode(args[0])
                if os.path.realpath(path) in self.tests or os.path.basename(path) in self.test_names:
                    self.findings.append(f"opened the test file {path}")
            elif event == "import" and (str(args[0]).split(".")[0] in FRAMEWORK or str(args[0]).startswith("tidal_")):
                self.findings.append(f"imported {args[0]}")
            elif event == "sys._getframe" and args[0].f_code.co_filename.startswith(HARNESS):
                self.findings.append(f"took the frame of the harness's {args[0].f_code.co_name}")
            elif event == "object.__getattr__" and args[1] in FRAME_READS:
                frame = getattr(args[0], "tb_frame", args[0])
                code = getattr(frame, "f_code", None) or getattr(frame, "__code__", None)
                if code is not None and code.co_filename.startswith(HARNESS):
                    self.findings.append(f"read {args[1]} of the harness's {code.co_name}")
        except Exception:  # noqa: BLE001, S110 - an audit hook must never fail the operation it watches
            pass
        finally:
            self.busy = False

    def take(self) -> list[str]:
        found, self.findings = self.findings, []
        return found


def _error(error: BaseException, audit: Audit) -> dict[str, Any]:
    message = str(error)[:wire.MESSAGE_CAP]
    audit.busy = True  # formatting the traceback reads this server's frames: not the answer's doing
    try:
        trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    except Exception as failure:  # noqa: BLE001 - the answer's exception may break formatting
        trace = f"(no traceback: {type(failure).__name__})"
    finally:
        audit.busy = False
    return {"type": type(error).__name__, "message": message, "traceback": trace[-wire.TRACEBACK_CAP:]}


def _reply(channel: socket.socket, audit: Audit, message: dict[str, Any]) -> None:
    findings = audit.take()
    if findings:
        message["audit"] = findings
    wire.send(channel, message)


def main(argv: list[str]) -> int:
    fd, module_name, workspace, test_paths = int(argv[0]), argv[1], argv[2], json.loads(argv[3])
    return _serve(socket.socket(fileno=fd), module_name, workspace, test_paths)


def serve(fd: int) -> int:
    """A zygote's companion: the start message, then as `main`."""
    channel = socket.socket(fileno=fd)
    try:
        start = wire.receive(channel)
    except (wire.ProtocolError, OSError):
        return 1
    if start is None:
        return 0  # the tests never got as far as calling the answer
    return _serve(channel, str(start["module"]), str(start["workspace"]), [str(path) for path in start["tests"]])


def _serve(channel: socket.socket, module_name: str, workspace: str, test_paths: list[str]) -> int:
    os.set_inheritable(channel.fileno(), False)
    sys.path[0] = workspace  # where `python solution.py`'s imports would look; not the harness folder
    sys.argv = [module_name]
    audit = Audit(test_paths)
    sys.addaudithook(audit)
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - SystemExit and KeyboardInterrupt end the process: the proxy sees how
        _reply(channel, audit, {"error": _error(error, audit)})
        return 1
    _reply(channel, audit, {"ready": True})
    while True:
        request = wire.receive(channel)
        if request is None or request.get("op") == "exit":
            return 0
        reply: dict[str, Any] = {"id": request.get("id")}
        try:
            function = getattr(module, str(request["name"]))
            result = function(*wire.decode(request["args"]), **wire.decode(request["kwargs"]))
            reply["ok"] = wire.encode(result)
        except BaseException as error:  # noqa: BLE001 - the test sees it; a sys.exit() in a call fails that call
            reply["error"] = _error(error, audit)
        _reply(channel, audit, reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
