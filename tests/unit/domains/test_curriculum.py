"""The difficulty curriculum: admission and retirement on a scripted reward stream, the moving
band, suspects and the auditor's verdicts, and a resume that matches an uninterrupted run."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from pydantic import ValidationError

from tidal.domains.curriculum import (
    Curriculum,
    CurriculumConfig,
    SuspectTask,
    oversample_factor,
)

GROUP = 4


def _config(**overrides: Any) -> CurriculumConfig:
    values: dict[str, Any] = {"band_start": (0.3, 0.9), "band_end": (0.1, 0.7), "schedule_steps": 10,
                              "min_observations": 8, "suspect_after": 12, "retire_after": 12}
    values.update(overrides)
    return CurriculumConfig(**values)


def test_band_moves_linearly_over_the_schedule() -> None:
    curriculum = Curriculum(_config())
    assert curriculum.band(0) == pytest.approx((0.3, 0.9))
    assert curriculum.band(5) == pytest.approx((0.2, 0.8))
    assert curriculum.band(10) == pytest.approx((0.1, 0.7))
    assert curriculum.band(1000) == pytest.approx((0.1, 0.7))
    assert Curriculum(_config(schedule_steps=0)).band(0) == pytest.approx((0.1, 0.7))
    with pytest.raises(ValueError, match="step"):
        curriculum.band(-1)


def test_scripted_stream_suspect_retire_and_middling() -> None:
    """Three tasks get one group per step: always 0, always 1, and half right."""
    curriculum = Curriculum(_config())
    script = {"fails": [0.0] * GROUP, "passes": [1.0] * GROUP, "middling": [1.0, 0.0, 1.0, 0.0]}
    for step in range(10):
        for task_id, rewards in script.items():
            curriculum.observe(task_id, rewards)
        seen = (step + 1) * GROUP
        next_step = step + 1
        if seen < 8:  # still exploring: everything is admitted
            assert all(curriculum.admits(t, next_step) for t in script)
            assert curriculum.suspects() == [] and curriculum.retired() == []
        elif seen < 12:  # measured: the easy one is above the band, the unsolved one is kept on
            # until it is a suspect (below the band it would never reach the auditor)
            assert curriculum.estimate("fails") < curriculum.band(next_step)[0]
            assert curriculum.admits("fails", next_step)
            assert not curriculum.admits("passes", next_step)
            assert 0 < curriculum.distance_to_band("passes", next_step) < math.inf
            assert curriculum.suspects() == [] and curriculum.retired() == []
        else:
            assert curriculum.suspects() == [SuspectTask("fails", seen, 1 / (seen + 2))]
            assert curriculum.retired() == ["passes"]
            assert not curriculum.admits("fails", next_step)
            assert not curriculum.admits("passes", next_step)
            assert curriculum.distance_to_band("fails", next_step) == math.inf
            assert curriculum.distance_to_band("passes", next_step) == math.inf
        assert curriculum.admits("middling", next_step)
        assert curriculum.distance_to_band("middling", next_step) == 0.0
    assert curriculum.estimate("middling") == pytest.approx(21 / 42)


def test_unobserved_tasks_are_admitted_at_every_step() -> None:
    curriculum = Curriculum(_config())
    for step in (0, 5, 10, 50):
        assert curriculum.admits("never-seen", step)
        assert curriculum.distance_to_band("never-seen", step) == 0.0
    assert curriculum.estimate("never-seen") == 0.5
    assert curriculum.state_dict()["tasks"] == {}  # asking stores nothing


def test_a_rarely_solved_task_leaves_the_band_below() -> None:
    """Only a never-solved task is kept on until it is a suspect; one success ends that."""
    curriculum = Curriculum(_config())
    curriculum.observe("rare", [1.0] + [0.0] * 9)  # mean 2/12
    assert not curriculum.admits("rare", 0)
    assert curriculum.distance_to_band("rare", 0) == pytest.approx(0.3 - 2 / 12)
    assert curriculum.admits("rare", 10)  # the band has come down to 0.1


def test_a_hard_task_enters_the_band_as_it_moves() -> None:
    curriculum = Curriculum(_config())
    curriculum.set_prior("hardish", pass_rate=0.2, strength=1000)
    curriculum.observe("hardish", [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    estimate = (1 + 200 + 2) / (2 + 1000 + 8)
    assert curriculum.estimate("hardish") == pytest.approx(estimate)
    assert not curriculum.admits("hardish", 0)
    assert curriculum.distance_to_band("hardish", 0) == pytest.approx(0.3 - estimate)
    assert not curriculum.admits("hardish", 4)  # band low 0.22
    assert curriculum.admits("hardish", 6)  # band low 0.18
    assert curriculum.admits("hardish", 10)


def test_prior_from_an_external_estimate() -> None:
    curriculum = Curriculum(_config())
    curriculum.set_prior("audited", pass_rate=0.8, strength=8)
    assert curriculum.estimate("audited") == pytest.approx((1 + 6.4) / (2 + 8))
    assert curriculum.admits("audited", 0)  # no real rollouts yet: still explored
    curriculum.set_prior("never-solved", pass_rate=0.0, strength=10)
    assert curriculum.estimate("never-solved") == pytest.approx(1 / 12)
    with pytest.raises(ValueError, match="pass_rate"):
        curriculum.set_prior("x", pass_rate=1.5, strength=1)
    with pytest.raises(ValueError, match="strength"):
        curriculum.set_prior("x", pass_rate=0.5, strength=-1)


def test_success_threshold_counts_partial_credit_as_failure() -> None:
    curriculum = Curriculum(_config())
    curriculum.observe("exact", [0.99, 1.0, 0.5, 0.0])
    assert curriculum.estimate("exact") == pytest.approx((1 + 1) / (2 + 4))
    lenient = Curriculum(_config(success_threshold=0.5))
    lenient.observe("graded", [0.99, 1.0, 0.5, 0.0])
    assert lenient.estimate("graded") == pytest.approx((1 + 3) / (2 + 4))
    lenient.observe("graded", [])
    assert lenient.rollouts("graded") == 4
    with pytest.raises(ValueError, match="graded"):
        lenient.observe("graded", [float("nan")])


def test_retire_by_posterior_mean_and_not_with_one_failure() -> None:
    by_mean = Curriculum(_config(retire_above=0.8, retire_after=100, min_observations=4))
    by_mean.observe("mostly", [1.0] * 9 + [0.0])  # mean 10/12
    assert by_mean.retired() == ["mostly"]
    by_count = Curriculum(_config())
    by_count.observe("one-slip", [1.0] * 11 + [0.0])
    by_count.observe("one-slip", [1.0] * 4)
    assert by_count.retired() == []


def test_suspect_verdicts() -> None:
    curriculum = Curriculum(_config(hard_retry_prob=0.0))
    for task_id in ("broken-env", "just-hard"):
        curriculum.observe(task_id, [0.0] * 12)
    curriculum.observe("broken-env", [1.0])  # a late success from a group in flight: still a suspect
    assert [s.task_id for s in curriculum.suspects()] == ["broken-env", "just-hard"]
    with pytest.raises(ValueError, match="verdict"):
        curriculum.clear_suspect("broken-env", "flaky")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a suspect"):
        curriculum.clear_suspect("someone-else", "hard")

    curriculum.clear_suspect("broken-env", "broken")
    curriculum.clear_suspect("just-hard", "hard")
    assert curriculum.suspects() == []
    assert curriculum.broken() == ["broken-env"]
    curriculum.observe("broken-env", [1.0] * 20)
    assert curriculum.distance_to_band("broken-env", 5) == math.inf and not curriculum.admits("broken-env", 5)

    # A hard task outside the band is not admitted (retry probability 0) and is never re-flagged,
    # but it returns through the band once the policy solves it, without drawing.
    curriculum.observe("just-hard", [0.0] * 12)
    assert curriculum.suspects() == []
    assert not curriculum.admits("just-hard", 5)
    draws = curriculum.state_dict()["draws"]
    curriculum.observe("just-hard", [1.0] * 20)  # 20 of 44: mean 21/46
    assert curriculum.admits("just-hard", 5)
    assert curriculum.state_dict()["draws"] == draws


def test_hard_retry_is_seeded_and_has_the_configured_rate() -> None:
    def decisions(seed: int) -> list[bool]:
        curriculum = Curriculum(_config(hard_retry_prob=0.25), seed=seed)
        curriculum.observe("hard", [0.0] * 12)
        curriculum.clear_suspect("hard", "hard")
        return [curriculum.admits("hard", step % 10) for step in range(2000)]

    first = decisions(seed=7)
    assert first == decisions(seed=7)
    assert first != decisions(seed=8)
    assert 0.21 < sum(first) / len(first) < 0.29
    always = Curriculum(_config(hard_retry_prob=1.0))
    always.observe("hard", [0.0] * 12)
    always.clear_suspect("hard", "hard")
    assert all(always.admits("hard", 3) for _ in range(20))


def test_metrics_hand_values() -> None:
    curriculum = Curriculum(_config())
    curriculum.observe("fails", [0.0] * 12)
    curriculum.observe("passes", [1.0] * 12)
    curriculum.observe("middling", [1.0, 0.0] * 4)
    curriculum.observe("new", [1.0])
    curriculum.set_prior("unseen", 0.5, 4)
    assert curriculum.metrics(5) == pytest.approx({
        "curriculum/band_low": 0.2, "curriculum/band_high": 0.8, "curriculum/observed": 4.0,
        "curriculum/admitted_share": 0.5, "curriculum/exploring": 1.0, "curriculum/suspects": 1.0,
        "curriculum/hard": 0.0, "curriculum/broken": 0.0, "curriculum/retired": 1.0,
    })


def _stream_rewards(task_id: str, step: int, pass_rate: float) -> list[float]:
    rng = random.Random(f"{task_id}:{step}")
    return [1.0 if rng.random() < pass_rate else 0.0 for _ in range(GROUP)]


PASS_RATES = {f"task-{i}": rate for i, rate in enumerate([0.0, 0.0, 0.05, 0.2, 0.5, 0.8, 0.95, 1.0])}


def _run(curriculum: Curriculum, steps: range) -> list[list[str]]:
    """Each step: observe the admitted tasks, send suspects to a scripted auditor (the first
    suspect is broken, later ones hard). Returns the admitted ids per step."""
    history = []
    for step in steps:
        admitted = [t for t in PASS_RATES if curriculum.admits(t, step)]
        for task_id in admitted:
            curriculum.observe(task_id, _stream_rewards(task_id, step, PASS_RATES[task_id]))
        for suspect in curriculum.suspects():
            curriculum.clear_suspect(suspect.task_id, "broken" if suspect.task_id == "task-0" else "hard")
        history.append(admitted)
    return history


def test_state_survives_a_json_resume() -> None:
    config = _config(hard_retry_prob=0.5, schedule_steps=30, retire_after=8)
    uninterrupted = Curriculum(config, seed=3)
    expected = _run(uninterrupted, range(40))

    first = Curriculum(config, seed=3)
    history = _run(first, range(15))
    saved = json.loads(json.dumps(first.state_dict()))
    resumed = Curriculum(config, seed=3)
    resumed.load_state_dict(saved)
    history += _run(resumed, range(15, 40))
    assert history == expected
    assert resumed.state_dict() == uninterrupted.state_dict()
    assert resumed.broken() == ["task-0"] and "task-7" in resumed.retired()

    # The check is sensitive to the retry stream: losing its position changes the decisions.
    forgetful = Curriculum(config, seed=3)
    forgetful.load_state_dict({**saved, "draws": 0})
    assert _run(forgetful, range(15, 40)) != expected[15:]


def test_resume_rejects_another_seed_or_version() -> None:
    state = Curriculum(_config(), seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        Curriculum(_config(), seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        Curriculum(_config(), seed=1).load_state_dict({**state, "version": 99})


@pytest.mark.parametrize("overrides, message", [
    ({"band_start": (0.9, 0.3)}, "band_start: low 0.9 is above high 0.3"),
    ({"band_end": (0.5, 1.2)}, "less than or equal to 1"),
    ({"band_end": (-0.1, 0.5)}, "greater than or equal to 0"),
    ({"band_start": (0.3,)}, "band_start"),
    ({"retire_after": 0}, "retire_after"),
    ({"suspect_after": 0}, "suspect_after"),
    ({"hard_retry_prob": 1.5}, "hard_retry_prob"),
    ({"alpha0": 0.0}, "alpha0"),
    ({"success_threshold": 0.0}, "success_threshold"),
    ({"min_observation": 3}, "Extra inputs are not permitted"),
])
def test_bad_configs_raise(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _config(**overrides)


def test_both_bad_bands_are_reported_at_once() -> None:
    with pytest.raises(ValidationError) as error:
        _config(band_start=(0.9, 0.3), band_end=(0.8, 0.2))
    assert "band_start" in str(error.value) and "band_end" in str(error.value)


@pytest.mark.parametrize("rate, cap, factor", [
    (0.0, 4.0, 1.0), (0.2, 10.0, 1.25), (0.5, 4.0, 2.0), (0.75, 4.0, 4.0), (0.9, 4.0, 4.0), (1.0, 4.0, 4.0),
])
def test_oversample_factor(rate: float, cap: float, factor: float) -> None:
    assert oversample_factor(rate, cap) == pytest.approx(factor)


def test_oversample_factor_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="zero_variance_rate"):
        oversample_factor(1.5, 4.0)
    with pytest.raises(ValueError, match="max_factor"):
        oversample_factor(0.5, 0.5)
