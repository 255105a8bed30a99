"""Scorer: dispatch by verifier name, cache, parallel scoring, hostile bytes."""

from __future__ import annotations

import os
import threading

import pytest

from tidal.config.schema import RewardConfig, SandboxConfig
from tidal.reward import Scorer, ScoringContext, base, registry, score_answer, verifier
from tidal.sandbox.pool import SandboxPool
from tidal.types import Outcome, Score, Task


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    registry._load_builtins()
    monkeypatch.setattr(base, "_VERIFIERS", dict(base._VERIFIERS))


def knowledge_task(task_id: str = "k/1", answer: str = "Paris") -> Task:
    return Task(id=task_id, domain="knowledge", prompt="?", verifier={"name": "exact_match", "answer": answer})


def test_scores_with_the_tasks_verifier() -> None:
    scorer = Scorer(RewardConfig())
    assert scorer.score(knowledge_task(), "paris").outcome is Outcome.PASSED
    assert scorer.score(knowledge_task(), "Lyon").outcome is Outcome.FAILED
    assert score_answer(knowledge_task(), b"Paris").value == 1.0


@pytest.mark.parametrize("answer", [b"\xff\xfe\x00binary", b"", "x".encode() * (1 << 20), "\0".encode()])
def test_hostile_bytes_fail_with_a_reason(answer: bytes) -> None:
    score = Scorer().score(knowledge_task(), answer)
    assert score.outcome is Outcome.FAILED and score.value == 0.0 and score.detail


def test_cache_reuses_scores_but_not_infra_errors(isolated_registry: None) -> None:
    calls: list[str] = []

    @verifier("counting")
    def counting(task: Task, answer: str, ctx: ScoringContext) -> Score:
        calls.append(answer)
        return Score(0.0, Outcome.INFRA_ERROR) if answer == "flaky" else Score(1.0, Outcome.PASSED)

    task = Task(id="c/1", domain="custom", prompt="?", verifier={"name": "counting"})
    scorer = Scorer(RewardConfig(cache=True))
    first = scorer.score(task, "a")
    first.components["mutated"] = 1.0  # a caller changing its copy does not change the cache
    assert scorer.score(task, "a").components == {}
    assert scorer.score(task, b"a").value == 1.0
    scorer.score(task, "flaky")
    scorer.score(task, "flaky")
    assert calls == ["a", "flaky", "flaky"]
    uncached = Scorer(RewardConfig(cache=False))
    uncached.score(task, "a")
    uncached.score(task, "a")
    assert calls.count("a") == 3


def test_score_many_keeps_order_and_runs_in_parallel(isolated_registry: None) -> None:
    barrier = threading.Barrier(3, timeout=10)  # passes only if three scorings run at once

    @verifier("meeting")
    def meeting(task: Task, answer: str, ctx: ScoringContext) -> Score:
        barrier.wait()
        return Score(float(answer) / 10, Outcome.FAILED)

    task = Task(id="m/1", domain="custom", prompt="?", verifier={"name": "meeting"})
    scorer = Scorer(RewardConfig(sandbox=SandboxConfig(workers=3), cache=False))
    scores = scorer.score_many([(task, str(i)) for i in range(6)])
    assert [s.value for s in scores] == [i / 10 for i in range(6)]


def test_context_carries_the_sandbox_config() -> None:
    scorer = Scorer(RewardConfig(sandbox=SandboxConfig(backend="unsafe_local", timeout_s=3, memory_mb=64)))
    assert scorer.context.backend == "unsafe_local"
    assert (scorer.context.timeout_s, scorer.context.memory_mb) == (3, 64)


