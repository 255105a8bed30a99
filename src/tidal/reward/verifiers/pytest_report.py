"""pytest plugin that runs INSIDE the sandbox and reports each test to the scoring harness.

PYTEST_DONT_REWRITE (a zygote imports this module before pytest could rewrite it; it has no asserts)

Not imported by tidal: `python_tests` ships it as the harness file `tidal_pytest_report.py` and
loads it with `-p tidal_pytest_report`, so it is registered before any test module (and any
candidate code) is imported; importing it does nothing until pytest registers it, so a zygote can
preload it. Standard library, pytest, tidal_function_proxy and tidal_pytest_template only. It reads
its settings (nonce, mode, test paths, ...) from the report channel ($TIDAL_REPORT_FD), then writes
one JSON line per event, each with the nonce; the verdict of a test phase is `call.excinfo` in the
outermost `pytest_runtest_makereport` wrapper, before any other hook could rewrite the report. It
makes the process non-dumpable and the child subreaper, and watches candidate code with an audit
hook. Out of process and template mode, and what in-process code can still do: docs/design/
sandbox.md ("`python_tests`", "Templates and companions", "What a candidate can still do").
"""

from __future__ import annotations

import atexit
import ctypes
import json
import linecache
import os
import signal
import socket
import sys
import threading
import types
from typing import Any

import pytest

LONGREPR_CAP = 2000
EXCEPTION_GROUPS: tuple[type, ...] = tuple(t for t in [getattr(sys.modules["builtins"], "BaseExceptionGroup", None)] if t)
# pytest's internals for the report of a failed test (`pytest_runtest_makereport_line`); an image's pytest may lack them.
try:
    from _pytest._code import code as _code
    from _pytest.outcomes import OutcomeException
    _FORMATTER = getattr(_code, "ExceptionInfoFormatter", None) or getattr(_code, "FormattedExcinfo", None)
except ImportError:
    _code, _FORMATTER = None, None  # type: ignore[assignment]
MAX_FINDINGS = 20
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
FRAMEWORK = ("pytest", "_pytest", "pluggy", "tidal_pytest_report", "tidal_function_proxy",
             "tidal_candidate_server", "tidal_zygote")
FRAME_READS = {"f_code", "tb_frame", "gi_frame", "cr_frame", "ag_frame", "gi_code", "__code__", "__globals__"}
STACK_EVENTS = {"gc.get_referrers", "gc.get_referents", "gc.get_objects", "sys._current_frames",
                "sys.settrace", "sys.setprofile"}


def _open_channel() -> tuple[socket.socket | None, dict[str, Any]]:
    raw = os.environ.pop("TIDAL_REPORT_FD", None)
    if raw is None:
        return None, {"nonce": ""}
    fd = int(raw)
    os.set_inheritable(fd, False)  # child processes of the tests do not get the channel
    channel = socket.socket(fileno=fd)
    chunks = []
    while True:
        chunk = channel.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
    text = b"".join(chunks).decode("ascii", errors="replace")
    try:
        settings = json.loads(text)
    except ValueError:
        settings = None
    return channel, settings if isinstance(settings, dict) else {"nonce": text}


def _libc_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up once, when the plugin is imported (in a zygote, before anything forks), so that each
# answer's process calls it without loading libc's symbol and building its wrapper again.
_PRCTL = _libc_prctl()


def _prctl(option: int, value: int) -> bool:
    return _PRCTL is not None and _PRCTL(option, value, 0, 0, 0) == 0


