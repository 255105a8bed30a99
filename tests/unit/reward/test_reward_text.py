"""exact_match and regex/format."""

from __future__ import annotations

from typing import Any

import pytest

from tidal.reward import ScoringContext, get_verifier
from tidal.types import Outcome, Task


def task(**verifier: Any) -> Task:
    return Task(id="knowledge/q1", domain="knowledge", prompt="Capital of France?", verifier=verifier)


@pytest.mark.parametrize("answer", ["Paris", "paris", "  Paris.  ", '"Paris"', "'paris.'", "PARIS\n", "“Paris”"])
def test_exact_match_normalises(answer: str) -> None:
    score = get_verifier("exact_match")(task(name="exact_match", answer="Paris"), answer, ScoringContext())
    assert score.outcome is Outcome.PASSED and score.value == 1.0


@pytest.mark.parametrize("answer", ["Paris, France", "Lyon", "The answer is Paris", "Par is"])
def test_exact_match_rejects(answer: str) -> None:
    score = get_verifier("exact_match")(task(name="exact_match", answer="Paris"), answer, ScoringContext())
    assert score.outcome is Outcome.FAILED and score.value == 0.0


def test_exact_match_aliases_case_and_whitespace() -> None:
    spec = task(name="exact_match", answer="New York City", aliases=["NYC"], case_sensitive=True)
    run = get_verifier("exact_match")
    assert run(spec, "New   York\tCity", ScoringContext()).outcome is Outcome.PASSED
    assert run(spec, "NYC", ScoringContext()).outcome is Outcome.PASSED
    assert run(spec, "nyc", ScoringContext()).outcome is Outcome.FAILED


def test_exact_match_numbers_in_task_files() -> None:
    assert get_verifier("exact_match")(task(name="exact_match", answer=42), "42", ScoringContext()).value == 1.0


def test_exact_match_without_answer_is_a_task_problem() -> None:
    score = get_verifier("exact_match")(task(name="exact_match"), "Paris", ScoringContext())
    assert score.outcome is Outcome.INFRA_ERROR and "knowledge/q1" in score.detail and "answer" in score.detail


@pytest.mark.parametrize("answer", ["", "\0Paris", "x" * 70_000])
def test_exact_match_hostile_answers(answer: str) -> None:
    score = get_verifier("exact_match")(task(name="exact_match", answer="Paris"), answer, ScoringContext())
    assert score.outcome is Outcome.FAILED and score.detail


def test_regex_fullmatch_on_the_stripped_answer() -> None:
    spec = task(name="regex", pattern=r"\d{3}-\d{4}")
    run = get_verifier("regex")
    assert run(spec, "  555-1234\n", ScoringContext()).outcome is Outcome.PASSED
    assert run(spec, "call 555-1234", ScoringContext()).outcome is Outcome.FAILED
    assert run(spec, "555-12345", ScoringContext()).outcome is Outcome.FAILED


def test_format_alias_and_flags() -> None:
    run = get_verifier("format")
    assert run(task(name="format", pattern="yes|no", flags="i"), "YES", ScoringContext()).value == 1.0
    assert run(task(name="format", pattern="yes|no", flags=["IGNORECASE"]), "No", ScoringContext()).value == 1.0
    assert run(task(name="format", pattern="a.b", flags=["DOTALL"]), "a\nb", ScoringContext()).value == 1.0
    assert run(task(name="format", pattern="yes|no"), "YES", ScoringContext()).value == 0.0


@pytest.mark.parametrize("spec", [{"pattern": "("}, {}, {"pattern": "a", "flags": "q"}])
def test_bad_regex_tasks_are_task_problems(spec: dict[str, Any]) -> None:
    score = get_verifier("regex")(task(name="regex", **spec), "a", ScoringContext())
    assert score.outcome is Outcome.INFRA_ERROR


@pytest.mark.parametrize(("answer", "passed"), [
    ("France's capital is Paris. Answer: Paris", True),
    ("**Answer:** Paris.\nThat is all.", True),
    ("Final answer: paris", True),
    ("Answer: Paris\nAnswer: Lyon", False),  # only the last marker counts: listing candidates earns nothing
    ("Answer: Lyon\nAnswer: Paris", True),
    ("Answer: Paris, France", False),
    ("Answers: Paris", False),
])
def test_exact_match_takes_the_final_answer_after_the_last_marker(answer: str, passed: bool) -> None:
    score = get_verifier("exact_match")(task(name="exact_match", answer="Paris"), answer, ScoringContext())
    assert (score.outcome is Outcome.PASSED) is passed


def test_final_answer_can_be_turned_off_and_applies_to_regex() -> None:
    strict = task(name="exact_match", answer="Paris", final_answer=False)
    assert get_verifier("exact_match")(strict, "Answer: Paris", ScoringContext()).outcome is Outcome.FAILED
    pattern = task(name="regex", pattern=r"\[\s*pig\s*\]")
    assert get_verifier("regex")(pattern, "In brackets: Answer: [pig]", ScoringContext()).outcome is Outcome.PASSED
    assert get_verifier("regex")(pattern, "Answer: [pig] and more", ScoringContext()).outcome is Outcome.FAILED
