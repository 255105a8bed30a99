"""Advantage estimators, picked by name from `ADVANTAGES`, in two kinds.

A group estimator (`GROUP_ADVANTAGES`) takes the rewards of G groups of n samples of the same
prompt and a mask of the samples whose reward is valid (scored, not an infrastructure error).
Invalid samples get advantage 0 and are left out of their group's baseline; a group with fewer
valid samples than the estimator needs gets advantage 0 throughout. The (G, n) input is the whole
batch, so an estimator may also normalise across groups (`reinforce_pp`). The loop runs it
(`assign_advantages`) and each episode carries its advantage to the update.

A critic estimator (`CRITIC_ADVANTAGES`: `gae`) needs a value model's predictions and gives
per-token advantages: being registered there is its declaration that it needs the value model,
so the trainer builds one for it (`needs_critic`) and runs it in the update (tidal.algos.gae).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor

from tidal.algos.gae import gae_advantages
from tidal.errors import UnknownNameError
from tidal.types import Episode, Group, Outcome

GroupEstimator = Callable[[Tensor, Tensor], Tensor]  # rewards (G, n), valid mask (G, n) -> advantages (G, n)


class CriticEstimator(Protocol):
    """Sequence rewards (B,), the value model's values (B, T) and the trained tokens' mask (B, T)
    -> per-token (advantages, returns), (B, T) each; `kl` (B, T) is the per-token KL taken from
    the reward (kl_in=reward)."""

    def __call__(
        self, rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float, kl: Tensor | None = None,
        kl_coef: float = 0.0,
    ) -> tuple[Tensor, Tensor]: ...


EPS = 1e-6


def _masked_mean(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per-group mean over the valid samples, and the number of valid samples."""
    weights = mask.to(values.dtype)  # (G, n)
    count = weights.sum(dim=-1, keepdim=True)  # (G, 1)
    mean = (values * weights).sum(dim=-1, keepdim=True) / count.clamp(min=1)  # (G, 1)
    return mean, count


def _clean(rewards: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    # An invalid sample may carry NaN; zero it so it cannot leak into sums.
    mask = mask.bool()
    values = rewards if rewards.is_floating_point() else rewards.float()
    return torch.where(mask, values, torch.zeros_like(values)), mask


def grpo(rewards: Tensor, mask: Tensor) -> Tensor:
    """GRPO (Shao et al., 2024): (r - group mean) / (group std + eps).

    Differs from the paper: the std is the population std (divide by n, not n - 1), so a group
    of one valid sample gets advantage 0 instead of a division by zero.
    """
    rewards, mask = _clean(rewards, mask)  # (G, n)
    mean, count = _masked_mean(rewards, mask)
    centred = (rewards - mean) * mask  # (G, n)
    std = ((centred**2).sum(dim=-1, keepdim=True) / count.clamp(min=1)).sqrt()  # (G, 1)
    return centred / (std + EPS)


def dr_grpo(rewards: Tensor, mask: Tensor) -> Tensor:
    """Dr. GRPO (Liu et al., 2025): r - group mean, without the std division of GRPO.

    The paper's other change, normalising the loss by a constant instead of the sequence length,
    is the `token_sum` aggregation of the loss, chosen separately.
    """
    rewards, mask = _clean(rewards, mask)
    mean, _ = _masked_mean(rewards, mask)
    return (rewards - mean) * mask


def rloo(rewards: Tensor, mask: Tensor) -> Tensor:
    """RLOO (Ahmadian et al., 2024): r - mean of the other valid samples of the group.

    As in the paper, k valid samples give k/(k-1) * (r - mean); a group with one valid sample
    has no baseline and gets 0.
    """
    rewards, mask = _clean(rewards, mask)
    total = (rewards * mask).sum(dim=-1, keepdim=True)  # (G, 1)
    count = mask.sum(dim=-1, keepdim=True).to(rewards.dtype)  # (G, 1)
    others = (total - rewards) / (count - 1).clamp(min=1)  # (G, n)
    has_baseline = mask & (count > 1)
    return torch.where(has_baseline, rewards - others, torch.zeros_like(rewards))


def reinforce_pp(rewards: Tensor, mask: Tensor) -> Tensor:
    """REINFORCE++-baseline (Hu et al., 2025): r - group mean, then whitened over the whole batch.

    The group mean removes the prompt's difficulty; the batch mean and population std (over all
    valid samples of all groups) set the scale, so unlike GRPO a group with a small spread of
    rewards is not blown up to unit scale. Differs from the paper's implementation (OpenRLHF),
    which whitens over the batch's tokens: here each sequence counts once. The paper's KL term
    is chosen separately (`algorithm.kl_in`, `kl_estimator`).
    """
    rewards, mask = _clean(rewards, mask)  # (G, n)
    mean, _ = _masked_mean(rewards, mask)
    centred = (rewards - mean) * mask  # (G, n)
    weights = mask.to(centred.dtype)
    count = weights.sum().clamp(min=1)
    batch_mean = (centred * weights).sum() / count
    batch_std = ((((centred - batch_mean) * weights) ** 2).sum() / count).sqrt()
    return (centred - batch_mean) * weights / (batch_std + EPS)


GROUP_ADVANTAGES: dict[str, GroupEstimator] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
}
# These need a value model: the trainer builds one when the run's estimator is among them.
CRITIC_ADVANTAGES: dict[str, CriticEstimator] = {
    "gae": gae_advantages,
}
ADVANTAGES: dict[str, GroupEstimator | CriticEstimator] = {**GROUP_ADVANTAGES, **CRITIC_ADVANTAGES}


