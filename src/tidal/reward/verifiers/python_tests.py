"""The `python_tests` verifier: the answer's code against the task's hidden tests, under pytest,
in the sandbox.

The answer's last code block becomes `entrypoint` (default solution.py) in a fresh workspace, then
the task's files and tests are written over it (a test wins a name clash). pytest runs with the
report plugin (pytest_report.py), which streams every test phase over the private report channel,
each line tagged with a per-run nonce. The score comes from that stream and from the test files
(parsed here: a test that vanished counts as failed), never from stdout or the exit code alone;
value = passed / total. Changed test or task files, planted configuration, a report line without
the nonce and every other tamper signal (tamper_scan.py, the plugin's audit hook) are `tampered`.
Verifier args: `mode` (`auto`, `in_process`, `out_of_process`; process_mode.py), `call_timeout_s`,
`traceback` (pytest's `--tb`, default `line`), `entrypoint`, `test_order`. `python_tests_batch`
scores one task's answers as jobs of a zygote (batch.py). The outcomes, in order, and every rule:
docs/design/sandbox.md, "`python_tests`: from one pytest run to a score".
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from tidal import pyast
from tidal.errors import SandboxUnavailableError
from tidal.reward.base import (
    ScoringContext,
    check_answer,
    failed,
    format_failed,
    task_problem,
    verifier,
)
from tidal.reward.verifiers.process_mode import (
    MODES,
    choose_mode,
    out_of_process_problems,
    template_problems,
)
from tidal.reward.verifiers.tamper_scan import scan_answer
from tidal.sandbox.base import (
    BatchBackend,
    BatchJob,
    SandboxResult,
    SandboxStatus,
    safe_relative_path,
)
from tidal.sandbox.batch import (
    FORKS_FILE,
    FORKS_SOURCE,
    Base,
    Companion,
    Template,
    ZygoteJob,
)
from tidal.types import Outcome, Score, Task

PLUGIN_MODULE = "tidal_pytest_report"
# Output capture off: nothing reads a test's output (the verdicts come from the report channel), so
# pytest's capture of each test phase to a temporary file would cost every job CPU for nothing.
PYTEST_OPTIONS = ("-p", "no:cacheprovider", "-q", "--color=no", "--capture=no", "-o", "addopts=", "--rootdir=.")
# pytest's --tb styles a task may pick (verifier arg `traceback`). The default, `line`: a failing
# test's evidence is its exception and the line that raised it (pytest's crash line, which the
# report plugin puts first); quoting source costs every failed test CPU (`bench/sandbox.py --traceback`).
TRACEBACKS = ("line", "short", "long", "native")
PLUGIN_SOURCE = (Path(__file__).parent / "pytest_report.py").read_text(encoding="utf-8")
HARNESS_FILES = {
    f"{PLUGIN_MODULE}.py": PLUGIN_SOURCE,
    "tidal_pytest_template.py": (Path(__file__).parent / "pytest_template.py").read_text(encoding="utf-8"),
    "tidal_function_proxy.py": (Path(__file__).parent / "function_proxy.py").read_text(encoding="utf-8"),
    "tidal_candidate_server.py": (Path(__file__).parent / "candidate_server.py").read_text(encoding="utf-8"),
    FORKS_FILE: FORKS_SOURCE,  # a zygote's templates and companions
}
# What a batch's zygote imports once: pytest, the plugins every session loads (pytest's
# `default_plugins`) and what they import when configured, and the harness's own modules (importing
# them does nothing); the candidate server only in the companions' nursery (zygote.py). A name this
# pytest lacks only costs time.
PRELOAD = ("pytest", *(f"_pytest.{name}" for name in (
    "mark", "main", "runner", "fixtures", "helpconfig", "python", "terminal", "debugging", "unittest", "capture",
    "skipping", "legacypath", "tmpdir", "monkeypatch", "recwarn", "pastebin", "assertion", "junitxml", "doctest",
    "cacheprovider", "setuponly", "setupplan", "stepwise", "unraisableexception", "threadexception", "warnings",
    "logging", "reports", "faulthandler", "subtests", "_argcomplete")), "pdb", "readline", "faulthandler",
    "tidal_function_proxy", PLUGIN_MODULE, "tidal_pytest_template", "companion:tidal_candidate_server")
# The answer's process out of process, in a zygote: forked from it, not a fresh interpreter.
CANDIDATE = Companion("tidal_candidate_server:serve", env_drop=("PYTEST_",))
# Files whose appearance in the workspace during a run changes how pytest or Python behaves.
RISKY_NAMES = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
               "sitecustomize.py", "usercustomize.py"}
MAX_WALK = 20_000  # workspace entries inspected after a run
FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
PYTHON_FENCES = {"", "python", "py", "python3"}
_DECODER = json.JSONDecoder()


def extract_code(answer: str) -> str:
    """The last ```python (or plain ```) block; the last block of any language if there is no
    such block; the text after an unclosed fence; else the whole answer."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in FENCE.finditer(answer)]
    python_blocks = [code for language, code in blocks if language in PYTHON_FENCES]
    if python_blocks:
        return python_blocks[-1]
    if blocks:
        return blocks[-1][1]
    opening = re.search(r"^[ \t]*```[^\n]*\n", answer, re.MULTILINE)
    if opening:  # cut off before the closing fence (e.g. at max_new_tokens)
        return answer[opening.end():]
    return answer


