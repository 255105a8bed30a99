"""Score answers to tasks: pick the task's verifier, run it, cache the result, in parallel.

Scoring threads mostly wait on sandbox subprocesses, so a thread pool of `sandbox.workers` is
enough to keep that many sandboxes busy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

from tidal.config.schema import RewardConfig
from tidal.reward.registry import ScoringContext, decode_answer, get_verifier
from tidal.sandbox.base import SandboxBackend
from tidal.types import Outcome, Score, Task

# Outcomes that may change on a retry (a busy host, a flaky sandbox) are not cached.
UNCACHED = {Outcome.INFRA_ERROR, Outcome.TIMEOUT}


class Scorer:
    """Scores (task, answer) pairs with the verifiers the tasks name.

    `backend` overrides `config.sandbox.backend` with a ready backend instance (tests, pools).
    """

    def __init__(self, config: RewardConfig | None = None, backend: SandboxBackend | None = None) -> None:
        self.config = config or RewardConfig()
        sandbox = self.config.sandbox
        self.context = ScoringContext(
            backend=backend if backend is not None else sandbox.backend,
            timeout_s=sandbox.timeout_s,
            memory_mb=sandbox.memory_mb,
        )
        self._cache: dict[tuple[str, str], Score] = {}
        self._lock = threading.Lock()

    def score(self, task: Task, answer: str | bytes) -> Score:
        """The verifier's score of `answer`; bytes are decoded as UTF-8 (invalid bytes fail)."""
        key = (task.id, _digest(answer)) if self.config.cache else None
        if key is not None:
            with self._lock:
                cached = self._cache.get(key)
            if cached is not None:
                return _copy(cached)
        text = decode_answer(answer)
        score = text if isinstance(text, Score) else get_verifier(task.verifier.name)(task, text, self.context)
        if key is not None and score.outcome not in UNCACHED:
            with self._lock:
                self._cache[key] = _copy(score)
        return score

    def score_many(self, items: list[tuple[Task, str | bytes]]) -> list[Score]:
        """Scores in the order of `items`, up to `sandbox.workers` at a time."""
        if not items:
            return []
        workers = min(self.config.sandbox.workers, len(items))
        if workers == 1:
            return [self.score(task, answer) for task, answer in items]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tidal-score") as pool:
            return list(pool.map(lambda item: self.score(*item), items))

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()


def score_answer(task: Task, answer: str | bytes, config: RewardConfig | None = None) -> Score:
    """Score one answer (no cache kept between calls)."""
    return Scorer(config).score(task, answer)


def _digest(answer: str | bytes) -> str:
    data = answer if isinstance(answer, bytes) else answer.encode("utf-8", errors="surrogatepass")
    return hashlib.sha256(data).hexdigest()


def _copy(score: Score) -> Score:
    return dataclasses.replace(score, components=dict(score.components), info=dict(score.info))
