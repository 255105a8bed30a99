"""PPO's per-token advantages from a value model: token rewards, GAE, whitening, the value loss.

`gae_advantages` is the `gae` advantage estimator (`ADVANTAGES["gae"]`). Unlike the group
estimators (tidal.algos.advantages) it needs the value model's predictions, which only the
trainer has: it is registered as needing a critic, so the trainer builds the value model and
runs it inside `Trainer.rl_step`, while the loop's `assign_advantages` leaves it alone.

Positions follow the trainer's (B, T) layout: values[:, t] is V of the prefix before token t,
predicting the return from token t on, so it lines up with logprobs[:, t] and the mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

EPS = 1e-8


def token_rewards(sequence_rewards: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """Per-token rewards (B, T): the sequence reward (B,) at each row's last masked token, minus
    kl_coef * kl_t (B, T) on every masked token when the KL is in the reward (InstructGPT)."""
    batch, length = mask.shape
    positions = torch.arange(length, device=mask.device).expand(batch, length)  # (B, T)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values  # (B,)
    rewards = torch.zeros(batch, length, dtype=mask.dtype, device=mask.device)  # (B, T)
    rows = torch.nonzero(last >= 0).squeeze(-1)  # rows with at least one trained token
    rewards[rows, last[rows]] = sequence_rewards[rows].to(mask.dtype)
    if kl is not None:
        rewards = rewards - kl_coef * kl.to(mask.dtype)
    return torch.where(mask > 0, rewards, torch.zeros_like(rewards))


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over the masked tokens of each row.

    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}, where t+1 is
    the next *masked* token of the row (unmasked positions, such as tool output between turns,
    are skipped) and V = 0 after the last one: every completion is a finished episode, including
    one cut at max_new_tokens (the gate drops those by default). Returns (advantages, returns),
    (B, T) each, 0 off the mask; returns = advantages + values are the value model's targets.
    """
    batch, length = rewards.shape
    advantages = torch.zeros_like(rewards)  # (B, T)
    next_value = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)  # (B,)
    next_advantage = torch.zeros_like(next_value)  # (B,)
    for t in reversed(range(length)):
        on = mask[:, t] > 0  # (B,)
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
        advantage = delta + gamma * lam * next_advantage  # (B,)
        advantages[:, t] = torch.where(on, advantage, torch.zeros_like(advantage))
        next_value = torch.where(on, values[:, t], next_value)
        next_advantage = torch.where(on, advantage, next_advantage)
    values = torch.where(mask > 0, values, torch.zeros_like(values))
    return advantages, advantages + values * (mask > 0)


def gae_advantages(
    rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float, kl: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """PPO's advantages (Schulman et al. 2017), (B, T) each: the sequence rewards (B,) placed on
    each row's last masked token (minus kl_coef * kl (B, T) per token when the KL is in the
    reward), GAE over the value model's `values` (B, T), then whitened over the batch's masked
    tokens. Returns (advantages, returns); the returns, not whitened, are the value targets."""
    per_token = token_rewards(rewards, mask, kl, kl_coef)  # (B, T)
    advantages, returns = gae(per_token, values, mask, gamma, lam)  # (B, T) each
    return whiten(advantages, mask), returns


def whiten(values: Tensor, mask: Tensor) -> Tensor:
    """(values - mean) / (std + eps) over the masked tokens of the whole batch, 0 off the mask.

    As in PPO implementations (baselines, TRL, OpenRLHF) the advantages are whitened over the
    batch's tokens; the std is the population one (TRL uses the unbiased one).
    """
    weights = (mask > 0).to(values.dtype)  # (B, T)
    count = weights.sum().clamp(min=1)
    mean = (values * weights).sum() / count
    std = ((((values - mean) * weights) ** 2).sum() / count).sqrt()
    return (values - mean) * weights / (std + EPS)


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float) -> Tensor:
    """PPO's clipped value loss per token (B, T): 0.5 * max((V - R)^2, (V_clip - R)^2), where
    V_clip = V_old + clip(V - V_old, -clip, clip) keeps the value near its sampled-time estimate."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)  # (B, T)
    return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens: 1 = perfect values, 0 = no better than the
    mean, negative = worse. 0 when the returns do not vary (nothing to explain)."""
    weights = (mask > 0).to(returns.dtype)
    count = float(weights.sum())
    if count == 0:
        return 0.0

    def variance(x: Tensor) -> float:
        mean = (x * weights).sum() / count
        return float((((x - mean) * weights) ** 2).sum() / count)

    total = variance(returns)
    if total <= 0:
        return 0.0
    return 1.0 - variance(returns - values) / total
