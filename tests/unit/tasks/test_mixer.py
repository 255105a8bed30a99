from collections import Counter

import pytest

from tidal.tasks.mixer import TaskMixer
from tidal.types import Task


def _tasks(domain: str, n: int) -> list[Task]:
    return [
        Task(id=f"{domain}/{i}", domain=domain, prompt=f"q{i}", verifier={"name": "exact_match", "answer": "a"})
        for i in range(n)
    ]


def _mixer(seed: int = 0) -> TaskMixer:
    tasks = {"math": _tasks("math", 7), "code": _tasks("code", 5), "general": _tasks("general", 3)}
    return TaskMixer(tasks, {"math": 0.5, "code": 0.3, "general": 0.2}, seed)


def test_long_run_share_matches_weights_exactly() -> None:
    mixer = _mixer()
    counts: Counter[str] = Counter()
    for _ in range(10):
        counts.update(t.domain for t in mixer.sample(10))
    assert counts == {"math": 50, "code": 30, "general": 20}


def test_each_epoch_visits_every_task_once() -> None:
    mixer = TaskMixer({"math": _tasks("math", 7)}, {"math": 1.0}, seed=3)
    first = [t.id for t in mixer.sample(7)]
    assert sorted(first) == sorted(t.id for t in _tasks("math", 7))
    second = [t.id for t in mixer.sample(7)]
    assert sorted(second) == sorted(first) and second != first


def test_state_round_trip_continues_identically() -> None:
    a = _mixer(seed=5)
    for _ in range(3):
        a.sample(6)
    state = a.state_dict()
    expected = [[t.id for t in a.sample(6)] for _ in range(4)]
    b = _mixer(seed=5)
    b.load_state_dict(state)
    assert [[t.id for t in b.sample(6)] for _ in range(4)] == expected


def test_zero_weight_domain_is_never_sampled_and_bad_state_is_refused() -> None:
    mixer = TaskMixer({"math": _tasks("math", 3), "code": _tasks("code", 3)}, {"math": 1.0, "code": 0.0}, 0)
    assert {t.domain for t in mixer.sample(9)} == {"math"}
    with pytest.raises(ValueError, match="domains"):
        _mixer().load_state_dict(mixer.state_dict())
