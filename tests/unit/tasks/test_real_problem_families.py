"""`code_fn` and `math_word`: real-looking problems whose references pass their own verifiers.

The code references run against their hidden tests in one plain Python process (every task of a
sample) and, for a smaller sample, through the scorer and the bwrap sandbox, the path training
takes; wrong functions must fail some test.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from tidal.config.schema import RewardConfig
from tidal.errors import SandboxUnavailableError
from tidal.reward.scorer import Scorer
from tidal.sandbox import get_backend
from tidal.tasks import generate_tasks, reference_answer
from tidal.tasks.families.code_functions import make_code_function
from tidal.types import Limits, Task

# Runs each (code, tests) pair in a fresh `solution` module; counts the passing test functions.
RUNNER = """
import json, sys, types
results = []
for case in json.load(sys.stdin):
    solution = types.ModuleType("solution")
    try:
        exec(case["code"], solution.__dict__)
    except Exception:
        results.append([0, -1])
        continue
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
    completed = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(cases), capture_output=True, check=False,
                               text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def _code_sample() -> list[Task]:
    return generate_tasks("code_fn", 100, "train", 5, 1, 5) + generate_tasks("code_fn", 30, "eval", 5, 1, 5)


def test_code_fn_has_hundreds_of_distinct_functions_and_keeps_splits_apart() -> None:
    rng = random.Random(0)
    keys = {make_code_function(rng, level).key for level in range(1, 6) for _ in range(800)}
    assert len(keys) >= 200  # a lower bound: draws find most, not all, of the constants
    train = generate_tasks("code_fn", 60, "train", 1, 1, 5)
    evaluation = generate_tasks("code_fn", 20, "eval", 1, 1, 5)
    assert not {t.metadata["key"] for t in train} & {t.metadata["key"] for t in evaluation}
    assert [t.model_dump() for t in train[:10]] == [t.model_dump() for t in generate_tasks("code_fn", 10, "train", 1, 1, 5)]
    assert {t.domain for t in train} == {"code"} and {t.difficulty for t in train} == {1, 2, 3, 4, 5}


def test_code_fn_prompts_are_a_signature_docstring_and_examples() -> None:
    for task in _code_sample():
        name = task.metadata["entry_point"]
        assert f"def {name}(" in task.prompt and '"""' in task.prompt and task.prompt.count(">>> ") == 2
        assert task.reference.startswith(f"def {name}(")
        assert task.tests["test_solution.py"].count("assert ") >= 6


def test_every_code_fn_reference_passes_all_its_tests() -> None:
    tasks = _code_sample()
    results = _run_all([{"code": t.reference, "tests": t.tests["test_solution.py"]} for t in tasks])
    for task, (passed, total) in zip(tasks, results):
        assert total >= 6 and passed == total, (task.metadata["kind"], task.reference, task.tests)


def test_wrong_functions_fail_some_code_fn_test() -> None:
    tasks = _code_sample()
    cases = []
    for task in tasks:
        header = task.reference.splitlines()[0]
        first = header[header.index("(") + 1:].split(":")[0].split(")")[0]
        for body in ("None", "0", "''", "[]", first):
            cases.append({"code": f"{header}\n    return {body}\n", "tests": task.tests["test_solution.py"]})
    for case, (passed, total) in zip(cases, _run_all(cases)):
        assert passed < total, case
        assert passed <= 0.7 * total, case  # no constant answer passes most of a task's tests


def test_math_word_answers_follow_their_worked_steps() -> None:
    tasks = generate_tasks("math_word", 200, "train", 2, 1, 5) + generate_tasks("math_word", 50, "eval", 2, 1, 5)
    assert len({t.metadata["scenario"] for t in tasks}) >= 10 and len({t.prompt for t in tasks}) == len(tasks)
    for task in tasks:
        steps, answer = task.reference.rsplit(". Answer: ", 1)
        assert answer == task.verifier.args["answer"] and int(answer) >= 0
        for step in steps.split("; "):
            expression, value = step.replace("%", " / 100").rsplit(" = ", 1)
            assert eval(expression) == int(value), (task.prompt, step)
        assert steps.split("; ")[-1].endswith(f"= {answer}")


@pytest.fixture(scope="module")
def sandbox_scorer():
    try:
        get_backend("bwrap").run(["/bin/true"], {}, Limits(timeout_s=20))
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")
    scorer = Scorer(RewardConfig(), backend=get_backend("bwrap"))
    yield scorer
    scorer.close()


def test_references_score_full_marks_through_the_scorer(sandbox_scorer: Scorer) -> None:
    code = generate_tasks("code_fn", 5, "train", 8, 1, 5) + generate_tasks("code_fn", 5, "eval", 8, 1, 5)
    maths = generate_tasks("math_word", 10, "train", 8, 1, 5) + generate_tasks("math_word", 5, "eval", 8, 1, 5)
    scores = sandbox_scorer.score_many([(t, reference_answer(t)) for t in code + maths])
    assert [s.value for s in scores] == [1.0] * len(scores), [(t.id, s) for t, s in zip(code + maths, scores) if s.value < 1]
    wrong = sandbox_scorer.score_many([(code[0], "```python\ndef nothing():\n    return None\n```"),
                                       (maths[0], f"Answer: {int(maths[0].verifier.args['answer']) + 1}")])
    assert all(s.value < 1.0 for s in wrong)