def register_advantage(name: str, function: GroupEstimator) -> None:
    """Make `function(rewards (G, n), valid mask (G, n)) -> advantages (G, n)` the group
    estimator `name` (`algorithm.advantage: name`). Invalid samples must get 0 (see the module
    docstring); critic estimators are built in only (the trainer owns the value model)."""
    if not name.isidentifier():
        raise ValueError(f"advantage estimator name {name!r} must be an identifier")
    existing = ADVANTAGES.get(name)
    if existing is not None and existing is not function:
        raise ValueError(f"advantage estimator {name!r} is already registered by {existing.__module__}")
    GROUP_ADVANTAGES[name] = function
    ADVANTAGES[name] = function


def advantage(name: str) -> Callable[[GroupEstimator], GroupEstimator]:
    """Decorator form of `register_advantage`."""

    def decorate(function: GroupEstimator) -> GroupEstimator:
        register_advantage(name, function)
        return function

    return decorate


def _load_plugins() -> None:
    # Installed entry points of group tidal.advantages: a module registers with @advantage; a
    # function is registered under the entry point's name.
    from tidal import plugins

    for name, loaded in plugins.entry_point_objects("tidal.advantages"):
        if callable(loaded) and not isinstance(loaded, type(plugins)) and ADVANTAGES.get(name) is not loaded:
            register_advantage(name, loaded)


def known_advantages() -> list[str]:
    """Every registered estimator, plugins included."""
    _load_plugins()
    return sorted(ADVANTAGES)


def get_advantage(name: str) -> GroupEstimator | CriticEstimator:
    """The estimator registered under `name`; an unknown name raises with the known ones."""
    _load_plugins()
    if name not in ADVANTAGES:
        raise UnknownNameError("advantage estimator", name, list(ADVANTAGES))
    return ADVANTAGES[name]


def needs_critic(name: str) -> bool:
    """Whether estimator `name` needs a value model (it is a `CRITIC_ADVANTAGES` one); an
    unknown name raises with the known ones."""
    get_advantage(name)
    return name in CRITIC_ADVANTAGES


def episode_reward(episode: Episode) -> float | None:
    """The reward to train on: `episode.reward` when the loop set one (e.g. normalised), else the
    score's value; None when the episode is not scored."""
    if episode.reward is not None:
        return float(episode.reward)
    return None if episode.score is None else float(episode.score.value)


def has_valid_reward(episode: Episode) -> bool:
    """Whether the episode's reward may train: scored, finite, and not an infrastructure error."""
    score = episode.score
    if score is None or score.outcome == Outcome.INFRA_ERROR:
        return False
    return math.isfinite(episode_reward(episode))  # type: ignore[arg-type]


def group_rewards(groups: Sequence[Group]) -> tuple[Tensor, Tensor]:
    """The rewards (G, n) of `groups` (`episode_reward`, 0 where invalid) and the mask (G, n) of
    the valid ones (`has_valid_reward`); ragged groups are padded with invalid samples."""
    width = max((len(group.episodes) for group in groups), default=0)
    rewards = torch.zeros(len(groups), width)  # (G, n)
    mask = torch.zeros(len(groups), width, dtype=torch.bool)  # (G, n)
    for g, group in enumerate(groups):
        for i, episode in enumerate(group.episodes):
            if has_valid_reward(episode):
                rewards[g, i] = episode_reward(episode)  # type: ignore[assignment]
                mask[g, i] = True
    return rewards, mask


def assign_advantages(groups: Sequence[Group], name: str) -> None:
    """Set `episode.advantage` for every episode of `groups` with the group estimator `name`; the
    baseline of each is taken within its group (all its episodes, kept or not).

    Episodes without a valid reward (see `has_valid_reward`) get 0 and stay out of the baseline.
    For an estimator that needs a critic (`needs_critic`) this does nothing: its advantages are
    per token and computed in the update from `TrainBatch.rewards`, so `Episode.advantage` is
    not set and not trained on.
    """
    if needs_critic(name) or not groups:
        return
    rewards, mask = group_rewards(groups)  # (G, n) each
    advantages = GROUP_ADVANTAGES[name](rewards, mask)  # (G, n)
    for g, group in enumerate(groups):
        for i, episode in enumerate(group.episodes):
            episode.advantage = float(advantages[g, i]) if mask[g, i] else 0.0
