"""What scores answers, as the loop sees it: the run's `Scorer`, a pool of them, or Ray actors."""

from __future__ import annotations

from typing import Protocol

from tidal.types import Score, Task


class ScoringWorker(Protocol):
    def score_many(self, items: list[tuple[Task, str | bytes]]) -> list[Score]:
        """The scores of `items`, in their order (as `Scorer.score_many`)."""
        ...
