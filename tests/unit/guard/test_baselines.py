"""The baselines' semantics that keep the guard quiet on healthy runs: a domain's reward judged
against the binomial noise of the tasks behind it, entropy per generated token, and a sustained
level shift alerting once before the baseline re-settles on it."""

from __future__ import annotations

import random

import pytest

from tidal.config.guard import DetectorConfig, GuardConfig
from tidal.guard import Guard
from tidal.guard.detectors import Observation, binomial_baseline, moved_binomial


def _findings(guard: Guard, rows: list[dict]) -> list:
    return [f for step, row in enumerate(rows, start=1) for f in guard.observe(step, row, []).findings]


def test_a_sustained_shift_alerts_once_and_the_baseline_resettles_on_the_new_level() -> None:
    rng = random.Random(0)
    before = [{"grad_norm": 1.0 + rng.uniform(-0.05, 0.05)} for _ in range(20)]
    after = [{"grad_norm": 8.0 + rng.uniform(-0.4, 0.4)} for _ in range(40)]
    guard = Guard(GuardConfig())
    findings = _findings(guard, before + after)
    assert [(f.detector, f.step) for f in findings] == [("grad_spike", 21)]
    # Settled on the new level: a spike from it fires again, once.
    late = guard.observe(61, {"grad_norm": 80.0}, []).findings
    assert [f.detector for f in late] == ["grad_spike"] and late[0].baseline == pytest.approx(8.0, abs=0.5)


def test_a_one_off_outlier_stays_out_of_the_baseline_and_a_second_one_fires_again() -> None:
    guard = Guard(GuardConfig())
    rows = [{"grad_norm": 1.0}] * 10 + [{"grad_norm": 50.0}] + [{"grad_norm": 1.0}] * 5 + [{"grad_norm": 50.0}]
    assert [f.step for f in _findings(guard, rows)] == [11, 17]


def test_a_domain_reward_is_judged_against_the_binomial_noise_of_its_tasks() -> None:
    cfg = DetectorConfig(z=5.0, min_delta=0.3, warmup=4)
    calm = [Observation(s, 0.1, 5) for s in range(8)]  # 5 tasks a step at a pass rate of 0.1
    # 5 tasks: a jump to 0.6 is 3 of them passing by chance, not 5 sigma of a mean over 5 tasks
    assert moved_binomial(Observation(9, 0.6, 5), calm, cfg, "rise") is None
    # a jump to 0.8 over 40 tasks is no chance
    assert moved_binomial(Observation(9, 0.8, 40), calm, cfg, "rise") == pytest.approx(0.1)
    mean, sigma = binomial_baseline(calm, Observation(9, 0.1, 5))
    assert mean == pytest.approx(0.1) and 0.13 < sigma < 0.15
    # a flat 0 still has noise (half a success of prior), so one lucky task does not fire
    zeros = [Observation(s, 0.0, 2) for s in range(4)]
    assert moved_binomial(Observation(5, 0.5, 2), zeros, cfg, "rise") is None


def test_without_task_counts_a_reward_falls_back_to_the_median_and_mad() -> None:
    cfg = DetectorConfig(z=4.0, min_delta=0.3, warmup=4)
    calm = [Observation(s, 0.8, None) for s in range(6)]
    assert moved_binomial(Observation(7, 0.1, None), calm, cfg, "fall") == pytest.approx(0.8)


def test_the_guard_counts_a_domains_tasks_from_the_batch_when_the_row_does_not() -> None:
    from tidal.guard import TaskStat

    guard = Guard(GuardConfig())
    tasks = [TaskStat(f"math/{i}", "math", 0.1, 0) for i in range(40)]
    for step in range(1, 9):
        assert not guard.observe(step, {"reward/math": 0.1}, tasks).findings
    [finding] = guard.observe(9, {"reward/math": 0.9}, tasks).findings
    assert finding.detector == "reward_spike" and "(40 tasks this step)" in finding.reason


def test_entropy_reads_the_per_generated_token_estimate_when_the_row_has_it() -> None:
    guard = Guard(GuardConfig())
    # the trainer's entropy over trained tokens swings with which groups train; the sampled one is steady
    rows = [{"entropy": 2.0 if step % 2 else 0.4, "sampled_entropy": 1.5} for step in range(1, 30)]
    assert not _findings(guard, rows)
    [finding] = guard.observe(30, {"entropy": 2.0, "sampled_entropy": 0.3}, []).findings
    assert finding.detector == "entropy_collapse" and finding.key == "sampled_entropy"


