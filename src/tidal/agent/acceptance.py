"""The acceptance run after an episode: the task's hidden tests in the workspace the agent left.

The tests never enter the workspace while the agent works. After its last step (no process of the
agent is alive then) they are written into the episode's own session (`SandboxSession.put_files`)
over whatever the agent left on their paths, with the `__pycache__` folders next to them deleted,
and run there as one more session command with the `python_tests` verifier's machinery: verdicts
over the private report channel with a per-run nonce, test files hashed when written and checked
after, a plugin loaded from a file the agent wrote (a new `conftest.py`) making the run `tampered`.
Every folder and file first gets its owner's read and write bits, so an agent cannot turn its
failure into an infra error by making the workspace unreadable.

So the tests see exactly what the agent left: links, modes, empty folders included. A task with
only `test.sh` (at `tests/test.sh` or `test.sh`) passes when the script exits 0, trusting its exit
status as Terminal-Bench does. docs/design/agent.md, "Acceptance", has the details.
"""

from __future__ import annotations

import errno
import hashlib
from pathlib import PurePosixPath

from tidal.errors import SandboxUnavailableError
from tidal.reward.registry import ScoringContext, task_problem
from tidal.reward.verifiers import python_tests as pt
from tidal.sandbox.base import SandboxBackend, SandboxResult, SandboxStatus
from tidal.sandbox.session import SandboxSession
from tidal.types import Outcome, Score, Task

SHELL_TESTS = ("tests/test.sh", "test.sh")


def run_acceptance(task: Task, session: SandboxSession, backend: SandboxBackend,
                   context: ScoringContext | None = None) -> Score:
    """The task's verdict on the session's workspace, run in that session after the agent's last
    command. Raises SandboxUnavailableError when the sandbox cannot start (not the model's)."""
    context = context or ScoringContext(backend=backend)
    paths = pt.pytest_targets(task.tests)
    if not paths and not any(name in task.tests for name in SHELL_TESTS):
        return task_problem(task, "has no acceptance tests (test_*.py modules or tests/test.sh)")
    try:
        defined = [n for path in paths for n in pt.defined_test_ids(path, task.tests[path])]
    except SyntaxError as error:
        return task_problem(task, f"test file {error.filename} does not parse (line {error.lineno}): {error.msg}")
    # A conftest counts as the task's only when it is one of its tests, or a starting file the
    # agent left unchanged; any other is the agent's and may not load as a plugin.
    allowed = {n for n in task.tests if PurePosixPath(n).name == "conftest.py"}
    allowed |= {n for n, content in task.files.items()
                if PurePosixPath(n).name == "conftest.py" and _same(_read(session, n), content)}
    problem = _install_tests(task, session)
    if problem is not None:
        return problem
    protected = pt.Protected({n: _sha(c) for n, c in task.tests.items()}, set(session.list_files()))
    if paths:
        prepared = pt.Prepared({}, paths, defined, protected, allowed, mode="in_process", tests=sorted(task.tests))
        job = prepared.job(task, backend.python, context)
        # -P: the workspace is off sys.path while Python and pytest start, so a planted pytest.py
        # (or argparse.py, ...) cannot run before the report plugin is armed; `pythonpath=.` puts it
        # back once the plugins are loaded, so tests import the agent's modules as under
        # `python -m pytest`.
        argv = [job.argv[0], "-P", *job.argv[1:], "-o", "pythonpath=."]
        result = session.exec(argv, env=job.env, limits=job.limits, harness_files=dict(pt.HARNESS_FILES),
                              report_input=job.report_input)
        result.after_value = protected.inspect(session.workspace)
        return prepared.score(task, result)
    script = next(name for name in SHELL_TESTS if name in task.tests)
    result = session.exec(["bash", script], env={"TEST_DIR": str(PurePosixPath(script).parent)},
                          limits=context.limits(task))
    result.after_value = protected.inspect(session.workspace)
    return _shell_verdict(script, result)


def _install_tests(task: Task, session: SandboxSession) -> Score | None:
    """Write the tests into the workspace; a Score when they cannot go in (a full workspace is the
    agent's doing, clashing test names the task's)."""
    caches = sorted({str(PurePosixPath(name).parent / "__pycache__") for name in task.tests})
    try:
        session.put_files(dict(task.tests), remove=caches)
    except ValueError as error:
        return task_problem(task, f"its tests cannot be written: {error}")
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return Score(0.0, Outcome.FAILED, {"tests": 0.0},
                         f"the workspace the agent left has no room for the tests ({error.strerror})")
        raise SandboxUnavailableError(f"cannot write the tests into the session: {error}") from error
    return None


def _shell_verdict(script: str, result: SandboxResult) -> Score:
    tail = (result.stdout_text[-1500:] + result.stderr_text[-500:]).strip()
    info = {"exit_code": result.exit_code, "wall_s": round(result.wall_s, 3), "output": tail}
    if result.after_value:
        info["tamper"] = list(result.after_value)[:20]
        return Score(0.0, Outcome.TAMPERED, {"tests": 0.0}, "; ".join(result.after_value[:5]), info)
    if result.status is SandboxStatus.TIMEOUT:
        return Score(0.0, Outcome.TIMEOUT, {"tests": 0.0}, f"{script}: {result.detail}", info)
    if result.status is SandboxStatus.OK and result.exit_code == 0:
        return Score(1.0, Outcome.PASSED, {"tests": 1.0}, f"{script} exited 0", info)
    return Score(0.0, Outcome.FAILED, {"tests": 0.0},
                 f"{script} exited {result.exit_code} ({result.status.value})", info)


def _read(session: SandboxSession, name: str) -> bytes | None:
    try:
        return session.read_file(name, 8 << 20)
    except (OSError, ValueError):
        return None


def _sha(content: str | bytes) -> str:
    return hashlib.sha256(content.encode("utf-8") if isinstance(content, str) else content).hexdigest()


def _same(found: str | bytes | None, expected: str) -> bool:
    return found is not None and _sha(found) == _sha(expected)
