"""The KL-to-reference coefficient (fixed or adaptive) and the KL taken from the reward.

`algorithm.kl_in` picks where the KL to the reference enters:

- "loss" (GRPO): kl_coef * KL(policy || reference), estimated on the current policy's logprobs
  with `kl_estimator`, is added to the loss and differentiated.
- "reward" (Ziegler et al. 2019, InstructGPT): the per-token k1 of the *sampler's* logprobs,
  kl_t = log pi_old(a_t) - log pi_ref(a_t), is a constant cost taken from the reward: for `gae`
  it is the per-token reward -kl_coef * kl_t (the sequence reward is added at the last token;
  see `tidal.algos.gae.token_rewards`), so GAE sums the KL still to come into each advantage;
  for the group estimators, whose advantage is computed per sequence before the trainer sees
  the batch, it is `kl_adjusted_advantages`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from tidal.algos.losses import token_advantages


def kl_adjusted_advantages(advantages: Tensor, kl: Tensor, mask: Tensor, coef: float) -> Tensor:
    """Per-token advantages (B, T) = A - coef * kl_t for the group estimators with kl_in=reward.

    `advantages` (B,) are the estimator's (already normalised, e.g. GRPO's / std), `kl` (B, T)
    the per-token k1 of the sampler to the reference (no gradient). Each token is charged only
    its own KL, not the KL of the tokens after it as a sequence-level return would be (REINFORCE++
    proper): the sequence reward is consumed by the estimator before the trainer sees the batch,
    so the KL cannot enter the baseline or the normalisation, and the token's own cost is the
    lowest-variance term that still pushes each sampled token toward the reference. With
    `gae` the KL is a real per-token reward instead (see the module docstring).
    """
    adjusted = token_advantages(advantages, mask) - coef * kl.to(mask.dtype)  # (B, T)
    return torch.where(mask > 0, adjusted, torch.zeros_like(adjusted))


class KLController:
    """The KL coefficient: fixed, or adapted toward `target` (Ziegler et al. 2019, section 2.2).

    After each step, with e = clip(kl / target - 1, -0.2, 0.2) and n sequences in the batch,
    coef <- coef * (1 + e * n / horizon): up when the measured KL exceeds the target, down when
    below, by at most 20% of n / horizon per step. As in the paper (and TRL's
    AdaptiveKLController) the horizon counts sequences; unlike it, `kl` is the mean per-token KL
    of the step (the `kl` metric), not a per-sequence sum, so the target does not depend on the
    completion length.
    """

    def __init__(self, coef: float, target: float | None = None, horizon: int = 10_000) -> None:
        if coef < 0:
            raise ValueError(f"KL coefficient must be >= 0, got {coef}")
        if target is not None and (target <= 0 or coef <= 0):
            raise ValueError(f"adaptive KL needs target > 0 and a starting coefficient > 0, got {target}, {coef}")
        if horizon < 1:
            raise ValueError(f"KL horizon must be >= 1, got {horizon}")
        self.value = float(coef)
        self.target = target
        self.horizon = horizon

    @property
    def adaptive(self) -> bool:
        """Whether `update` moves the coefficient."""
        return self.target is not None

    def update(self, kl: float, num_sequences: int) -> None:
        """Move the coefficient after a step that measured mean per-token KL `kl` over
        `num_sequences` sequences; a non-finite measurement (a skipped update) moves nothing."""
        if self.target is None or not math.isfinite(kl):
            return
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * num_sequences / self.horizon

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the current coefficient (the target and horizon come from the config)."""
        return {"kl_coef": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["kl_coef"])