def test_defaults_roll_back_a_nonfinite_loss_and_a_gradient_spike_and_alert_on_the_rest() -> None:
    cfg = GuardConfig()
    actions = {name: d.actions for name, d in cfg.detectors().items()}
    assert actions.pop("nonfinite") == ["rollback"] and actions.pop("grad_spike") == ["rollback"]
    assert all(a == ["alert"] for a in actions.values()), actions
    assert cfg.rolls_back()


def _simulated_run(seed: int, concentration: float, steps: int = 150, group: int = 8) -> list[dict]:
    """The per-domain reward rows of a healthy run as the issue measured the tiny quickstart's:
    a domain's reward is the mean over the few tasks a step draws from it (5, 10 or 34), each task
    with a pass rate of its own (Beta with the domain's mean: near 0 or 1 at a low concentration)
    and `group` samples; the means drift up as the policy learns."""
    rng = random.Random(seed)
    domains = {"math": (5, 0.03, 0.5), "code": (10, 0.76, 0.6), "reasoning": (34, 0.1, 0.4), "few": (3, 0.2, 0.2)}
    rows = []
    for step in range(1, steps + 1):
        row: dict = {}
        for domain, (tasks, start, end) in domains.items():
            mean = start + (end - start) * step / steps
            rewards = []
            for _ in range(tasks):
                rate = rng.betavariate(mean * concentration, (1 - mean) * concentration)
                rewards.append(sum(rng.random() < rate for _ in range(group)) / group)
            row[f"reward/{domain}"], row[f"tasks/{domain}"] = sum(rewards) / tasks, tasks
        rows.append(row)
    return rows


@pytest.mark.parametrize("concentration", [0.3, 1.0, 4.0])
def test_healthy_domain_rewards_over_few_tasks_raise_no_alarm(concentration: float) -> None:
    for seed in range(8):
        findings = _findings(Guard(GuardConfig()), _simulated_run(seed, concentration))
        assert not findings, [f.reason for f in findings]


def test_a_hack_or_a_collapse_of_a_few_tasks_domain_is_still_caught() -> None:
    guard = Guard(GuardConfig())
    _findings(guard, [{"reward/math": 0.1, "tasks/math": 5, "reward/code": 0.8, "tasks/code": 10}] * 11)
    verdict = guard.observe(12, {"reward/math": 1.0, "tasks/math": 5, "reward/code": 0.0, "tasks/code": 10}, [])
    assert {(f.detector, f.key) for f in verdict.findings} == {("reward_spike", "reward/math"),
                                                              ("reward_collapse", "reward/code")}


def test_step_metrics_write_the_tasks_behind_each_domain_and_the_entropy_per_generated_token() -> None:
    from tidal.pipeline.stages import step_metrics
    from tidal.types import Completion, Episode, Group, Outcome, Score, Task

    def group(task_id: str, domain: str, logprobs: list[list[float]], outcome: Outcome,
              loss_mask: list[int] | None = None) -> Group:
        task = Task.model_validate({"id": task_id, "domain": domain, "prompt": "p",
                                    "verifier": {"name": "exact_match", "answer": "a"}})
        episodes = [Episode(f"{task_id}/s{i}", task_id, domain, task_id,
                            Completion([1], [7] * len(lp), lp, "a", "stop", 0, loss_mask),
                            Score(1.0 if outcome is Outcome.PASSED else 0.0, outcome)) for i, lp in enumerate(logprobs)]
        return Group(task, 0, episodes)

    groups = [group("m/1", "math", [[-1.0, -3.0], [-2.0]], Outcome.PASSED),
              group("m/2", "math", [[-2.0]], Outcome.FAILED),
              group("m/3", "math", [[-2.0]], Outcome.INFRA_ERROR),  # not scored: not behind the reward
              group("a/1", "agent", [[-4.0, 0.0, 0.0, -4.0]], Outcome.PASSED, loss_mask=[1, 0, 0, 1])]
    metrics = step_metrics(groups, {})
    assert metrics["tasks/math"] == 2 and metrics["tasks/agent"] == 1
    # every generated token of every sample, tool tokens (loss mask 0) left out: (1+3+2+2+2+4+4) / 7
    assert metrics["sampled_entropy"] == pytest.approx(18 / 7)


def test_the_reward_alarms_of_the_healthy_quickstart_in_issue_48_are_within_the_noise() -> None:
    # math at 0.025 -> 0.575 over its 5 tasks a step, code at 0.76 -> 0.22 over 10: the old
    # median-and-MAD baseline called them a hack and a collapse
    guard = Guard(GuardConfig())
    calm = {"reward/math": 0.025, "tasks/math": 5, "reward/code": 0.76, "tasks/code": 10}
    assert not _findings(guard, [calm] * 8)
    assert not guard.observe(9, {"reward/math": 0.575, "tasks/math": 5, "reward/code": 0.22, "tasks/code": 10}, []).findings
