"""reward layer: verifiers registered by name (`@verifier`, `@reward_function` for plain
`(task, answer) -> float | Score` functions), and the `Scorer` that runs them."""

from tidal.reward.registry import (
    ScoringContext,
    Verifier,
    get_batch_verifier,
    get_verifier,
    known_verifiers,
    verifier,
    verifier_entries,
)
from tidal.reward.function import reward_function
from tidal.reward.scorer import Scorer, score_answer
from tidal.types import Outcome, Score

__all__ = [
    "Outcome",
    "Score",
    "Scorer",
    "ScoringContext",
    "Verifier",
    "get_batch_verifier",
    "get_verifier",
    "known_verifiers",
    "reward_function",
    "score_answer",
    "verifier",
    "verifier_entries",
]