def pytest_targets(tests: dict[str, str]) -> list[str]:
    """The test modules pytest is pointed at: test_*.py / *_test.py, else every .py but conftest."""
    modules = [name for name in tests if name.endswith(".py") and PurePosixPath(name).name != "conftest.py"]
    named = [n for n in modules if re.fullmatch(r"test_.*\.py|.*_test\.py", PurePosixPath(n).name)]
    return sorted(named or modules)


def defined_test_ids(path: str, source: str) -> list[str]:
    """Node ids (without parameters) of the tests a module defines, the way pytest names them."""
    tree = pyast.parse(source, filename=path)
    assert isinstance(tree, ast.Module)
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found.append(f"{path}::{node.name}")
        elif isinstance(node, ast.ClassDef):
            is_case = any((isinstance(b, ast.Name) and b.id.endswith("TestCase"))
                          or (isinstance(b, ast.Attribute) and b.attr.endswith("TestCase")) for b in node.bases)
            methods = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if not (node.name.startswith("Test") or is_case):
                continue
            if not is_case and any(m.name == "__init__" for m in methods):
                continue  # pytest does not collect it either
            found += [f"{path}::{node.name}::{m.name}" for m in methods if m.name.startswith("test")]
    return found


def _digest(path: Path) -> str | None:
    """sha256 of a regular file; None for anything else (missing, link, fifo, folder)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass
class Protected:
    """The task's files as written, to compare with what the workspace holds after the run."""

    hashes: dict[str, str]
    names: set[str] = field(default_factory=set)
    removable: set[str] = field(default_factory=set)  # the harness deletes these (out_of_process tests)

    @classmethod
    def of(cls, files: dict[str, str | bytes], exclude: str, removable: set[str] | None = None) -> Protected:
        hashes = {}
        for name, content in files.items():
            if name != exclude:
                data = content.encode("utf-8") if isinstance(content, str) else content
                hashes[name] = hashlib.sha256(data).hexdigest()
        return cls(hashes, set(files), set(removable or ()))

    def inspect(self, workspace: Path) -> list[str]:
        """What the run changed that it must not have. Runs after every sandboxed process is gone."""
        findings = []
        for name, digest in sorted(self.hashes.items()):
            found = _digest(workspace / name)
            if found != digest and not (name in self.removable and not os.path.lexists(workspace / name)):
                findings.append(f"{name} was changed or deleted" if name not in self.removable
                                else f"{name} was re-created after the harness deleted it")
        seen = 0
        for folder, dirs, names in os.walk(workspace):
            for name in names:
                seen += 1
                relative = os.path.relpath(os.path.join(folder, name), workspace)
                risky = name in RISKY_NAMES or name.endswith(".pth")
                if risky and relative not in self.names:
                    findings.append(f"{relative} was created")
            if seen > MAX_WALK:
                break
        return findings


