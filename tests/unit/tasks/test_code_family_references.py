"""The `code` family's references pass their own tests, and the tests reject wrong functions.

This runs plain Python and pytest in subprocesses: it checks the generated task content, not the
sandbox, which the reward layer tests separately.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidal.errors import TaskFormatError
from tidal.tasks import generate_tasks, reference_answer
from tidal.types import Task

# Executes each (code, tests) pair in a fresh `solution` module and counts passing test functions.
RUNNER = """
import json, sys, types
results = []
for case in json.load(sys.stdin):
    solution = types.ModuleType("solution")
    exec(case["code"], solution.__dict__)
    sys.modules["solution"] = solution
    namespace = {}
    exec(case["tests"], namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    passed = 0
    for test in tests:
        try:
            test()
            passed += 1
        except Exception:
            pass
    results.append([passed, len(tests)])
print(json.dumps(results))
"""


def _run_all(cases: list[dict[str, str]]) -> list[list[int]]:
    completed = subprocess.run(
        [sys.executable, "-c", RUNNER], input=json.dumps(cases), capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def _sample() -> list[Task]:
    return generate_tasks("code", 150, "train", 9, 1, 5) + generate_tasks("code", 50, "eval", 9, 1, 5)


def test_every_reference_passes_all_its_tests() -> None:
    tasks = _sample()
    cases = [{"code": t.reference, "tests": t.tests["test_solution.py"]} for t in tasks]
    for task, (passed, total) in zip(tasks, _run_all(cases)):
        assert total >= 3 and passed == total, (task.prompt, task.reference, task.tests)


def test_wrong_functions_fail_some_test() -> None:
    tasks = _sample()
    cases = []
    for task in tasks:
        header = task.reference.splitlines()[0]
        argument = header[header.index("(") + 1 : header.index(")")]
        for body in ("0", argument, "None"):
            cases.append({"code": f"{header}\n    return {body}\n", "tests": task.tests["test_solution.py"]})
    for case, (passed, total) in zip(cases, _run_all(cases)):
        assert passed < total, case


def test_references_pass_under_pytest(tmp_path: Path) -> None:
    # Train and eval tasks of every level through real pytest, the way the sandbox will run them.
    # (Every reference of a larger sample is checked above, in one process.)
    tasks = generate_tasks("code", 5, "train", 3, 1, 5) + generate_tasks("code", 5, "eval", 3, 1, 5)
    environment = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # faster start
    runs = []
    for task in tasks:
        folder = tmp_path / f"{task.difficulty}-{task.id.replace('/', '_')}"
        folder.mkdir()
        fenced = reference_answer(task)
        (folder / "solution.py").write_text(fenced.removeprefix("```python\n").removesuffix("```"))
        for name, text in task.tests.items():
            (folder / name).write_text(text)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
        runs.append(subprocess.Popen(command, cwd=folder, env=environment, stdout=subprocess.PIPE, text=True))
    for task, run in zip(tasks, runs):
        output, _ = run.communicate(timeout=120)
        assert run.returncode == 0 and "4 passed" in output, (task.reference, output)


def test_reference_answer_needs_a_reference() -> None:
    task = generate_tasks("code", 1, "train", 0)[0].model_copy(update={"reference": None})
    with pytest.raises(TaskFormatError, match=task.id):
        reference_answer(task)
