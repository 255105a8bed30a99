"""reward layer: verifiers registered by name (`@verifier`), and the `Scorer` that runs them."""

from tidal.reward.registry import (
    ScoringContext,
    Verifier,
    get_batch_verifier,
    get_verifier,
    known_verifiers,
    verifier,
    verifier_entries,
)
from tidal.reward.scorer import Scorer, score_answer

__all__ = [
    "Scorer",
    "ScoringContext",
    "Verifier",
    "get_batch_verifier",
    "get_verifier",
    "known_verifiers",
    "score_answer",
    "verifier",
    "verifier_entries",
]