@dataclass
class Report:
    """The plugin's event stream, checked against the nonce."""

    events: list[dict[str, Any]]
    forged: int
    by_kind: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for event in self.events:
            self.by_kind.setdefault(str(event.get("event")), []).append(event)

    @classmethod
    def parse(cls, data: bytes, nonce: str, truncated: bool) -> Report:
        events, forged = [], 0
        lines = data.split(b"\n")
        if truncated and lines:
            lines = lines[:-1]  # cut mid-line by the cap
        for line in lines:
            if not line.strip():
                continue
            try:
                event = _DECODER.decode(line.decode("utf-8"))
            except ValueError:  # UnicodeDecodeError is one
                forged += 1
                continue
            if not isinstance(event, dict) or not hmac.compare_digest(str(event.get("nonce", "")), nonce):
                forged += 1
                continue
            events.append(event)
        return cls(events, forged)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return list(self.by_kind.get(kind, ()))


def _plugin_files(report: Report, allowed: set[str]) -> list[str]:
    """Plugins registered from the workspace that are not the task's own conftest files."""
    starts = report.of("start")
    cwd = str(starts[0].get("cwd", "")) if starts else ""
    findings = []
    for event in report.of("plugin"):
        file = str(event.get("file", ""))
        if cwd and file.startswith(cwd.rstrip("/") + "/"):
            relative = file[len(cwd.rstrip("/")) + 1:]
            if relative not in allowed:
                findings.append(f"a pytest plugin was registered from {relative}")
    return findings


def _inconsistencies(report: Report) -> list[str]:
    """Events the plugin never sends: repeats, or results for tests pytest did not collect. Candidate
    code that found the plugin's emitter in memory and added passes of its own shows up here."""
    findings = [f"the report has {len(report.of(kind))} {kind!r} events" for kind in ("start", "collected", "finish")
                if len(report.of(kind)) > 1]
    collected = {str(n) for e in report.of("collected") for n in e.get("nodeids", [])}
    seen: set[tuple[str, str]] = set()
    for event in report.of("phase"):
        key = (str(event.get("nodeid")), str(event.get("when")))
        if key in seen or key[0] not in collected:
            findings.append(f"the report has an unexpected {key[1]} result for {key[0]}")
            break
        seen.add(key)
    return findings


def _test_verdicts(report: Report, defined: list[str]) -> tuple[list[str], dict[str, str]]:
    """Every test that counts, and why each one that did not pass failed ('' = passed)."""
    collected = [str(n) for e in report.of("collected") for n in e.get("nodeids", [])]
    covered = {n.split("[", 1)[0] for n in collected}
    total = collected + [n for n in defined if n not in covered]
    phases: dict[str, dict[str, dict[str, Any]]] = {}
    for event in report.of("phase"):
        phases.setdefault(str(event.get("nodeid")), {})[str(event.get("when"))] = event
    reasons: dict[str, str] = {}
    for nodeid in total:
        seen = phases.get(nodeid, {})
        setup, call, teardown = seen.get("setup"), seen.get("call"), seen.get("teardown")
        if not seen:
            reasons[nodeid] = "did not run"
        elif any(p.get("xfail") for p in seen.values()):
            reasons[nodeid] = "marked xfail"
        elif setup is None or not setup.get("ok"):
            reasons[nodeid] = f"setup: {setup.get('exception') if setup else 'missing'}"
        elif call is None or not call.get("ok"):
            reasons[nodeid] = str(call.get("exception")) if call else "call missing"
        elif teardown is not None and not teardown.get("ok"):
            reasons[nodeid] = f"teardown: {teardown.get('exception')}"
        else:
            reasons[nodeid] = ""
    return total, reasons


