"""algos layer: advantage estimators and policy losses, picked by name from plain dicts."""

from tidal.algos.advantages import (
    ADVANTAGES,
    assign_advantages,
    get_advantage,
    has_valid_reward,
)
from tidal.algos.losses import (
    LOSS_INPUTS,
    LOSSES,
    aggregate,
    decoupled_ppo_loss,
    entropy_from_logits,
    get_loss,
    kl_penalty,
    loss_denominator,
    ppo_clip_loss,
    tis_pg_loss,
)

__all__ = [
    "ADVANTAGES",
    "LOSSES",
    "LOSS_INPUTS",
    "aggregate",
    "assign_advantages",
    "decoupled_ppo_loss",
    "entropy_from_logits",
    "get_advantage",
    "get_loss",
    "has_valid_reward",
    "kl_penalty",
    "loss_denominator",
    "ppo_clip_loss",
    "tis_pg_loss",
]
