"""Policy losses and the per-token terms added to them (KL to a reference, entropy).

A loss is computed per token and then aggregated over the completion tokens of the batch in one
of three ways (`aggregate`). When the trainer splits a batch into micro-batches it passes the
whole batch's `denominator` (see `loss_denominator`), so the micro-batch losses sum to the loss
of the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from tidal.errors import UnknownNameError

Aggregation = Literal["token", "sequence", "token_sum"]
AGGREGATIONS: tuple[str, ...] = ("token", "sequence", "token_sum")


def loss_denominator(mask: Tensor, aggregation: Aggregation) -> float:
    """The normaliser of `aggregate` for this mask: masked tokens (token) or sequences (others)."""
    if aggregation == "token":
        return float(mask.sum())
    if aggregation in ("sequence", "token_sum"):
        return float(mask.shape[0])
    raise UnknownNameError("loss aggregation", aggregation, list(AGGREGATIONS))


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    aggregation: Aggregation,
    max_tokens: int | None = None,
    denominator: float | None = None,
) -> Tensor:
    """Reduce a per-token loss (B, T) over the masked tokens to a scalar.

    token: sum over all masked tokens / their number (long answers weigh more, DAPO).
    sequence: mean over sequences of each sequence's token mean (the original GRPO).
    token_sum: sum over all masked tokens / (max_tokens * B), a constant (Dr. GRPO).
    `denominator` replaces this batch's own normaliser (tokens for token, B otherwise).
    """
    mask = mask.to(per_token.dtype)  # (B, T)
    # where, not a product alone: padding positions may hold inf or NaN.
    weighted = torch.where(mask > 0, per_token * mask, torch.zeros_like(per_token))  # (B, T)
    if aggregation == "token":
        numerator = weighted.sum()
    elif aggregation == "sequence":
        lengths = mask.sum(dim=-1).clamp(min=1)  # (B,)
        numerator = (weighted.sum(dim=-1) / lengths).sum()
    elif aggregation == "token_sum":
        if max_tokens is None or max_tokens <= 0:
            raise ValueError("aggregation 'token_sum' needs max_tokens > 0 (the generation budget)")
        numerator = weighted.sum() / max_tokens
    else:
        raise UnknownNameError("loss aggregation", aggregation, list(AGGREGATIONS))
    if denominator is None:
        denominator = loss_denominator(mask, aggregation)
    return numerator / max(denominator, 1.0)


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    count = float(mask.sum())
    return float((values * mask).sum()) / count if count > 0 else 0.0


def token_advantages(advantages: Tensor, mask: Tensor) -> Tensor:
    """Advantages of shape (B,) (one per sequence) or (B, T) (per token) as (B, T), 0 off the mask.

    The zeros off the mask matter for per-token advantages: padding may hold NaN, and NaN * 0 in
    a backward pass is NaN.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # (B, 1)
    elif advantages.shape != mask.shape:
        raise ValueError(f"advantages of shape {tuple(advantages.shape)}: expected (B,) or (B, T) = {tuple(mask.shape)}")
    advantages = advantages.to(mask.dtype).expand_as(mask)  # (B, T)
    return torch.where(mask > 0, advantages, torch.zeros_like(advantages))


