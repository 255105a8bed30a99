"""algos layer: advantage estimators and policy losses, picked by name from plain dicts."""

from tidal.algos.advantages import (
    ADVANTAGES,
    assign_advantages,
    episode_reward,
    get_advantage,
    has_valid_reward,
    reinforce_pp,
)
from tidal.algos.gae import (
    clipped_value_loss,
    explained_variance,
    gae,
    token_rewards,
    whiten,
)
from tidal.algos.kl import KLController, kl_adjusted_advantages
from tidal.algos.losses import (
    KL_ESTIMATORS,
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
    token_advantages,
)

__all__ = [
    "ADVANTAGES",
    "KL_ESTIMATORS",
    "LOSSES",
    "LOSS_INPUTS",
    "KLController",
    "aggregate",
    "assign_advantages",
    "clipped_value_loss",
    "decoupled_ppo_loss",
    "entropy_from_logits",
    "episode_reward",
    "explained_variance",
    "gae",
    "get_advantage",
    "get_loss",
    "has_valid_reward",
    "kl_adjusted_advantages",
    "kl_penalty",
    "loss_denominator",
    "ppo_clip_loss",
    "reinforce_pp",
    "tis_pg_loss",
    "token_advantages",
    "token_rewards",
    "whiten",
]
