"""pytest plugin that runs INSIDE the sandbox and reports each test to the scoring harness.

Not imported by tidal: `python_tests` ships this file's text to the sandbox's harness folder as
`tidal_pytest_report.py` and loads it with `-p tidal_pytest_report`, so it is registered before
any test module, and so before any candidate code, is imported. It may use only the standard
library and pytest.

Channel: the socket whose fd is in $TIDAL_REPORT_FD (see tidal.sandbox.base). The harness sends a
random nonce and shuts its side for writing; the plugin reads the nonce at load, then writes one
JSON line per event, each carrying the nonce. A line without it is a forgery. The verdict of a
test phase is taken from `call.excinfo` in the outermost `pytest_runtest_makereport` wrapper,
before any other hook could rewrite the report.

Candidate code runs in this same process and could, with effort, reach the nonce in memory; the
plugin also reports late plugin registrations and replaced pytest internals, which the harness
counts as tampering. See docs/design/sandbox.md, "What a candidate can still do".
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

import pytest

LONGREPR_CAP = 2000


def _open_channel() -> tuple[socket.socket | None, str]:
    raw = os.environ.pop("TIDAL_REPORT_FD", None)
    if raw is None:
        return None, ""
    fd = int(raw)
    os.set_inheritable(fd, False)  # child processes of the tests do not get the channel
    channel = socket.socket(fileno=fd)
    chunks = []
    while True:
        chunk = channel.recv(4096)
        if not chunk:
            break
        chunks.append(chunk)
    return channel, b"".join(chunks).decode("ascii", errors="replace")


OWN_HOOKS = ("pytest_plugin_registered", "pytest_collectreport", "pytest_collection_finish",
             "pytest_runtest_makereport", "pytest_sessionfinish")


def _guarded() -> dict[str, Any]:
    """The pytest internals a verdict depends on, and this plugin's own functions."""
    import _pytest.python
    import _pytest.reports
    import _pytest.runner

    own = sys.modules.get(__name__)
    reporter = getattr(own, "_reporter", None)
    return {
        **{f"plugin.{name}": getattr(own, name, None) for name in OWN_HOOKS},
        "plugin.Reporter.emit": _Reporter.__dict__.get("emit"),
        "plugin.reporter.emit": vars(reporter).get("emit") if reporter is not None else None,
        "runner.call_and_report": _pytest.runner.call_and_report,
        "runner.runtestprotocol": _pytest.runner.runtestprotocol,
        "runner.call_runtest_hook": getattr(_pytest.runner, "call_runtest_hook", None),
        "runner.pytest_runtest_call": _pytest.runner.pytest_runtest_call,
        "runner.CallInfo.from_call": _pytest.runner.CallInfo.__dict__.get("from_call"),
        "python.Function.runtest": _pytest.python.Function.runtest,
        "python.pytest_pyfunc_call": _pytest.python.pytest_pyfunc_call,
        "reports.TestReport.from_item_and_call": _pytest.reports.TestReport.__dict__.get("from_item_and_call"),
    }


def _changed(snapshot: dict[str, Any]) -> list[str]:
    current = _guarded()
    return [name for name, value in snapshot.items() if current.get(name) is not value]


def _file_of(plugin: Any) -> str:
    file = getattr(plugin, "__file__", None)
    if file is None:
        module = sys.modules.get(type(plugin).__module__)
        file = getattr(module, "__file__", None)
    return os.path.abspath(file) if file else ""


class _Reporter:
    def __init__(self) -> None:
        self.channel, self.nonce = _open_channel()
        self.snapshot: dict[str, Any] = {}  # taken at pytest_configure, before any test module is imported
        self.flagged: set[str] = set()

    def emit(self, event: str, **fields: Any) -> None:
        if self.channel is None:
            return
        line = json.dumps({"nonce": self.nonce, "event": event, **fields}) + "\n"
        try:
            self.channel.sendall(line.encode("utf-8", errors="replace"))
        except OSError:
            self.channel = None  # the channel was closed under us; the missing events will show

    def check_internals(self) -> None:
        for name in _changed(self.snapshot) if self.snapshot else []:
            if name not in self.flagged:
                self.flagged.add(name)
                self.emit("tamper", detail=f"{name} was replaced")


_reporter = _Reporter()
_reporter.emit("start", cwd=os.getcwd())


def pytest_configure(config: Any) -> None:
    _reporter.snapshot = _guarded()


def pytest_plugin_registered(plugin: Any, manager: Any) -> None:
    _reporter.emit("plugin", file=_file_of(plugin))


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _reporter.emit("collect_error", nodeid=report.nodeid, longrepr=str(report.longrepr)[-LONGREPR_CAP:])


def pytest_collection_finish(session: Any) -> None:
    _reporter.emit("collected", nodeids=[item.nodeid for item in session.items])


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    excinfo = call.excinfo
    exception = excinfo.typename if excinfo is not None else None
    xfail = item.get_closest_marker("xfail") is not None
    report = yield
    _reporter.check_internals()
    longrepr = ""
    if excinfo is not None:
        longrepr = str(getattr(report, "longreprtext", "") or "")[-LONGREPR_CAP:]
    _reporter.emit("phase", nodeid=item.nodeid, when=call.when, ok=excinfo is None,
                   exception=exception, xfail=xfail, longrepr=longrepr)
    return report


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    _reporter.check_internals()
    _reporter.emit("finish", exitstatus=int(exitstatus))
