"""static under the bwrap sandbox: ruff's diagnostics become a bounded style score, the rule
selection is the task's, and the code is never executed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidal.reward import ScoringContext, get_verifier
from tidal.reward.verifiers.io_harness import elf_interpreter
from tidal.reward.verifiers.static import ruff_binary
from tidal.types import Outcome, Score, Task

CLEAN = "```python\ndef add(a, b):\n    return a + b\n```"
MESSY = "```python\nimport os\nimport sys\n\n\ndef f(x):\n    return undefined_name\n```"  # F401 x2, F821


def make_task(**args: Any) -> Task:
    return Task(id="code/style", domain="code", prompt="Write it.", verifier={"name": "static", **args})


def score(ctx: ScoringContext, answer: str, task: Task | None = None) -> Score:
    return get_verifier("static")(task or make_task(), answer, ctx)


@pytest.fixture(scope="module")
def linted(sandboxed: ScoringContext) -> ScoringContext:
    if ruff_binary() is None:
        pytest.skip("ruff is not installed")
    return sandboxed


def test_ruff_loader_comes_from_its_elf_header() -> None:
    assert elf_interpreter(Path("/bin/sh").read_bytes()).startswith("/lib")
    assert elf_interpreter(b"#!/bin/sh\n") == ""


@pytest.mark.parametrize("args, field", [
    ({"select": ["E;rm"]}, "verifier.select"), ({"ignore": [1]}, "verifier.ignore"), ({"penalty": 0}, "verifier.penalty"),
    ({"language": "c"}, "verifier.language"), ({"select": []}, "verifier.select"),
])
def test_bad_arguments_are_infra_errors(args: dict[str, Any], field: str) -> None:
    result = score(ScoringContext("bwrap"), CLEAN, make_task(**args))
    assert result.outcome is Outcome.INFRA_ERROR and field in result.detail


def test_clean_code_scores_one(linted: ScoringContext) -> None:
    result = score(linted, CLEAN)
    assert (result.value, result.outcome, result.info["count"]) == (1.0, Outcome.PASSED, 0), result.detail


def test_each_diagnostic_costs_the_penalty(linted: ScoringContext) -> None:
    result = score(linted, MESSY)
    assert (result.value, result.outcome) == (pytest.approx(0.7), Outcome.FAILED)
    assert result.info["by_code"] == {"F401": 2, "F821": 1}
    assert "F821 Undefined name `undefined_name`" in result.detail
    assert score(linted, MESSY, make_task(penalty=0.5)).value == 0.0  # floored


def test_rule_selection_is_configurable(linted: ScoringContext) -> None:
    assert score(linted, MESSY, make_task(select=["F821"])).info["by_code"] == {"F821": 1}
    assert score(linted, MESSY, make_task(ignore=["F401", "F821"])).outcome is Outcome.PASSED
    long_line = "```python\nx = '" + "a" * 90 + "'\n```"
    assert score(linted, long_line).info["by_code"] == {"E501": 1}
    assert score(linted, long_line, make_task(line_length=120)).outcome is Outcome.PASSED


def test_unparsable_code_scores_zero(linted: ScoringContext) -> None:
    result = score(linted, "```python\ndef f(:\n```")
    assert (result.value, result.outcome) == (0.0, Outcome.FAILED) and "does not parse" in result.detail


def test_code_is_never_run(linted: ScoringContext) -> None:
    # It would hang until the sandbox's limit if it were executed.
    answer = "```python\nwhile True:\n    pass\n```"
    assert score(linted, answer).outcome is Outcome.PASSED
    # Only the python block is linted: a ruff config beside it is not code, and not a config file.
    assert score(linted, "```toml\n[tool.ruff]\nselect = []\n```\n" + MESSY).value == pytest.approx(0.7)


def test_answers_without_a_fence_fail() -> None:
    result = score(ScoringContext("no-such-backend"), "def f(): pass")
    assert (result.value, result.outcome) == (0.0, Outcome.FAILED)
