"""algos layer: advantage estimators and policy losses, picked by name from plain dicts."""

from tidal.algos.advantages import ADVANTAGES, assign_advantages, get_advantage, has_valid_reward
from tidal.algos.losses import (
    LOSSES,
    aggregate,
    entropy_from_logits,
    get_loss,
    kl_penalty,
    loss_denominator,
    ppo_clip_loss,
)

__all__ = [
    "ADVANTAGES",
    "LOSSES",
    "aggregate",
    "assign_advantages",
    "entropy_from_logits",
    "get_advantage",
    "get_loss",
    "has_valid_reward",
    "kl_penalty",
    "loss_denominator",
    "ppo_clip_loss",
]
