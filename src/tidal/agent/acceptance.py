"""The acceptance run after an episode: the task's hidden tests against the workspace it left.

The tests never enter the workspace while the agent works. Afterwards the workspace's files are
read out of the session (never through a link: `SandboxSession.read_file`), the tests are added
(a test wins a name clash) and the run happens in a fresh sandbox over that copy, with the
`python_tests` verifier's machinery: its pytest plugin streams verdicts over the private report
channel with a per-run nonce, test files are hashed before and checked after, and a pytest
plugin loaded from a file the agent wrote (a new `conftest.py`) makes the run `tampered`.

Why a copy and not the session itself: `SandboxSession.exec` offers no report channel, and
without one a verdict would come from stdout or a file, which code the agent wrote (imported by
the tests) can forge. What the copy drops: symlinks (listed in the detail), permission bits and
empty folders. Tasks should check file contents and command output, not modes.

A task whose tests hold pytest modules is judged by them; one with only `test.sh` (terminal-task
layout, at `tests/test.sh` or `test.sh`) passes when the script exits 0 in the sandbox, which
trusts the script's exit status the way Terminal-Bench does.
"""

from __future__ import annotations

import hashlib
from pathlib import PurePosixPath

from tidal.reward.registry import ScoringContext, task_problem
from tidal.reward.verifiers import python_tests as pt
from tidal.sandbox.base import SandboxBackend, SandboxStatus
from tidal.sandbox.session import SandboxSession
from tidal.types import Outcome, Score, Task

MAX_FILE_BYTES = 8 << 20
MAX_TOTAL_BYTES = 64 << 20
MAX_FILES = 5000
SHELL_TESTS = ("tests/test.sh", "test.sh")


def collect_workspace(session: SandboxSession) -> tuple[dict[str, str | bytes], list[str]]:
    """The workspace's regular files (name -> bytes) and what was left out, with why."""
    files: dict[str, str | bytes] = {}
    skipped: list[str] = []
    total = 0
    for name in session.list_files():
        if len(files) >= MAX_FILES:
            skipped.append(f"files after the first {MAX_FILES}")
            break
        try:
            data = session.read_file(name, MAX_FILE_BYTES + 1)
        except (OSError, ValueError) as error:
            skipped.append(f"{name} ({getattr(error, 'strerror', None) or error})")
            continue
        if len(data) > MAX_FILE_BYTES or total + len(data) > MAX_TOTAL_BYTES:
            skipped.append(f"{name} (too large)")
            continue
        total += len(data)
        files[name] = data
    return files, skipped


def run_acceptance(task: Task, session: SandboxSession, backend: SandboxBackend,
                   context: ScoringContext | None = None) -> Score:
    """The task's verdict on the session's workspace. Raises SandboxUnavailableError when the
    sandbox cannot start (an infra error, not the model's)."""
    context = context or ScoringContext(backend=backend)
    workspace, skipped = collect_workspace(session)
    paths = pt.pytest_targets(task.tests)
    if paths:
        score = _pytest_verdict(task, workspace, paths, backend, context)
    elif any(name in task.tests for name in SHELL_TESTS):
        score = _shell_verdict(task, workspace, backend, context)
    else:
        return task_problem(task, "has no acceptance tests (test_*.py modules or tests/test.sh)")
    if skipped:
        score.info["not_copied"] = skipped[:20]
    return score


def _merged(task: Task, workspace: dict[str, str | bytes]) -> dict[str, str | bytes]:
    files = {name: data for name, data in workspace.items() if name not in task.tests}
    files.update(task.tests)
    return files


def _pytest_verdict(task: Task, workspace: dict[str, str | bytes], paths: list[str],
                    backend: SandboxBackend, context: ScoringContext) -> Score:
    try:
        defined = [n for path in paths for n in pt.defined_test_ids(path, task.tests[path])]
    except SyntaxError as error:
        return task_problem(task, f"test file {error.filename} does not parse (line {error.lineno}): {error.msg}")
    files = _merged(task, workspace)
    # A conftest counts as the task's only when it is one of its tests, or a starting file the
    # agent left unchanged; any other is the agent's and may not load as a plugin.
    allowed = {n for n in task.tests if PurePosixPath(n).name == "conftest.py"}
    allowed |= {n for n, content in task.files.items()
                if PurePosixPath(n).name == "conftest.py" and _same(workspace.get(n), content)}
    protected = pt.Protected({n: _sha(c) for n, c in task.tests.items()}, set(files))
    prepared = pt.Prepared(files, paths, defined, protected, allowed, mode="in_process",
                           tests=sorted(task.tests))
    job = prepared.job(task, backend.python, context)
    result = backend.run(job.argv, job.files, job.limits, env=job.env, after=job.after,
                         harness_files=dict(pt.HARNESS_FILES), report_input=job.report_input)
    return prepared.score(task, result)


def _shell_verdict(task: Task, workspace: dict[str, str | bytes], backend: SandboxBackend,
                   context: ScoringContext) -> Score:
    script = next(name for name in SHELL_TESTS if name in task.tests)
    files = _merged(task, workspace)
    protected = pt.Protected({n: _sha(c) for n, c in task.tests.items()}, set(files))
    test_dir = str(PurePosixPath(script).parent)
    result = backend.run(["bash", script], files, context.limits(task), env={"TEST_DIR": test_dir},
                         after=protected.inspect)
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


def _sha(content: str | bytes) -> str:
    return hashlib.sha256(content.encode("utf-8") if isinstance(content, str) else content).hexdigest()


def _same(found: str | bytes | None, expected: str) -> bool:
    return found is not None and _sha(found) == _sha(expected)
