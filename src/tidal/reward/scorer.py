"""Score answers to tasks: pick the task's verifier, run it, cache the result, in parallel.

Scoring threads mostly wait on sandbox subprocesses, so a thread pool of `sandbox.workers` is
enough to keep that many sandboxes busy. `score_many` hands the answers to one task to the
verifier's batch form when it has one (python_tests: forked children of a warm zygote, not one
sandbox per answer). A `ZygoteBackend` (bwrap) is wrapped in a `SandboxPool` of
`sandbox.workers` zygotes that lives as long as the scorer (or until idle), so RL steps after the
first find pytest already imported; `close` (or leaving a `with` block) shuts it down.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tidal.config.schema import RewardConfig
from tidal.reward.registry import (
    BatchVerifier,
    ScoringContext,
    decode_answer,
    get_batch_verifier,
    get_verifier,
)
from tidal.sandbox.base import SandboxBackend
from tidal.sandbox.batch import ZygoteBackend
from tidal.sandbox.pool import SandboxPool
from tidal.types import Outcome, Score, Task

# Outcomes that may change on a retry (a busy host, a flaky sandbox) are not cached.
UNCACHED = {Outcome.INFRA_ERROR, Outcome.TIMEOUT}
MIN_BATCH = 2  # answers per batch below which a task's answers are not split further across workers


class Scorer:
    """Scores (task, answer) pairs with the verifiers the tasks name.

    `backend` overrides `config.sandbox.backend` with a ready backend instance (tests, pools);
    either way, a backend that can open zygotes is used through a `SandboxPool` of
    `sandbox.workers` warm zygotes (one pool per environment image).
    """

    def __init__(self, config: RewardConfig | None = None, backend: SandboxBackend | None = None) -> None:
        self.config = config or RewardConfig()
        sandbox = self.config.sandbox
        self.context = PooledContext(
            backend=backend if backend is not None else sandbox.backend,
            timeout_s=sandbox.timeout_s,
            memory_mb=sandbox.memory_mb,
            pool_size=sandbox.workers,
        )
        self._cache: dict[tuple[str, str, str], Score] = {}
        self._lock = threading.Lock()

    def score(self, task: Task, answer: str | bytes) -> Score:
        """The verifier's score of `answer`; bytes are decoded as UTF-8 (invalid bytes fail)."""
        cached = self._cached(task, answer)
        if cached is not None:
            return cached
        text = decode_answer(answer)
        score = text if isinstance(text, Score) else get_verifier(task.verifier.name)(task, text, self.context)
        self._remember(task, answer, score)
        return score

    def score_many(self, items: list[tuple[Task, str | bytes]]) -> list[Score]:
        """Scores in the order of `items`, up to `sandbox.workers` scoring jobs at a time.

        The answers to one task (same id) whose verifier has a batch form are scored together, one
        sandbox for the lot instead of one each (split in up to `workers` parts when there are
        fewer tasks than workers); with the cache on, identical answers to a task are scored once.
        """
        if not items:
            return []
        scores: list[Score | None] = [None] * len(items)
        units: list[Callable[[], list[tuple[list[int], Score]]]] = []
        groups: dict[str, _Group] = {}
        for index, (task, answer) in enumerate(items):
            batch = get_batch_verifier(task.verifier.name)
            group = groups.get(task.id)
            if batch is None or (group is not None and task is not group.task and task != group.task):
                units.append(functools.partial(self._score_one, index, task, answer))
                continue
            cached = self._cached(task, answer)
            if cached is not None:
                scores[index] = cached
                continue
            text = decode_answer(answer)
            if isinstance(text, Score):
                scores[index] = text
                continue
            group = groups.setdefault(task.id, _Group(task, batch))
            key = _digest(answer) if self.config.cache else str(index)
            group.answers.setdefault(key, (text, []))[1].append(index)
        batches = [group for group in groups.values() if len(group.answers) > 1]
        for group in groups.values():
            distinct = list(group.answers.values())
            parts = max(1, min(self.config.sandbox.workers // max(1, len(batches)), len(distinct) // MIN_BATCH))
            for part in range(parts):
                units.append(functools.partial(self._score_group, group, distinct[part::parts]))

        workers = min(self.config.sandbox.workers, len(units))
        if workers <= 1:
            done = [unit() for unit in units]
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tidal-score") as pool:
                done = list(pool.map(lambda unit: unit(), units))
        for unit_scores in done:
            for indices, score in unit_scores:
                for index in indices:
                    scores[index] = score if index == indices[0] else _copy(score)
        assert all(score is not None for score in scores)
        return scores  # type: ignore[return-value]

    def _score_one(self, index: int, task: Task, answer: str | bytes) -> list[tuple[list[int], Score]]:
        return [([index], self.score(task, answer))]

    def _score_group(self, group: _Group, answers: list[tuple[str, list[int]]]) -> list[tuple[list[int], Score]]:
        """Distinct answers to one task, with the item indices of each: their scores (cached)."""
        texts = [text for text, _ in answers]
        # A lone distinct answer (a sharp policy's group is often one answer 8 times) goes through
        # the batch form too: with a warm pool that is a fork, not a cold sandbox.
        scores = group.batch(group.task, texts, self.context)
        for text, score in zip(texts, scores):
            self._remember(group.task, text, score)
        return [(indices, score) for (_, indices), score in zip(answers, scores)]

    def _cached(self, task: Task, answer: str | bytes) -> Score | None:
        if not self.config.cache:
            return None
        with self._lock:
            cached = self._cache.get(_cache_key(task, answer))
        return _copy(cached) if cached is not None else None

    def _remember(self, task: Task, answer: str | bytes, score: Score) -> None:
        if self.config.cache and score.outcome not in UNCACHED:
            with self._lock:
                self._cache[_cache_key(task, answer)] = _copy(score)

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    def close(self) -> None:
        """Shut down the warm sandboxes (waiting for running jobs). Scoring again opens new ones."""
        self.context.close()

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class PooledContext(ScoringContext):
    """A scoring context that hands out each `ZygoteBackend` wrapped in a `SandboxPool` of
    `pool_size` zygotes, the same pool every time; other backends as they are."""

    pool_size: int = 2
    # Backend id -> what to hand out for it (its pool, or itself), decided on its first use. Each
    # value holds its backend, so an id here cannot be reused by another backend.
    _handed: dict[int, SandboxBackend] = field(default_factory=dict, init=False, repr=False, compare=False)
    _pool_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def sandbox(self, image: str | None = None) -> SandboxBackend:
        backend = super().sandbox(image)
        handed = self._handed.get(id(backend))  # no lock and no protocol check once decided
        if handed is not None:
            return handed
        with self._pool_lock:
            handed = self._handed.get(id(backend))
            if handed is None:
                handed = SandboxPool(backend, self.pool_size) if isinstance(backend, ZygoteBackend) else backend
                self._handed[id(backend)] = handed
            return handed

    def close(self) -> None:
        """Close every pool handed out; later calls get new ones."""
        with self._pool_lock:
            handed, self._handed = list(self._handed.values()), {}
        for backend in handed:
            if isinstance(backend, SandboxPool):
                backend.close()


@dataclass
class _Group:
    """The distinct answers to one task, each with the indices of the items that hold it."""

    task: Task
    batch: BatchVerifier
    answers: dict[str, tuple[str, list[int]]] = field(default_factory=dict)


def score_answer(task: Task, answer: str | bytes, config: RewardConfig | None = None) -> Score:
    """Score one answer (no cache kept between calls)."""
    return Scorer(config).score(task, answer)


def _cache_key(task: Task, answer: str | bytes) -> tuple[str, str, str]:
    """A score depends on the task, its verifier (a domain's sub-reward scores one task with
    several) and the answer."""
    return task.id, task.verifier.model_dump_json(), _digest(answer)


def _digest(answer: str | bytes) -> str:
    data = answer if isinstance(answer, bytes) else answer.encode("utf-8", errors="surrogatepass")
    return hashlib.sha256(data).hexdigest()


def _copy(score: Score) -> Score:
    return dataclasses.replace(score, components=dict(score.components), info=dict(score.info))