def test_python_tests_through_the_scorer(sandboxed: ScoringContext) -> None:
    task = Task(
        id="code/double", domain="code", prompt="double(x)", verifier={"name": "python_tests"},
        tests={"test_solution.py": "from solution import double\ndef test_a():\n    assert double(2) == 4\n"},
    )
    with Scorer(RewardConfig(sandbox=SandboxConfig(workers=2)), backend=sandboxed.sandbox()) as scorer:
        good, bad = scorer.score_many([(task, "def double(x):\n    return 2 * x\n"), (task, "def double(x):\n    return x\n")])
    assert (good.outcome, bad.outcome) == (Outcome.PASSED, Outcome.FAILED)


def test_score_many_keeps_its_zygotes_warm_from_step_to_step(sandboxed: ScoringContext) -> None:
    def task(name: str, factor: int) -> Task:
        tests = f"from solution import f\ndef test_a():\n    assert f(3) == {3 * factor}\n"
        return Task(id=f"code/{name}", domain="code", prompt=name, verifier={"name": "python_tests"},
                    tests={"test_solution.py": tests})

    double, triple = task("double", 2), task("triple", 3)
    with Scorer(RewardConfig(sandbox=SandboxConfig(workers=1), cache=False), backend=sandboxed.sandbox()) as scorer:
        pool = scorer.context.sandbox()
        assert isinstance(pool, SandboxPool) and pool.size == 1  # reward.sandbox.workers
        steps = [scorer.score_many([(double, "def f(x):\n    return 2 * x\n"), (double, "def f(x):\n    return x\n")]),
                 scorer.score_many([(triple, "def f(x):\n    return 3 * x\n"), (triple, "def f(x):\n    return x\n")])]
        assert [[s.outcome for s in step] for step in steps] == [[Outcome.PASSED, Outcome.FAILED]] * 2
        assert pool.stats.started == 1 and pool.stats.jobs == 4  # one zygote served both tasks and steps
        (pid,) = pool.zygote_pids()
    assert pool.alive == 0 and not os.path.exists(f"/proc/{pid}")  # closed with the scorer, and reaped


def test_score_many_hands_each_tasks_answers_to_the_batch_form(isolated_registry: None) -> None:
    batches: list[tuple[str, list[str]]] = []

    def scoring(task: Task, answer: str, ctx: ScoringContext) -> Score:
        return Score(1.0 if answer == "good" else 0.0, Outcome.PASSED if answer == "good" else Outcome.FAILED)

    def scoring_batch(task: Task, answers: list[str], ctx: ScoringContext) -> list[Score]:
        batches.append((task.id, list(answers)))
        return [scoring(task, answer, ctx) for answer in answers]

    verifier("batched", batch=scoring_batch)(scoring)
    first = Task(id="b/1", domain="custom", prompt="?", verifier={"name": "batched"})
    second = Task(id="b/2", domain="custom", prompt="?", verifier={"name": "batched"})
    items: list[tuple[Task, str | bytes]] = [
        (first, "good"), (second, "bad"), (first, "bad"), (first, b"good"), (second, "good"), (first, b"\xff"),
        (second, "other"),
    ]
    scorer = Scorer(RewardConfig(sandbox=SandboxConfig(workers=2)))
    scores = scorer.score_many(items)
    assert [s.value for s in scores] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert scores[5].outcome is Outcome.FAILED and "UTF-8" in scores[5].detail
    assert sorted(batches) == [("b/1", ["good", "bad"]), ("b/2", ["bad", "good", "other"])]  # duplicates once

    batches.clear()  # one task, more workers than tasks: its answers are split so both workers are busy
    answers = [f"answer {i}" for i in range(8)]
    Scorer(RewardConfig(sandbox=SandboxConfig(workers=2))).score_many([(first, a) for a in answers])
    assert sorted(len(group) for _, group in batches) == [4, 4]
    assert sorted(a for _, group in batches for a in group) == sorted(answers)

    batches.clear()  # without the cache, nothing is shared, not even within a call
    Scorer(RewardConfig(cache=False)).score_many([(first, "good"), (first, "good"), (first, "bad")])
    assert batches == [("b/1", ["good", "good", "bad"])]