def _exit_signals(result: SandboxResult, report: Report) -> list[str]:
    """Exits only candidate code makes: status 0 before the session finished (pytest never does
    that; sys.exit(0)/os._exit(0) from the answer does, at import or in a test), or a status that is
    not the one pytest finished with (an atexit hook rewriting it)."""
    if result.status is not SandboxStatus.OK or not report.of("start"):
        return []
    finishes = report.of("finish")
    if not finishes and result.exit_code == 0:
        return ["the process exited with status 0 before pytest finished the session (an exit from the answer)"]
    if finishes and result.exit_code != finishes[-1].get("exitstatus"):
        return [(f"the process exited with status {result.exit_code}, pytest finished with "
                 f"{finishes[-1].get('exitstatus')} (an exit from the answer after the tests)")]
    return []


def verdict(result: SandboxResult, report: Report, defined: list[str], allowed_conftests: set[str], task: Task,
            static: list[str] | None = None, mode: str = "in_process") -> Score:
    """The score of one run, following the outcome order in the module docstring. `static`: the
    findings of the static scan of the answer (tamper_scan.py)."""
    info: dict[str, Any] = {"exit_code": result.exit_code, "wall_s": round(result.wall_s, 3), "mode": mode}
    tamper = [f"static: {finding}" for finding in static or []]
    tamper += [f"{report.forged} report line(s) without the harness nonce"] if report.forged else []
    tamper += [str(e.get("detail")) for e in report.of("tamper")]
    tamper += list(result.after_value or [])
    tamper += _plugin_files(report, allowed_conftests)
    tamper += _inconsistencies(report)
    tamper += _exit_signals(result, report)
    tamper = list(dict.fromkeys(tamper))
    if not report.of("start"):
        if tamper:
            info["tamper"] = tamper[:20]
            return Score(0.0, Outcome.TAMPERED, {"tests": 0.0}, "; ".join(tamper[:5]), info)
        return Score(0.0, Outcome.INFRA_ERROR, {}, f"task {task.id}: pytest did not start in the sandbox "
                     f"({result.status.value}{', ' + result.detail if result.detail else ''}): "
                     f"{result.stderr_text[-1000:].strip()}", info)
    unsupported = report.of("unsupported")
    if unsupported and not tamper:
        return task_problem(task, f"out_of_process: {unsupported[0].get('detail')}; set verifier mode: in_process")

    total, reasons = _test_verdicts(report, defined)
    if not total:
        return task_problem(task, "its test files define no tests")
    failing = [n for n in total if reasons[n]]
    passed = len(total) - len(failing)
    info.update(passed=passed, total=len(total), failing=[f"{n} ({reasons[n]})" for n in failing[:20]])
    if tamper:
        info["tamper"] = tamper[:20]
        return Score(0.0, Outcome.TAMPERED, {"tests": 0.0}, "; ".join(tamper[:5]), info)

    finished = bool(report.of("finish"))
    collect_errors = report.of("collect_error")
    candidate = {str(e.get("status")): e for e in report.of("candidate")}
    memory = any(e.get("exception") == "MemoryError" for e in [*report.of("phase"), *candidate.values()]) or any(
        "MemoryError" in str(e.get("longrepr", "")) for e in collect_errors)
    clean = finished and result.status is SandboxStatus.OK and result.exit_code == 0
    # Every test passed but the session did not end cleanly: its end counts as one more check.
    value = passed / len(total) if failing or clean else passed / (len(total) + 1)
    failures = [str(e.get("longrepr", "")) for e in collect_errors] + [
        str(e.get("longrepr", "")) for e in report.of("phase") if not e.get("ok")]
    if failures:
        info["failure"] = failures[0][-2000:]
    summary = f"{passed}/{len(total)} tests passed"
    if failing:
        summary += "; failing: " + ", ".join(info["failing"][:3])
    if collect_errors:
        summary += f"; collection errors in {', '.join(str(e.get('nodeid')) for e in collect_errors[:3])}"
    died = candidate.get("exited") or candidate.get("protocol")

    if result.status is SandboxStatus.TIMEOUT or "timeout" in candidate:
        how = result.detail if result.status is SandboxStatus.TIMEOUT else candidate["timeout"].get("detail")
        outcome, summary = Outcome.TIMEOUT, f"{how}; {summary}"
    elif result.status is SandboxStatus.MEMORY_LIMIT or (memory and failing):
        outcome, summary = Outcome.MEMORY_LIMIT, f"memory limit; {summary}"
    elif not finished or result.status is SandboxStatus.CRASHED:
        how = result.detail or f"exit code {result.exit_code}"
        outcome, summary = Outcome.CRASHED, f"pytest ended before finishing the session ({how}); {summary}"
    elif died is not None:
        outcome, summary = Outcome.CRASHED, f"{died.get('detail')}; {summary}"
    elif clean and not failing:
        outcome = Outcome.PASSED
    else:
        outcome = Outcome.FAILED
        if not failing:
            summary += f"; but pytest exited with {result.exit_code}"
    return Score(value, outcome, {"tests": value}, summary, info)