OWN_HOOKS = ("pytest_plugin_registered", "pytest_collection", "pytest_collectreport", "pytest_collection_finish",
             "pytest_runtestloop", "pytest_runtest_protocol", "pytest_runtest_makereport", "pytest_sessionfinish")


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
        self.channel, self.settings = _open_channel()
        self.harnessed = self.channel is not None  # run by python_tests, not by a plain pytest call
        self.nonce = str(self.settings.get("nonce", ""))
        self.cwd = os.getcwd()  # the workspace (the same path in a template and its answers' processes)
        self.snapshot: dict[str, Any] = {}  # taken at pytest_configure, before any test module is imported
        self.flagged: set[str] = set()
        # A template holds its events back: each answer's process sends them with its own nonce.
        self.held: list[dict[str, Any]] | None = [] if self.settings.get("template") else None

    def emit(self, event: str, **fields: Any) -> None:
        self.emit_all([{"event": event, **fields}])

    def emit_all(self, events: list[dict[str, Any]]) -> None:
        """Send `events` in one write (or hold them back, in a template)."""
        if self.held is not None:
            self.held.extend(events)
            return
        if self.channel is None:
            return
        lines = "".join(json.dumps({"nonce": self.nonce, **event}) + "\n" for event in events)
        try:
            self.channel.sendall(lines.encode("utf-8", errors="replace"))
        except OSError:
            self.channel = None  # the channel was closed under us; the missing events will show

    def bind(self) -> list[dict[str, Any]]:
        """In an answer's process forked from the template: its own channel, settings and nonce
        (the settings must be the template's but for the nonce); the events held back."""
        if self.channel is not None:
            self.channel.detach()  # that fd number is this process's own channel by now
        template = {key: value for key, value in self.settings.items() if key != "template"}
        self.channel, self.settings = _open_channel()
        if {key: value for key, value in self.settings.items() if key != "nonce"} != template:
            raise RuntimeError(f"the answer's settings {self.settings} are not its template's {template}")
        self.nonce = str(self.settings.get("nonce", ""))
        held, self.held = self.held or [], None
        return held

    def rebase(self) -> None:
        """In a template forked from a base: its own channel and settings (a template's)."""
        if self.channel is not None:
            self.channel.detach()  # that fd number is this process's own channel by now
        self.channel, self.settings = _open_channel()
        if self.settings.get("template") is not True:
            raise RuntimeError(f"a base forked a template whose settings are {self.settings}")
        self.cwd = os.getcwd()

    def tamper(self, detail: str) -> None:
        if detail not in self.flagged and len(self.flagged) < 100:
            self.flagged.add(detail)
            self.emit("tamper", detail=detail)

    def check_internals(self) -> None:
        for name in _changed(self.snapshot) if self.snapshot else []:
            self.tamper(f"{name} was replaced")


class _Audit:
    """The audit hook: reports (and for test files, refuses) what candidate code does to the
    tests. Code counts as the candidate's when its file is not a test, pytest, harness or standard
    library file (the answer's module, anything it wrote, code it compiled from a string).

    Out of process no code of the answer runs in this process, so frame and stack events here are
    pytest's (and the tests') own: only opens and imports are watched (the answer's process has an
    audit hook of its own), which spares a stack walk for each of the many frame reads pytest makes
    when it reports a failure."""

    def __init__(self, reporter: _Reporter, tests: list[str], frames: bool = True) -> None:
        self.reporter = reporter
        self.events = frozenset({"open", "import", *(("sys._getframe", "object.__getattr__", *STACK_EVENTS)
                                                     if frames else ())})
        self.tests = {os.path.realpath(path) for path in tests}
        self.test_files = set()  # (device, inode): a link to a test file is the test file
        for path in self.tests:
            try:
                info = os.stat(path)
                self.test_files.add((info.st_dev, info.st_ino))
            except OSError:
                pass
        site = os.path.dirname(os.path.dirname(os.path.abspath(pytest.__file__)))
        harness = os.path.dirname(os.path.abspath(__file__))
        self.trusted = tuple(p.rstrip("/") + "/" for p in (site, harness))
        self.neutral = tuple(p.rstrip("/") + "/" for p in {os.path.dirname(os.__file__), sys.base_prefix, sys.prefix})
        self.kinds: dict[str, str] = {}
        self.busy: set[int] = set()
        self.findings = 0
        # While a test runs: the frame that called its protocol. It and the frames below it are the
        # session's own loop (pytest, the harness), older than any candidate code in this thread.
        self.boundary: types.FrameType | None = None

    def kind(self, filename: str) -> str:
        """'harness' (tests, pytest, this plugin), 'neutral' (the standard library) or 'candidate'."""
        kind = self.kinds.get(filename)
        if kind is None:
            path = os.path.realpath(filename) if filename.startswith("/") else filename
            if path in self.tests or path.startswith(self.trusted):
                kind = "harness"
            elif path.startswith(self.neutral) or filename.startswith("<frozen "):
                kind = "neutral"
            else:
                kind = "candidate"
            self.kinds[filename] = kind
        return kind

    def candidate_caller(self) -> str | None:
        """The file of the nearest candidate frame on the stack, if any (down to `boundary`)."""
        frame = sys._getframe(2)
        boundary = self.boundary  # another thread's stack never reaches it: walked whole
        while frame is not None and frame is not boundary:
            filename = frame.f_code.co_filename
            if self.kind(filename) == "candidate":
                return f"{filename}:{frame.f_lineno}"
            frame = frame.f_back
        return None

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in self.events:
            return
        me = threading.get_ident()
        if me in self.busy or self.findings >= MAX_FINDINGS:
            return
        self.busy.add(me)
        refuse = ""
        try:
            what = self.target(event, args)
            if what:
                caller = self.candidate_caller()
                if caller:
                    self.findings += 1
                    self.reporter.tamper(f"{caller} {what}")
                    refuse = what if event == "open" else ""
        except Exception:  # noqa: BLE001, S110 - an audit hook must never fail the operation it watches
            pass
        finally:
            self.busy.discard(me)
        if refuse:
            raise PermissionError(f"the answer may not read the tests ({refuse})")

    def is_test(self, path: str | bytes) -> bool:
        try:
            info = os.stat(path)
        except (OSError, ValueError):
            return os.path.realpath(os.fsdecode(path)) in self.tests
        return (info.st_dev, info.st_ino) in self.test_files

    def target(self, event: str, args: tuple[Any, ...]) -> str:
        """What the event reaches that belongs to the tests or the harness ('' when nothing)."""
        if event == "open":
            path = args[0]
            if isinstance(path, (str, bytes)) and self.is_test(path):
                return f"opened the test file {os.fsdecode(path)}"
        elif event == "import":
            if str(args[0]).split(".")[0] in FRAMEWORK or str(args[0]).startswith("tidal_"):  # any harness module
                return f"imported {args[0]}"
        elif event == "sys._getframe":
            frame = args[0]
            if isinstance(frame, types.FrameType) and self.kind(frame.f_code.co_filename) == "harness":
                return f"took the frame of {frame.f_code.co_name} ({frame.f_code.co_filename})"
        elif event == "object.__getattr__":
            obj, name = args[0], args[1]
            if name in FRAME_READS:
                code = getattr(obj, "__code__", None) if isinstance(obj, types.FunctionType) else None
                frame = obj if isinstance(obj, types.FrameType) else getattr(obj, "tb_frame", None) \
                    if isinstance(obj, types.TracebackType) else None
                code = code or (frame.f_code if isinstance(frame, types.FrameType) else None)
                if code is not None and self.kind(code.co_filename) == "harness":
                    return f"read {name} of {code.co_name} ({code.co_filename})"
        elif event in STACK_EVENTS:
            return f"called {event}"
        return ""