def _clipped_surrogate(
    logprobs: Tensor, anchor: Tensor, advantages: Tensor, mask: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO's per-token clipped surrogate around `anchor`: (per_token, ratio, log_ratio, adv), (B, T)
    each. 0 off the mask, where padding may hold anything, keeps exp finite."""
    log_ratio = torch.where(mask > 0, logprobs - anchor, torch.zeros_like(logprobs))  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    adv = token_advantages(advantages, mask)  # (B, T)
    unclipped = ratio * adv  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv  # (B, T)
    return -torch.minimum(unclipped, clipped), ratio, log_ratio, adv


def _clip_metrics(ratio: Tensor, log_ratio: Tensor, adv: Tensor, mask: Tensor, clip_low: float, clip_high: float) -> dict[str, float]:
    with torch.no_grad():
        low = ((ratio < 1.0 - clip_low) & (adv < 0)).to(mask.dtype)  # (B, T)
        high = ((ratio > 1.0 + clip_high) & (adv > 0)).to(mask.dtype)  # (B, T)
        return {
            "clip_low_frac": _masked_mean(low, mask),
            "clip_high_frac": _masked_mean(high, mask),
            "ratio_mean": _masked_mean(ratio, mask),
            "approx_kl": _masked_mean((ratio - 1.0) - log_ratio, mask),
        }


def _truncated_weight(log_weight: Tensor, mask: Tensor, is_cap: float) -> tuple[Tensor, dict[str, float]]:
    """exp(log_weight) truncated at `is_cap`, held constant (no gradient), and its metrics."""
    if not is_cap >= 1.0:
        raise ValueError(f"is_cap={is_cap} must be >= 1 (1 = no importance weighting above 1)")
    with torch.no_grad():
        raw = torch.exp(torch.where(mask > 0, log_weight, torch.zeros_like(log_weight)))  # (B, T)
        weight = raw.clamp(max=is_cap)  # (B, T)
        metrics = {"is_weight_mean": _masked_mean(weight, mask), "is_truncated_frac": _masked_mean((raw > is_cap).to(mask.dtype), mask)}
    return weight, metrics


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    aggregation: Aggregation = "token",
    max_tokens: int | None = None,
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped surrogate with separate lower and upper clip ranges.

    Differs from PPO (Schulman et al., 2017) by the asymmetric range [1 - clip_low,
    1 + clip_high] ("clip-higher", DAPO) that leaves low-probability tokens room to grow.
    Shapes: logprobs, old_logprobs, mask (B, T); advantages (B,) or (B, T) (per token, e.g. GAE).
    Metrics are token means over
    the masked tokens of this batch: `clip_low_frac`/`clip_high_frac` are the tokens whose
    gradient the clip removed, `approx_kl` is the k3 estimate of KL(old || new).
    """
    mask = mask.to(logprobs.dtype)  # (B, T)
    per_token, ratio, log_ratio, adv = _clipped_surrogate(logprobs, old_logprobs, advantages, mask, clip_low, clip_high)
    loss = aggregate(per_token, mask, aggregation, max_tokens, denominator)
    return loss, _clip_metrics(ratio, log_ratio, adv, mask, clip_low, clip_high)


def decoupled_ppo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    aggregation: Aggregation = "token",
    max_tokens: int | None = None,
    denominator: float | None = None,
    *,
    prox_logprobs: Tensor,
    is_cap: float = 2.0,
) -> tuple[Tensor, dict[str, float]]:
    """Decoupled PPO (AReaL, Fu et al. 2025) for stale samples: clip around the proximal policy.

    `old_logprobs` are the behaviour policy's (the sampler's weights, maybe several updates old);
    `prox_logprobs` (B, T) the trainer's weights before this update. The clipped surrogate is
    taken on pi_theta / pi_prox, so the trust region is around the current weights, and the
    behaviour -> proximal gap is corrected by the weight pi_prox / pi_behaviour, truncated at
    `is_cap` (AReaL's behaviour weight cap). With fresh samples (prox == old) it is ppo_clip_loss.
    """
    mask = mask.to(logprobs.dtype)  # (B, T)
    per_token, ratio, log_ratio, adv = _clipped_surrogate(logprobs, prox_logprobs, advantages, mask, clip_low, clip_high)
    weight, weight_metrics = _truncated_weight(prox_logprobs - old_logprobs, mask, is_cap)
    loss = aggregate(per_token * weight, mask, aggregation, max_tokens, denominator)
    return loss, {**_clip_metrics(ratio, log_ratio, adv, mask, clip_low, clip_high), **weight_metrics}


def tis_pg_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    aggregation: Aggregation = "token",
    max_tokens: int | None = None,
    denominator: float | None = None,
    *,
    is_cap: float = 2.0,
) -> tuple[Tensor, dict[str, float]]:
    """Policy gradient with truncated importance sampling: per token -w * A * log pi_theta, where
    w = min(pi_theta / pi_behaviour, is_cap) is held constant (IMPALA's truncated rho).

    No trust-region clip (clip_low/clip_high are accepted for a common signature and unused): the
    truncation alone bounds how much a stale, now-likelier token can weigh.
    """
    mask = mask.to(logprobs.dtype)  # (B, T)
    weight, weight_metrics = _truncated_weight(logprobs.detach() - old_logprobs, mask, is_cap)
    adv = token_advantages(advantages, mask)  # (B, T)
    safe = torch.where(mask > 0, logprobs, torch.zeros_like(logprobs))  # (B, T)
    loss = aggregate(-weight * adv * safe, mask, aggregation, max_tokens, denominator)
    return loss, weight_metrics


KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: Literal["k1", "k2", "k3"] = "k3") -> Tensor:
    """Per-token estimate (B, T) of KL(policy || reference) on tokens sampled from the policy.

    k1 = logp - logp_ref (unbiased, can be negative); k2 = (logp - logp_ref)^2 / 2 (biased, >= 0,
    low variance; its gradient is that of the reverse KL's, Schulman's note); k3 = exp(ref - logp)
    - (ref - logp) - 1 (unbiased, >= 0, used by GRPO).
    """
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k2":
        return 0.5 * (logprobs - ref_logprobs) ** 2
    if estimator == "k3":
        delta = ref_logprobs - logprobs  # (B, T)
        return torch.exp(delta) - delta - 1.0
    raise UnknownNameError("KL estimator", estimator, list(KL_ESTIMATORS))


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy (B, T) of the softmax of logits (B, T, V), in fp32 or wider."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    log_z = torch.logsumexp(logits, dim=-1)  # (B, T)
    probs = torch.softmax(logits, dim=-1)  # (B, T, V)
    return log_z - (probs * logits).sum(dim=-1)


def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    aggregation: Aggregation = "token",
    max_tokens: int | None = None,
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO (Zheng et al., 2025): PPO's clipped surrogate on a sequence-level importance ratio.

    s_i = exp(mean over sequence i's masked tokens of (logprobs - old_logprobs)), the length-
    normalised (geometric-mean) ratio of the whole answer, clipped to [1 - clip_low, 1 + clip_high]:
    a whole sequence is in or out of the trust region. Written in the paper's GSPO-token form,
    per token s_i * pi_theta(y_t) / sg(pi_theta(y_t)): the same value s_i on every token, the
    sequence's gradient A_i s_i * mean_t grad log pi_theta(y_t), and per-token advantages (B, T)
    allowed. `aggregation: sequence` is the paper's mean over sequences; the paper's clip range is
    far narrower than PPO's (e.g. clip_low 3e-4, clip_high 4e-4) since s_i is a per-token mean.
    Metrics: `clip_*_frac` and `ratio_mean` are per sequence (clipped sequences' share).
    """
    mask = mask.to(logprobs.dtype)  # (B, T)
    safe = torch.where(mask > 0, logprobs, torch.zeros_like(logprobs))  # (B, T)
    log_ratio = torch.where(mask > 0, logprobs - old_logprobs, torch.zeros_like(logprobs))  # (B, T)
    lengths = mask.sum(dim=-1).clamp(min=1)  # (B,)
    seq_log_ratio = log_ratio.sum(dim=-1) / lengths  # (B,)
    token_log_ratio = seq_log_ratio.detach().unsqueeze(-1) + safe - safe.detach()  # (B, T), value s_i
    ratio = torch.exp(token_log_ratio)  # (B, T)
    adv = token_advantages(advantages, mask)  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv  # (B, T)
    per_token = -torch.minimum(ratio * adv, clipped)  # (B, T)
    loss = aggregate(per_token, mask, aggregation, max_tokens, denominator)
    with torch.no_grad():
        seq_ratio = torch.exp(seq_log_ratio)  # (B,)
        seq_adv = (adv * mask).sum(dim=-1) / lengths  # (B,)
        rows = (mask.sum(dim=-1) > 0).to(mask.dtype)  # (B,)
        count = float(rows.sum()) or 1.0
        metrics = {
            "clip_low_frac": float((((seq_ratio < 1.0 - clip_low) & (seq_adv < 0)).to(mask.dtype) * rows).sum()) / count,
            "clip_high_frac": float((((seq_ratio > 1.0 + clip_high) & (seq_adv > 0)).to(mask.dtype) * rows).sum()) / count,
            "ratio_mean": float((seq_ratio * rows).sum()) / count,
            "approx_kl": _masked_mean((torch.exp(log_ratio) - 1.0) - log_ratio, mask),
        }
    return loss, metrics


def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    aggregation: Aggregation = "token",
    max_tokens: int | None = None,
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, 2025): REINFORCE with a clipped, stop-gradient importance weight.

    Per token -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) * A * log pi_theta(y_t), r_t =
    pi_theta / pi_old. Unlike PPO's clip, which zeroes the gradient of a token outside the range,
    every token keeps its gradient and only its weight is bounded, so rare tokens whose ratio
    jumps still learn. The paper leaves the lower side open (a large clip_low, e.g. 1) and tunes
    clip_high; with token aggregation (its choice). Metrics: the share of tokens whose weight
    was clipped on each side (`clip_low_frac`, `clip_high_frac`), `ratio_mean`, `approx_kl`.
    """
    mask = mask.to(logprobs.dtype)  # (B, T)
    log_ratio = torch.where(mask > 0, logprobs - old_logprobs, torch.zeros_like(logprobs)).detach()  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)  # (B, T), no gradient
    adv = token_advantages(advantages, mask)  # (B, T)
    safe = torch.where(mask > 0, logprobs, torch.zeros_like(logprobs))  # (B, T)
    loss = aggregate(-weight * adv * safe, mask, aggregation, max_tokens, denominator)
    with torch.no_grad():
        metrics = {
            "clip_low_frac": _masked_mean((ratio < 1.0 - clip_low).to(mask.dtype), mask),
            "clip_high_frac": _masked_mean((ratio > 1.0 + clip_high).to(mask.dtype), mask),
            "ratio_mean": _masked_mean(ratio, mask),
            "approx_kl": _masked_mean((ratio - 1.0) - log_ratio, mask),
        }
    return loss, metrics


# A loss takes (logprobs, old_logprobs, advantages, mask, clip_low=, clip_high=, aggregation=,
# max_tokens=, denominator=, **the inputs it declares) and returns (scalar loss, metrics).
LossFn = Callable[..., tuple[Tensor, dict[str, float]]]
LOSSES: dict[str, LossFn] = {
    "ppo_clip": ppo_clip_loss,
    "decoupled_ppo": decoupled_ppo_loss,
    "tis_pg": tis_pg_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
}
# What a loss needs beyond the common arguments; the trainer supplies exactly these keywords.
LOSS_INPUTS: dict[str, tuple[str, ...]] = {"decoupled_ppo": ("prox_logprobs", "is_cap"), "tis_pg": ("is_cap",)}
TRAINER_INPUTS = ("prox_logprobs", "is_cap")  # the extra inputs the trainer can supply


def register_loss(name: str, function: LossFn, inputs: tuple[str, ...] = ()) -> None:
    """Make `function` the policy loss `name` (`algorithm.loss: name`); `inputs` are the extra
    keywords it needs from the trainer, among `TRAINER_INPUTS`."""
    if not name.isidentifier():
        raise ValueError(f"policy loss name {name!r} must be an identifier")
    unknown = [i for i in inputs if i not in TRAINER_INPUTS]
    if unknown:
        raise ValueError(f"policy loss {name!r} asks for {unknown}; the trainer supplies {', '.join(TRAINER_INPUTS)}")
    existing = LOSSES.get(name)
    if existing is not None and existing is not function:
        raise ValueError(f"policy loss {name!r} is already registered by {existing.__module__}")
    LOSSES[name] = function
    if inputs:
        LOSS_INPUTS[name] = tuple(inputs)


def loss(name: str, *, inputs: tuple[str, ...] = ()) -> Callable[[LossFn], LossFn]:
    """Decorator form of `register_loss`."""

    def decorate(function: LossFn) -> LossFn:
        register_loss(name, function, inputs)
        return function

    return decorate


def _load_plugins() -> None:
    # Installed entry points of group tidal.losses: a module registers with @loss; a function is
    # registered under the entry point's name (its `inputs` attribute, when set, as its inputs).
    from tidal import plugins

    for name, loaded in plugins.entry_point_objects("tidal.losses"):
        if callable(loaded) and not isinstance(loaded, type(plugins)) and LOSSES.get(name) is not loaded:
            register_loss(name, loaded, tuple(getattr(loaded, "inputs", ())))


def known_losses() -> list[str]:
    """Every registered policy loss, plugins included."""
    _load_plugins()
    return sorted(LOSSES)


def get_loss(name: str) -> LossFn:
    """The policy loss registered under `name`; an unknown name raises with the known ones."""
    _load_plugins()
    if name not in LOSSES:
        raise UnknownNameError("policy loss", name, list(LOSSES))
    return LOSSES[name]
