"""The math verifier: answer extraction and numeric/symbolic equivalence, on hostile text too."""

from __future__ import annotations

import os
import time

import pytest

from tidal.reward import ScoringContext, get_verifier
from tidal.reward.verifiers.math_answer import equivalent, extract_answer, parse_number
from tidal.types import Outcome, Score, Task


def score(expected: object, answer: str) -> Score:
    task = Task(id="math/1", domain="math", prompt="?", verifier={"name": "math", "answer": expected})
    return get_verifier("math")(task, answer, ScoringContext())


@pytest.mark.parametrize(
    ("text", "final"),
    [
        ("Adding them, \\boxed{42}. Then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("so the answer is 17.", "17"),
        ("Answer: x^2 + 1", "x^2 + 1"),
        ("12 apples and 7 pears make 19 fruits", "19"),
        ("-3.5", "-3.5"),
        ("x^2+2x+1", "x^2+2x+1"),
        ("no numbers here at all", None),
    ],
)
def test_extract_answer(text: str, final: str | None) -> None:
    assert extract_answer(text) == final


@pytest.mark.parametrize(
    ("text", "value"),
    [("12", 12), ("1,234,567", 1234567), ("-0.25", -0.25), ("3/4", 0.75), ("\\frac{1}{8}", 0.125), ("$5$", 5),
     ("1e3", 1000), ("x = 7", 7), ("50\\%", 50)],
)
def test_parse_number(text: str, value: float) -> None:
    number = parse_number(text)
    assert number is not None and float(number) == value


@pytest.mark.parametrize(
    ("expected", "got"),
    [("0.5", "1/2"), ("1/2", "\\frac{1}{2}"), ("1000", "1,000"), ("2", "2.0"), ("-3", "-3.00"),
     ("x^2 - 1", "(x-1)(x+1)"), ("2x + 1", "1 + 2*x"), ("sqrt(2)/2", "\\frac{\\sqrt{2}}{2}"),
     ("3\\sqrt{2}", "\\sqrt{18}"), ("sin(x)^2 + cos(x)^2", "1"), ("(1, 2)", "(1,2)"), ("pi/2", "\\frac{\\pi}{2}")],
)
def test_equivalent(expected: str, got: str) -> None:
    assert equivalent(expected, got)


@pytest.mark.parametrize(
    ("expected", "got"),
    [("1/3", "0.333"), ("pi", "3.14159"), ("(1, 2)", "(2, 1)"), ("x + 1", "x + 2"), ("4", "5"), ("1000", "1,0000")],
)
def test_not_equivalent(expected: str, got: str) -> None:
    assert not equivalent(expected, got)


def test_math_scores() -> None:
    passed = score(42, "Let me think... 40 + 2 = 42, so the answer is \\boxed{42}.")
    assert passed.outcome is Outcome.PASSED and passed.value == 1.0 and passed.components == {"correct": 1.0}
    wrong = score("1/2", "The answer is 0.6")
    assert wrong.outcome is Outcome.FAILED and wrong.value == 0.0
    assert score("1/2", "I have no idea").outcome is Outcome.FAILED


@pytest.mark.parametrize(
    "answer",
    [
        "\\boxed{__import__('os').system('touch /tmp/tidal-pwned')}",
        "answer is (lambda: 1)()",
        "\\boxed{x.__class__.__mro__}",
        "\\boxed{9^9^9^9}",
        "\\boxed{10^{10^{10}}}",
        "\\boxed{" + "(" * 500 + "1" + ")" * 500 + "}",
        "\\boxed{" + "9" * 5000 + "}",
        "\\boxed{\\frac{1}{0}}",
        "answer is \x00\x01\x02",
        "\\boxed{" * 8000,
        "1 " * 30000,
    ],
)
def test_hostile_math_answers_fail_quickly_and_safely(answer: str) -> None:
    started = time.monotonic()
    result = score(6, answer)
    assert result.outcome is Outcome.FAILED
    assert time.monotonic() - started < 5
    assert not os.path.exists("/tmp/tidal-pwned")


def test_math_without_answer_is_a_task_problem() -> None:
    task = Task(id="math/2", domain="math", prompt="?", verifier={"name": "math"})
    assert get_verifier("math")(task, "42", ScoringContext()).outcome is Outcome.INFRA_ERROR
