"""The verifier registry and the hostile-answer guards every verifier shares."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.errors import SandboxUnavailableError, UnknownNameError
from tidal.reward import ScoringContext, base, get_verifier, known_verifiers, verifier
from tidal.reward.registry import check_answer, decode_answer
from tidal.types import Outcome, Score, Task


def test_builtin_verifiers_are_registered() -> None:
    assert {"exact_match", "math", "regex", "format", "python_tests"} <= known_verifiers()
    assert get_verifier("format") is get_verifier("regex")


def test_unknown_verifier_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as caught:
        get_verifier("llm_judge_9000")
    message = str(caught.value)
    assert "llm_judge_9000" in message and "exact_match" in message and "python_tests" in message


def test_register_a_verifier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "_VERIFIERS", dict(base._VERIFIERS))

    @verifier("always_half", aliases=("half",))
    def always_half(task: Task, answer: str, ctx: ScoringContext) -> Score:
        """Half marks for anything."""
        return Score(0.5, Outcome.FAILED)

    assert get_verifier("half").__wrapped__ is always_half  # type: ignore[attr-defined]
    assert "always_half" in known_verifiers()
    with pytest.raises(ValueError, match="already registered"):
        verifier("exact_match")(always_half)


def test_context_applies_limit_overrides() -> None:
    task = Task(id="t", domain="code", prompt="p", verifier={"name": "python_tests"}, limits={"timeout_s": 3, "memory_mb": 128})
    assert ScoringContext().limits(task).timeout_s == 3
    limits = ScoringContext(timeout_s=9, memory_mb=256).limits(task)
    assert (limits.timeout_s, limits.memory_mb, limits.pids) == (9, 256, task.limits.pids)


@pytest.mark.parametrize(
    ("answer", "detail"),
    [
        ("", "empty answer"),
        ("  \n\t ", "empty answer"),
        ("a\0b", "NUL"),
        ("x" * (64 * 1024 + 1), "64 KiB"),
        ("bad \udcff surrogate", "not valid text"),
    ],
)
def test_hostile_text_answers_fail_with_a_reason(answer: str, detail: str) -> None:
    score = check_answer(answer)
    assert score is not None and score.outcome is Outcome.FAILED and score.value == 0.0
    assert detail in score.detail


def test_bytes_answers_are_decoded_or_fail() -> None:
    assert decode_answer("é".encode()) == "é"
    bad = decode_answer(b"\x80\x81binary\xff")
    assert isinstance(bad, Score) and bad.outcome is Outcome.FAILED and "UTF-8" in bad.detail
    huge = decode_answer(b"x" * (1 << 20))
    assert isinstance(huge, Score) and "KiB" in huge.detail



def test_context_gives_one_backend_per_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task's `image` picks the sandbox; a missing image is the sandbox's typed error."""
    monkeypatch.setenv("TIDAL_IMAGES", str(tmp_path))
    context = ScoringContext(backend="bwrap")
    try:
        default = context.sandbox()
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap unavailable: {error}")
    assert context.sandbox("python3") is default and context.sandbox(None) is default
    with pytest.raises(SandboxUnavailableError, match="tidal image build"):
        context.sandbox("not-built")