@dataclass
class Prepared:
    """One answer made ready for the sandbox: the workspace it runs in and how its run is judged."""

    files: dict[str, str | bytes]
    paths: list[str]  # the test modules pytest is pointed at
    defined: list[str]  # the test ids the test files define
    protected: Protected
    allowed_conftests: set[str]
    mode: str = "in_process"
    module: str = ""  # the answer's module (out_of_process)
    tests: list[str] = field(default_factory=list)  # every test file (the audit hook guards them)
    static: list[str] = field(default_factory=list)  # findings of the static tamper scan
    call_timeout_s: float | None = None
    nonce: str = field(default_factory=lambda: secrets.token_hex(16))
    entrypoint: str = "solution.py"
    traceback: str = "line"  # pytest's --tb style (TRACEBACKS)
    templated: bool = False  # a zygote may fork this run from the task's template (docs/design/sandbox.md)

    def job(self, task: Task, python: str, ctx: ScoringContext) -> BatchJob:
        # `python -m pytest` puts the workspace on sys.path, as task authors expect.
        argv = [python, "-s", "-B", "-m", "pytest", "-p", PLUGIN_MODULE, *PYTEST_OPTIONS, f"--tb={self.traceback}",
                *self.paths]
        limits = ctx.limits(task)
        settings = {"mode": self.mode, "module": self.module, "tests": self.tests,
                    "call_timeout_s": self.call_timeout_s or max(1.0, limits.timeout_s / 2),
                    "timeout_s": limits.timeout_s}
        env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        template = None
        if self.templated:
            shared = {name: content for name, content in self.files.items() if name != self.entrypoint}
            key = hashlib.sha256(json.dumps(
                [argv[1:], env, settings, limits.model_dump(), sorted(_hashes(shared).items())]).encode()).hexdigest()
            template = Template(key, shared, json.dumps({**settings, "template": True}).encode("ascii"),
                                base=_base(argv, self.paths, env, limits.model_dump(), shared))
        return ZygoteJob(argv, self.files, limits, env=env, after=self.protected.inspect,
                         report_input=json.dumps({"nonce": self.nonce, **settings}).encode("ascii"),
                         template=template, companion=CANDIDATE if self.mode == "out_of_process" else None)

    def score(self, task: Task, result: SandboxResult) -> Score:
        report = Report.parse(result.report, self.nonce, result.report_truncated)
        return verdict(result, report, self.defined, self.allowed_conftests, task, self.static, self.mode)


# Files pytest reads before it collects (its configuration, conftest.py): a task that ships one
# gets a template of its own, never one forked from a base that started without it.
CONFIG_FILES = {"conftest.py", "pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg"}


