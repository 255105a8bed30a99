"""Check 10, difficulty: the policy's pass rate per task, from real sampling and real scoring."""

from __future__ import annotations

import pytest

from tidal.audit.context import AuditContext
from tidal.audit.difficulty import check_difficulty, load_policy
from tidal.errors import ModelLoadError
from tidal.tasks import generate_tasks, reference_answer
from tidal.types import Task


def _task() -> Task:
    return generate_tasks("knowledge", 1, "train", 3)[0]


def test_a_policy_that_always_or_never_solves_is_reported_and_estimated() -> None:
    task = _task()
    right, wrong = reference_answer(task), "certainly not the answer"
    for answers, message, estimate in (([right] * 4, "always solves it (4/4)", 0.0),
                                       ([wrong] * 4, "never solves it (0/4)", 1.0)):
        ctx = AuditContext(policy=lambda t, k, answers=answers: answers[:k])
        ctx.config.policy_samples = 4
        measurements: dict = {}
        findings = check_difficulty(task, ctx, measurements)
        assert [f.message for f in findings] == [f"the policy {message}"]
        assert findings[0].severity == "info"
        assert measurements["difficulty_estimate"] == estimate


def test_a_mixed_policy_gives_an_estimate_and_no_finding() -> None:
    task = _task()
    ctx = AuditContext(policy=lambda t, k: [reference_answer(t), "no", "no", reference_answer(t)][:k])
    ctx.config.policy_samples = 4
    measurements: dict = {}
    assert check_difficulty(task, ctx, measurements) == []
    assert measurements["difficulty"]["pass@1"] == 0.5
    assert measurements["difficulty"]["pass@4"] == 1.0
    assert measurements["difficulty_estimate"] == 0.5


def test_the_tiny_model_policy_samples_real_answers() -> None:
    policy = load_policy("tiny", device="cpu", max_new_tokens=8)
    task = _task()
    answers = policy(task, 3)
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)
    ctx = AuditContext(policy=policy)
    ctx.config.policy_samples = 3
    measurements: dict = {}
    check_difficulty(task, ctx, measurements)
    assert measurements["difficulty"]["samples"] == 3
    assert 0.0 <= measurements["difficulty_estimate"] <= 1.0
    with pytest.raises(ModelLoadError, match="not a checkpoint folder"):
        load_policy("/nonexistent/checkpoint")