def _descendants(root: int) -> list[tuple[int, str]]:
    """Live processes below `root` (pid, name), from /proc; zombies are left out."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
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
            children.setdefault(int(parent), []).append(int(entry))
            names[int(entry)] = data[data.index(b"(") + 1:close].decode(errors="replace")
    found, pending = [], list(children.get(root, []))
    while pending:
        pid = pending.pop()
        found.append((pid, names.get(pid, "?")))
        pending.extend(children.get(pid, []))
    return found


_reporter: _Reporter = None  # type: ignore[assignment]  # set when pytest registers the plugin
_TESTS: list[str] = []
_candidate: Any = None
_audit: _Audit | None = None


def _start() -> _Reporter:
    """What loading the plugin does, once: read the settings; in a session of its own (not a
    template or a base), start watching at once."""
    global _reporter
    if _reporter is not None:
        return _reporter
    _reporter = _Reporter()
    if _reporter.settings.get("template") != "base":  # a base learns its task in each template (`_take_task`)
        _take_task()
    if _reporter.held is None:
        _watch()
    return _reporter


def _take_task() -> None:
    """The task's tests, and the stand-in for the answer's module the tests import."""
    global _TESTS
    _TESTS = [os.path.abspath(str(path)) for path in _reporter.settings.get("tests", [])]
    module = str(_reporter.settings.get("module", ""))
    if _reporter.settings.get("mode") == "out_of_process":
        import tidal_function_proxy

        def _get_candidate() -> Any:
            if _candidate is None:
                raise RuntimeError("the tests called the answer before collection finished; use mode in_process")
            return _candidate

        sys.modules[module] = tidal_function_proxy.ProxyModule(module, _get_candidate)
    elif _reporter.held is not None:
        import tidal_pytest_template

        sys.modules[module] = tidal_pytest_template.stub(module)


def _watch() -> None:
    """The start of a session: the `start` event, non-dumpable, subreaper, the audit hook."""
    global _audit
    _reporter.emit("start", cwd=_reporter.cwd, mode=str(_reporter.settings.get("mode", "in_process")))
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _audit = _Audit(_reporter, _TESTS, frames=_reporter.settings.get("mode") != "out_of_process")
    sys.addaudithook(_audit)


def _hide_tests() -> None:
    """out_of_process, once collected: the tests out of reach (their source kept for tracebacks)."""
    for path in _TESTS:
        try:
            with open(path, encoding="utf-8") as file:
                lines = file.readlines()
            linecache.cache[path] = (sum(map(len, lines)), None, lines, path)  # None: never rechecked
            os.remove(path)
        except OSError:
            pass


def _start_candidate() -> None:
    """out_of_process: tests out of reach, the import path guarded, then the answer's process."""
    global _candidate
    import tidal_function_proxy

    _hide_tests()
    sys.meta_path.insert(0, tidal_function_proxy.PlantedModuleGuard(_reporter.tamper))  # type: ignore[arg-type]
    companion = os.environ.pop("TIDAL_COMPANION", None)
    server = os.path.join(os.path.dirname(os.path.abspath(tidal_function_proxy.__file__)), "tidal_candidate_server.py")
    _candidate = tidal_function_proxy.CandidateProcess(
        server, str(_reporter.settings["module"]), os.getcwd(), float(_reporter.settings.get("call_timeout_s", 5.0)),
        _TESTS, _reporter.emit, float(_reporter.settings.get("timeout_s", 0)) or None,
        companion=tuple(int(part) for part in companion.split(",")) if companion else None)
    _candidate.start()


