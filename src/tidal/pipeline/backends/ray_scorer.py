"""The Ray backend's scorer actor, in a module of its own: a Ray worker imports the module that
defines an actor's class, and this one imports only the reward layer (the scorer, its sandbox
pool, the config and the task types), not torch or transformers. A scorer actor starts without
their seconds of imports and holds none of their memory: a scoring-only node of a cluster needs
no model libraries (tests/unit/pipeline/test_backends.py checks the
imports in a fresh interpreter)."""

from __future__ import annotations

import os

from tidal.config.schema import RewardConfig
from tidal.reward.scorer import Scorer
from tidal.types import Score, Task


class ScorerActor:
    """Scores (task, answer) pairs with its own `Scorer` and sandbox pool (a Ray actor)."""

    def __init__(self, config: RewardConfig) -> None:
        self.scorer = Scorer(config)

    def pid(self) -> int:
        return os.getpid()

    def score_many(self, items: list[tuple[Task, str | bytes]]) -> tuple[int, list[Score]]:
        return os.getpid(), self.scorer.score_many(items)

    def close(self) -> None:
        self.scorer.close()
