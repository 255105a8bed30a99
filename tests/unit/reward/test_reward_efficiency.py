"""efficiency under the bwrap sandbox: correctness first, then CPU and peak memory against the
reference, measured in the same sandbox. Assertions use wide margins (a >10x gap), never wall time."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from tidal.reward import ScoringContext, get_verifier
from tidal.reward.verifiers.efficiency import bounded
from tidal.types import Limits, Outcome, Score, Task

# Triangular number of n: the reference in O(1), a candidate in O(n^2) (~4.5M steps for n=3000).
REFERENCE = "```python\nimport sys\nn = int(sys.stdin.read())\nprint(n * (n - 1) // 2)\n```"
QUADRATIC = ("```python\nimport sys\nn = int(sys.stdin.read())\nt = 0\nfor i in range(n):\n    for j in range(i):\n"
             "        t += 1\nprint(t)\n```")
MEMORY_HOG = ("```python\nimport sys\nn = int(sys.stdin.read())\nballast = 'x' * (200 * 2**20)\n"
              "print(n * (n - 1) // 2)\n```")


def make_task(reference: str | None = REFERENCE, **args: Any) -> Task:
    verifier = {"name": "efficiency", "cases": [{"input": "3000\n"}], "repeats": 2, "case_timeout_s": 10, **args}
    return Task(id="code/triangle", domain="code", prompt="Print n(n-1)/2.", verifier=verifier,
                reference=reference, limits=Limits(timeout_s=60, memory_mb=512))


def score(ctx: ScoringContext, answer: str, task: Task | None = None) -> Score:
    return get_verifier("efficiency")(task or make_task(), answer, ctx)


def test_bounded_is_one_up_to_the_tolerance_then_falls() -> None:
    assert bounded(0.2, 1.5) == bounded(1.5, 1.5) == 1.0
    assert bounded(3.0, 1.5) == 0.5
    assert 0 < bounded(1e6, 1.5) < bounded(10, 1.5) < 1


@pytest.mark.parametrize("task, field", [
    (make_task(reference=None), "verifier.reference"),
    (make_task(repeats=0), "verifier.repeats"),
    (make_task(cpu_weight=2), "verifier.cpu_weight"),
    (make_task(cases=[{"output": "1"}, "x"]), "verifier.cases[1]"),
])
def test_bad_tasks_are_infra_errors(task: Task, field: str) -> None:
    result = score(ScoringContext("bwrap"), REFERENCE, task)
    assert result.outcome is Outcome.INFRA_ERROR and f"[code/triangle] {field}" in result.detail


def test_as_cheap_as_the_reference_scores_one(sandboxed: ScoringContext) -> None:
    result = score(sandboxed, REFERENCE, make_task(cpu_tolerance=2.0, repeats=3))
    assert (result.value, result.outcome) == (1.0, Outcome.PASSED), result.detail
    assert result.components == {"correct": 1.0, "cpu": 1.0, "memory": 1.0}
    assert result.info["candidate_cpu_s"] > 0 and result.info["reference_cpu_s"] > 0
    assert result.info["repeats"] == 3 and len(result.info["per_case"]) == 1


def test_quadratic_candidate_loses_on_cpu(sandboxed: ScoringContext) -> None:
    result = score(sandboxed, QUADRATIC)
    assert result.outcome is Outcome.FAILED and result.components["correct"] == 1.0, result.detail
    assert result.info["cpu_ratio"] > 4  # about 15x on a quiet host
    assert result.components["cpu"] < 0.4 and result.components["memory"] == 1.0
    assert result.value == pytest.approx(0.7 * result.components["cpu"] + 0.3)


def test_memory_hog_loses_on_memory(sandboxed: ScoringContext) -> None:
    result = score(sandboxed, MEMORY_HOG, make_task(cpu_weight=0.0))
    assert result.outcome is Outcome.FAILED and result.components["correct"] == 1.0, result.detail
    assert result.info["candidate_max_rss_mb"] > 200 > 4 * result.info["reference_max_rss_mb"]
    assert result.value == result.components["memory"] < 0.4


def test_wrong_output_scores_zero_whatever_its_speed(sandboxed: ScoringContext) -> None:
    result = score(sandboxed, "```python\nprint(0)\n```")
    assert (result.value, result.outcome, result.components) == (0.0, Outcome.FAILED, {"correct": 0.0})
    assert "got '0\\n', expected '4498500\\n'" in result.detail


def test_expected_outputs_given_by_the_task_are_checked_too(sandboxed: ScoringContext) -> None:
    task = make_task(cases=[{"input": "4\n", "output": "6\n"}])
    assert score(sandboxed, REFERENCE, task).components["correct"] == 1.0
    wrong_reference = make_task(cases=[{"input": "4\n", "output": "7\n"}])
    result = score(sandboxed, REFERENCE, wrong_reference)
    assert result.outcome is Outcome.INFRA_ERROR and "the reference fails case 0" in result.detail


def test_hanging_candidate_times_out(sandboxed: ScoringContext) -> None:
    result = score(sandboxed, "```python\nwhile True:\n    pass\n```", make_task(case_timeout_s=0.5))
    assert (result.value, result.outcome) == (0.0, Outcome.TIMEOUT)


def test_broken_reference_is_the_tasks_fault(sandboxed: ScoringContext) -> None:
    result = score(sandboxed, REFERENCE, make_task(reference="```python\ndef f(:\n```"))
    assert result.outcome is Outcome.INFRA_ERROR and "the reference does not compile" in result.detail


def test_candidate_cannot_find_the_reference(sandboxed: ScoringContext) -> None:
    # The reference exists on disk only while it runs; a candidate that found it could copy it.
    snoop = ("```python\nimport os\nroots = ['.', os.environ.get('TIDAL_HARNESS', '/nonexistent'), '/tmp']\n"
             "print([f for r in roots for _, _, fs in os.walk(r) for f in fs if 'reference' in f or f.endswith('.bin')])\n```")
    result = score(sandboxed, snoop, make_task(reference="```python\nprint([])\n```", cases=[{"input": ""}]))
    assert result.components["correct"] == 1.0, result.detail


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_c_programs_are_compiled_and_measured(sandboxed: ScoringContext) -> None:
    c_reference = ("```c\n#include <stdio.h>\nint main(void) { long n; scanf(\"%ld\", &n); "
                   "printf(\"%ld\\n\", n * (n - 1) / 2); return 0; }\n```")
    fast = score(sandboxed, c_reference, make_task())  # C against the Python reference
    assert (fast.value, fast.outcome) == (1.0, Outcome.PASSED), fast.detail
    checked = score(sandboxed, "```python\nprint(1)\n```", make_task(reference=c_reference))
    assert (checked.value, checked.outcome) == (0.0, Outcome.FAILED) and "expected '4498500\\n'" in checked.detail
