"""Ratio control's decisions on scripted idle times (hand values, no clocks), and its bounds."""

from __future__ import annotations

import pytest

from tidal.config.schema import PipelineConfig
from tidal.pipeline.ratio import RatioController, ratio_bounds

BUSY = {"trainer_idle_s": 0.0, "step_s": 4.0, "sampler_idle_s": 0.0, "generate_s": 1.0, "buffer_full": False}


def _step(controller: RatioController, **measures: float | bool) -> int:
    controller.update(**{**BUSY, **measures})  # type: ignore[arg-type]
    return controller.limit


def test_a_waiting_trainer_raises_the_window_at_once_up_to_its_bound() -> None:
    controller = RatioController(limit=1, lower=1, upper=3, idle_fraction=0.1)
    assert controller.update(**{**BUSY, "trainer_idle_s": 1.0}) is not None  # 25% of its step
    assert controller.limit == 2
    assert [_step(controller, trainer_idle_s=1.0) for _ in range(3)] == [3, 3, 3]
    assert controller.update(**{**BUSY, "trainer_idle_s": 1.0}) is None  # at the bound: no change to report
    # Below the threshold the trainer counts as busy: 0.3 s of a 4 s step is 7.5%.
    assert _step(controller, trainer_idle_s=0.3) == 3


def test_a_full_buffer_or_waiting_samplers_lower_it_after_patience_steps() -> None:
    controller = RatioController(limit=3, lower=1, upper=3, idle_fraction=0.1, patience=2)
    # A full buffer twice in a row: down by one; once more is not enough for the next.
    assert [_step(controller, buffer_full=True) for _ in range(3)] == [3, 2, 2]
    # The samplers waited (0.5 s of their 1.5 s), the trainer did not: the second in a row lowers it.
    assert _step(controller, sampler_idle_s=0.5) == 1
    assert [_step(controller, buffer_full=True) for _ in range(3)] == [1, 1, 1]  # never below the lower bound


def test_a_quiet_step_or_a_waiting_trainer_resets_the_count_toward_lowering() -> None:
    controller = RatioController(limit=3, lower=1, upper=4, idle_fraction=0.1, patience=2)
    assert _step(controller, buffer_full=True) == 3
    assert _step(controller) == 3  # neither side waited: the streak is broken
    assert _step(controller, buffer_full=True) == 3
    assert _step(controller, trainer_idle_s=2.0, buffer_full=True) == 4  # the trainer waiting wins
    assert _step(controller, buffer_full=True) == 4
    assert _step(controller, buffer_full=True) == 3
    why = RatioController(limit=2, lower=1, upper=2, patience=1).update(**{**BUSY, "sampler_idle_s": 3.0})
    assert why is not None and "samplers waited 3.00 s" in why


@pytest.mark.parametrize(
    ("settings", "max_staleness", "expected"),
    [
        ({}, 1, (1, 2)),  # the staleness bound: the trainer's batch and one ahead
        ({}, 10, (1, 5)),  # the queues: queue_size 2 + 1 worker + scorer and its queue
        ({"rollout_workers": 3, "queue_size": 4}, 10, (1, 9)),
        ({"ratio_min_in_flight": 2, "ratio_max_in_flight": 3}, 10, (2, 3)),
        ({"ratio_min_in_flight": 4}, 1, (2, 2)),  # the bound wins over a larger minimum
        ({}, 0, (1, 1)),  # on-policy: nothing ahead of the trainer
    ],
)
def test_the_window_stays_within_the_staleness_bound_and_the_queues(
    settings: dict[str, int], max_staleness: int, expected: tuple[int, int]
) -> None:
    assert ratio_bounds(PipelineConfig(**settings), max_staleness) == expected


def test_a_minimum_above_the_maximum_is_refused_at_load() -> None:
    with pytest.raises(ValueError, match="ratio_min_in_flight=3 is above ratio_max_in_flight=2"):
        PipelineConfig(ratio_min_in_flight=3, ratio_max_in_flight=2)