def _base(argv: list[str], paths: list[str], env: dict[str, str], limits: dict[str, Any],
          shared: dict[str, str | bytes]) -> Base | None:
    """The base that may fork the template: pytest with the task's options and limits, configured
    and its session started, before it reads any of the task's files (zygote_forks.py)."""
    if not paths or argv[-len(paths):] != paths or any(PurePosixPath(name).name in CONFIG_FILES for name in shared):
        return None
    args = argv[argv.index("pytest") + 1:-len(paths)]
    key = hashlib.sha256(json.dumps([argv[1:-len(paths)], env, limits]).encode()).hexdigest()
    return Base(key, args, list(paths))


def _hashes(files: dict[str, str | bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(content.encode("utf-8") if isinstance(content, str) else content).hexdigest()
            for name, content in files.items()}


@dataclass(frozen=True)
class _TaskPlan:
    """What `prepare` works out from the task alone (the same for every answer)."""

    paths: list[str]
    defined: list[str]
    mode: str
    templated: bool


_PLANS: dict[str, _TaskPlan] = {}  # by the digest of what a plan depends on
_PLANS_CAP = 4096


def _plan(task: Task, entrypoint: str, requested: str) -> _TaskPlan | Score:
    """The test modules, the tests they define, the mode and whether a template may serve the
    task, or the task's problem; plans are cached by content (every answer to a task has the same)."""
    key = hashlib.sha256(json.dumps([task.id, entrypoint, requested, task.verifier.args.get("test_order"),
                                     sorted(_hashes(task.tests).items()), sorted(_hashes(task.files).items())],
                                    default=str).encode()).hexdigest()
    found = _PLANS.get(key)
    if found is None:
        plan = _make_plan(task, entrypoint, requested)
        if isinstance(plan, Score):
            return plan
        if len(_PLANS) >= _PLANS_CAP:
            _PLANS.clear()
        found = _PLANS[key] = plan
    return found


def _make_plan(task: Task, entrypoint: str, requested: str) -> _TaskPlan | Score:
    paths = pytest_targets(task.tests)
    order = task.verifier.args.get("test_order")  # the test modules in the order pytest runs them (default: sorted)
    if order is not None:
        if not isinstance(order, list) or sorted(map(str, order)) != paths:
            return task_problem(task, f"test_order must list exactly the test modules {paths}, not {order!r}")
        paths = [str(name) for name in order]
    try:
        defined = [n for path in paths for n in defined_test_ids(path, task.tests[path])]
    except SyntaxError as error:
        return task_problem(task, f"test file {error.filename} does not parse (line {error.lineno}): {error.msg}")
    mode, why = choose_mode(requested, [] if requested == "in_process" else
                            out_of_process_problems(entrypoint, task.tests, task.files, paths))
    if not mode:
        return task_problem(task, why)
    templated = not template_problems(mode, entrypoint, task.tests, task.files, paths)
    return _TaskPlan(paths, defined, mode, templated)


def prepare(task: Task, answer: str) -> Prepared | Score:
    """The answer's workspace, or the score of an answer or task that needs no sandbox to judge."""
    problem = check_answer(answer)
    if problem is not None:
        return problem
    if not task.tests:
        return task_problem(task, "has no tests")
    args = task.verifier.args
    entrypoint = str(args.get("entrypoint", "solution.py"))
    requested = str(args.get("mode", "auto"))
    if requested not in MODES:
        return task_problem(task, f"mode {requested!r} is not one of {', '.join(MODES)}")
    call_timeout_s = args.get("call_timeout_s")
    if call_timeout_s is not None and (not isinstance(call_timeout_s, (int, float)) or call_timeout_s <= 0):
        return task_problem(task, f"call_timeout_s must be a positive number of seconds, not {call_timeout_s!r}")
    traceback = str(args.get("traceback", "line"))
    if traceback not in TRACEBACKS:
        return task_problem(task, f"traceback {traceback!r} is not one of {', '.join(TRACEBACKS)}")
    try:
        safe_relative_path(entrypoint)
        for name in [*task.files, *task.tests]:
            safe_relative_path(name)
    except ValueError as error:
        return task_problem(task, str(error))
    if entrypoint in task.tests:
        return task_problem(task, f"a test file is named like the entrypoint {entrypoint}")
    code = extract_code(answer)
    if not code.strip():
        return format_failed("the answer holds no code", tests=0.0)
    plan = _plan(task, entrypoint, requested)
    if isinstance(plan, Score):
        return plan

    files: dict[str, str | bytes] = {entrypoint: code}
    files.update((name, content) for name, content in task.files.items() if name != entrypoint)
    files.update(task.tests)
    allowed_conftests = {n for n in files if PurePosixPath(n).name == "conftest.py"}
    removable = set(task.tests) if plan.mode == "out_of_process" else set()
    return Prepared(files, plan.paths, plan.defined, Protected.of(files, exclude=entrypoint, removable=removable),
                    allowed_conftests, mode=plan.mode, module=PurePosixPath(entrypoint).stem,
                    tests=sorted(task.tests), static=scan_answer(code, sorted(task.tests)),
                    call_timeout_s=float(call_timeout_s) if call_timeout_s is not None else None,
                    entrypoint=entrypoint, traceback=traceback, templated=plan.templated)


def python_tests_batch(task: Task, answers: list[str], ctx: ScoringContext) -> list[Score]:
    """Several answers to one task in one sandbox (`BatchBackend.run_batch`: pytest imported once,
    a forked child per answer). Each run is judged exactly as `python_tests` judges its own; an
    answer the batch could not vouch for (its harness died or was tampered with), or every answer
    when the backend has no batch mode, is scored alone by `python_tests`."""
    scores: list[Score | None] = [None] * len(answers)
    ready: list[tuple[int, Prepared]] = []
    for index, answer in enumerate(answers):
        prepared = prepare(task, answer)
        if isinstance(prepared, Score):
            scores[index] = prepared
        else:
            ready.append((index, prepared))
    try:
        # One answer too: a warm pool forks it from a zygote that already imported pytest (and
        # holds the task's template), where `python_tests` alone would start a cold sandbox.
        backend = ctx.sandbox() if ready else None
    except SandboxUnavailableError:
        backend = None  # each answer scored alone says so
    if isinstance(backend, BatchBackend):
        jobs = [prepared.job(task, backend.python, ctx) for _, prepared in ready]
        try:
            results = backend.run_batch(jobs, harness_files=dict(HARNESS_FILES), preload=PRELOAD)
        except (SandboxUnavailableError, ValueError):  # scored alone, each answer says what went wrong
            results = [None] * len(jobs)
        for (index, prepared), result in zip(ready, results):
            if result is not None:
                scores[index] = prepared.score(task, result)
    return [score if score is not None else python_tests(task, answer, ctx) for score, answer in zip(scores, answers)]


@verifier("python_tests", batch=python_tests_batch, sandbox=True)
def python_tests(task: Task, answer: str, ctx: ScoringContext) -> Score:
    """The answer's last code block passes the task's pytest tests (value = fraction passed)."""
    prepared = prepare(task, answer)
    if isinstance(prepared, Score):
        return prepared
    try:
        backend = ctx.sandbox()
        job = prepared.job(task, backend.python, ctx)
        result = backend.run(job.argv, job.files, job.limits, env=job.env, after=job.after,
                             harness_files=dict(HARNESS_FILES), report_input=job.report_input)
    except SandboxUnavailableError as error:
        return Score(0.0, Outcome.INFRA_ERROR, {}, f"sandbox unavailable: {error}")
    except ValueError as error:  # the task's file names clash
        return task_problem(task, str(error))
    return prepared.score(task, result)