def pytest_addoption(parser: Any, pluginmanager: Any) -> None:
    _start()  # called when pytest registers the plugin (a historic hook)


def pytest_configure(config: Any) -> None:
    _start().snapshot = _guarded()


def pytest_plugin_registered(plugin: Any, manager: Any) -> None:
    # Only plugins from the workspace matter to the harness (a conftest the task did not ship);
    # the others (pytest's own, the harness's) are not worth a report line each.
    file = _file_of(plugin)
    if file.startswith(_start().cwd.rstrip("/") + "/"):
        _reporter.emit("plugin", file=file)


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: Any) -> None:
    if _reporter.settings.get("template") == "base":  # forked from here, one template per task
        import tidal_pytest_template

        tidal_pytest_template.from_base(session, _reporter)
        _take_task()


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _reporter.emit("collect_error", nodeid=report.nodeid, longrepr=str(report.longrepr)[-LONGREPR_CAP:])


def pytest_collection_finish(session: Any) -> None:
    if _reporter.held is not None:
        return  # a template: each answer's process says what it collected (`_bind`)
    _reporter.emit("collected", nodeids=[item.nodeid for item in session.items])
    if _reporter.settings.get("mode") == "out_of_process":
        _start_candidate()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtestloop(session: Any) -> Any:
    if _reporter.held is not None:  # a template: forked from here, one process per answer
        import tidal_pytest_template

        tidal_pytest_template.serve(session, _reporter)
        tidal_pytest_template.bind(session, _reporter, _watch)
        _reporter.emit("collected", nodeids=[item.nodeid for item in session.items])
        if _reporter.settings.get("mode") == "out_of_process":
            _start_candidate()
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        # pytest's own loop stops here too, but with `session.Interrupted`: a KeyboardInterrupt, of
        # which the terminal reporter keeps a long report (it parses the whole module of each of
        # the traceback's frames: most of what a session with a collection error costs). `Failed`
        # ends the session the same way, before any test runs, with exit status 1 (tests failed)
        # instead of 2, and no report of its own; the collection errors are reported as they were
        # (`pytest_collectreport`).
        count = session.testsfailed
        raise session.Failed(f"{count} error{'s' if count != 1 else ''} during collection")
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    """Bound the audit hook's stack walks while a test runs: what called the test's protocol, and
    everything below, is the session's loop (a protocol run from within a test keeps the outer
    bound, so candidate code between them is still walked)."""
    outer = _audit is not None and _audit.boundary is None
    if outer:
        _audit.boundary = sys._getframe(1)  # type: ignore[union-attr]
    try:
        return (yield)
    finally:
        if outer:
            _audit.boundary = None  # type: ignore[union-attr]


