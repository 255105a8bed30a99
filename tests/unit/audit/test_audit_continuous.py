"""The continuous audit (TaskWatch), the mixer skipping quarantined tasks, and the quarantine
list honoured by training task loading and reported apart by evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.audit import TaskWatch, load_quarantine, write_quarantine
from tidal.config.schema import DomainConfig, TasksConfig, TidalConfig, WatchConfig
from tidal.errors import TidalError
from tidal.eval.heldout import compare, pass_rates
from tidal.pipeline.run import build_tasks
from tidal.tasks.mixer import TaskMixer
from tidal.types import Completion, Episode, Outcome, Score, Task, regroup

CONFIG = WatchConfig(min_samples=4, max_tamper_rate=0.5, short_answer_chars=8, max_short_pass_groups=2,
                     max_heldout_gap=0.5)


def task(task_id: str, domain: str = "code", reference: str | None = "def f(x):\n    return x + 1\n") -> Task:
    return Task(id=task_id, domain=domain, prompt="p", verifier={"name": "python_tests"}, reference=reference)


def episodes(task_id: str, group: str, outcomes: list[Outcome], text: str = "x" * 40, domain: str = "code") -> list[Episode]:
    out = []
    for k, outcome in enumerate(outcomes):
        value = 1.0 if outcome is Outcome.PASSED else 0.0
        episode = Episode(f"{group}/{k}", task_id, domain, group, Completion([], [1], [0.0], text, "stop", 0),
                          score=Score(value, outcome))
        if outcome is Outcome.TAMPERED:
            episode.keep, episode.drop_reason = False, "tampered"
        out.append(episode)
    return out


def test_tamper_rate_quarantines_after_min_samples() -> None:
    watch, tasks = TaskWatch(CONFIG), {"a": task("a"), "b": task("b")}
    assert watch.observe(regroup(episodes("a", "g1", [Outcome.TAMPERED, Outcome.TAMPERED, Outcome.FAILED]), tasks), 1) == []
    [decision] = watch.observe(regroup(episodes("a", "g2", [Outcome.FAILED]) + episodes("b", "g3", [Outcome.FAILED] * 4), tasks), 2)
    assert (decision.task_id, decision.step, decision.reason) == ("a", 2, "tamper rate 2/4 >= 0.5")
    assert watch.metrics() == {"audit/quarantined": 1, "audit/max_tamper_rate": 0.5}


def test_the_watch_resumes_its_counts_from_a_checkpoint() -> None:
    """Evidence seen before a crash still counts after the resume (the state goes through JSON)."""
    import json

    tasks = {"a": task("a")}
    before = TaskWatch(CONFIG)
    before.set_heldout({"code": 0.25})
    assert before.observe(regroup(episodes("a", "g1", [Outcome.TAMPERED, Outcome.FAILED, Outcome.FAILED]), tasks), 1) == []
    resumed = TaskWatch(CONFIG)
    resumed.load_state_dict(json.loads(json.dumps(before.state_dict())))
    assert resumed.heldout == {"code": 0.25}
    [decision] = resumed.observe(regroup(episodes("a", "g2", [Outcome.TAMPERED]), tasks), 2)
    assert decision.reason == "tamper rate 2/4 >= 0.5"  # 1 of 3 before the resume, 1 of 1 after
    fresh = TaskWatch(CONFIG)
    assert fresh.observe(regroup(episodes("a", "g2", [Outcome.TAMPERED]), tasks), 2) == []  # what a reset would miss
    again = TaskWatch(CONFIG)
    again.load_state_dict(json.loads(json.dumps(resumed.state_dict())))
    assert set(again.quarantined) == {"a"}


def test_short_all_pass_groups_count_only_when_the_reference_is_long() -> None:
    tasks = {"code": task("code"), "math": task("math", "math", reference="42")}
    watch = TaskWatch(CONFIG)
    for step in (1, 2):
        found = watch.observe(regroup(episodes("code", f"c{step}", [Outcome.PASSED] * 3, text="ok") +
                              episodes("math", f"m{step}", [Outcome.PASSED] * 3, text="42", domain="math"), tasks), step)
    assert [q.task_id for q in found] == ["code"]
    assert "code" in watch.quarantined and "math" not in watch.quarantined


def test_reward_far_above_heldout_quarantines() -> None:
    watch, tasks = TaskWatch(CONFIG), {"a": task("a")}
    watch.set_heldout({"code": 0.1, "overall": None})
    [decision] = watch.observe(regroup(episodes("a", "g", [Outcome.PASSED] * 4), tasks), 3)
    assert decision.reason.startswith("train reward 1.00 exceeds the held-out pass rate of code (0.10)")


def test_mixer_skips_excluded_tasks_and_keeps_them_in_its_state() -> None:
    tasks = [task(f"t{i}") for i in range(4)]
    mixer = TaskMixer({"code": tasks}, {"code": 1.0}, seed=0)
    mixer.exclude("t1")
    drawn = [t.id for t in mixer.sample(12)]
    assert "t1" not in drawn and len(drawn) == 12
    resumed = TaskMixer({"code": tasks}, {"code": 1.0}, seed=0)
    resumed.load_state_dict(mixer.state_dict())
    assert resumed.excluded == {"t1"}
    for other in ("t0", "t2", "t3"):
        resumed.exclude(other)
    assert resumed.sample(4) == []


def test_quarantine_file_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "q.json"
    write_quarantine(path, [("a", ["exploit: hackable"])], {"a": {"difficulty_estimate": 0.5}})
    assert load_quarantine(path) == {"a": ["exploit: hackable"]}
    (tmp_path / "list.json").write_text('["x", "y"]')
    assert load_quarantine(tmp_path / "list.json") == {"x": [], "y": []}
    (tmp_path / "bad.json").write_text('{"quarantined": [3]}')
    with pytest.raises(TidalError, match=r"quarantined\[0\]"):
        load_quarantine(tmp_path / "bad.json")
    with pytest.raises(TidalError, match="cannot read the quarantine list"):
        load_quarantine(tmp_path / "missing.json")


def test_training_never_gets_quarantined_tasks_and_eval_reports_them_apart(tmp_path: Path) -> None:
    domain = DomainConfig(family="math", n_train=6, n_eval=3)
    config = TidalConfig(tasks=TasksConfig(domains={"math": domain}))
    train, evaluation = build_tasks(config)
    banned = [train["math"][0].id, evaluation[0].id]
    write_quarantine(tmp_path / "q.json", [(task_id, ["test"]) for task_id in banned])
    config.tasks.quarantine = str(tmp_path / "q.json")
    train_after, evaluation_after = build_tasks(config)
    assert [t.id for t in train_after["math"]] == [t.id for t in train["math"][1:]]
    assert evaluation_after == evaluation  # still evaluated ...
    records = [{"task_id": t.id, "domain": "math", "quarantined": t.id in banned, "pass_rate": 1.0 if t.id in banned else 0.0,
                "passed": int(t.id in banned), "scored": 1} for t in evaluation]
    rates = pass_rates(records)  # ... but reported apart
    assert rates["math"]["pass_rate"] == 0.0 and rates["math"]["tasks"] == 2
    assert rates["quarantined"]["tasks"] == 1 and rates["quarantined"]["pass_rate"] == 1.0
    assert compare(records, records)["overall"]["n"] == 2