def _crash_line(report: Any) -> str:
    """"path:line: message" of where the exception was raised (pytest's crash line), path relative
    to the workspace; "" when pytest has none."""
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is None:
        return ""
    path = str(crash.path).removeprefix(_reporter.cwd.rstrip("/") + "/")
    return f"{path}:{crash.lineno}: {str(crash.message).splitlines()[0] if crash.message else ''}\n"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    excinfo = call.excinfo
    exception = excinfo.typename if excinfo is not None else None
    xfail = item.get_closest_marker("xfail") is not None
    report = yield
    _reporter.check_internals()
    longrepr = ""
    if excinfo is not None:
        longrepr = (_crash_line(report) + str(getattr(report, "longreprtext", "") or ""))[-LONGREPR_CAP:]
    _reporter.emit("phase", nodeid=item.nodeid, when=call.when, ok=excinfo is None,
                   exception=exception, xfail=xfail, longrepr=longrepr)
    return report


@pytest.hookimpl(tryfirst=True, specname="pytest_runtest_makereport")
def pytest_runtest_makereport_line(item: Any, call: Any) -> Any:
    """The report of a test function whose call failed, as pytest's own with `--tb=line`, without
    the work that style throws away: pytest finds the frames of the traceback it would show (the
    path of each frame above the test, looked up on disk) and formats each, to print
    only the exception. Anything else (set-up
    and tear-down, other styles, skips, `pytest.fail`, chained exceptions, unittest cases, a test
    whose own frame is hidden) is left to pytest; None passes the call on."""
    excinfo = call.excinfo
    if (excinfo is None or _FORMATTER is None or call.when != "call" or type(item) is not pytest.Function
            or item.config.getoption("tbstyle", "auto") != "line" or item.config.getoption("fulltrace", False)):
        return None
    try:
        value = excinfo.value
        if (not isinstance(excinfo, _code.ExceptionInfo)
                or isinstance(value, (OutcomeException, *EXCEPTION_GROUPS, RecursionError))
                or value.__cause__ is not None or (value.__context__ is not None and not value.__suppress_context__)):
            return None
        test_code = getattr(getattr(item, "obj", None), "__code__", None)
        entries = reversed(excinfo.traceback)  # the test's frame is among the last
        if not any(entry.frame.code.raw is test_code and not entry.ishidden(excinfo) for entry in entries):
            return None  # pytest would say that every entry is hidden
        crash = excinfo._getreprcrash()
        if crash is None:
            return None
        lines = _FORMATTER(style="line").get_exconly(excinfo, indent=4)
        entry = _code.ReprEntry(lines, None, None, None, "line")
        longrepr = _code.ExceptionChainRepr([(_code.ReprTraceback([entry], None, style="line"), crash, None)])
    except Exception:  # noqa: BLE001 - other internals, or an exception that does not print: pytest's own
        return None
    sections = [(f"Captured {key} {when}", content) for when, key, content in item._report_sections]
    return pytest.TestReport(item.nodeid, item.location, dict.fromkeys(item.keywords, 1), "failed", longrepr,
                             call.when, sections, call.duration, call.start, call.stop,
                             user_properties=item.user_properties)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    _reporter.check_internals()
    left: list[tuple[int, str]] = []
    if _candidate is not None:
        _candidate.close()
        left = [(pid, name) for pid, name in _candidate.left if os.path.exists(f"/proc/{pid}")]
    left += _descendants(os.getpid())
    if left:
        _reporter.tamper(f"processes left running at the end of the session: "
                         f"{', '.join(f'{pid} ({name})' for pid, name in left[:5])}")
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    _reporter.emit("finish", exitstatus=int(exitstatus))
    if _reporter.harnessed:
        _end(int(exitstatus))


def _end(status: int) -> None:
    """End the process once the session's end is reported, as the interpreter's exit (and the
    zygote's `run_main`) would: the threads that are not daemons joined, the atexit functions run,
    the standard streams flushed; but without what nobody reads or needs: the terminal summary,
    the plugins' unconfigure steps, the interpreter's finalization (bench/RESULTS.md, "Sandbox
    pool"). An atexit function can still change the exit status, which python_tests compares with
    the `finish` event's."""
    for step in (threading._shutdown, atexit._run_exitfuncs, lambda: sys.stdout.flush(),  # type: ignore[attr-defined]
                 lambda: sys.stderr.flush()):
        try:
            step()
        except BaseException:  # noqa: BLE001, S110 - as the interpreter's exit does: nothing stops it
            pass
    os._exit(status)
