"""The RL loss as one call: `compute_loss(LossInputs, LossOptions) -> LossOutputs`.

The trainer computes the log-probs of a micro-batch (and the entropy, the reference's and the
proximal policy's log-probs where they are used) and calls `compute_loss`, which adds to the
policy loss named by `LossOptions.loss` the KL term to the reference and the entropy bonus, each
aggregated the same way, and reports the metrics. Every policy loss has one signature,
`(LossInputs, LossOptions) -> LossOutputs`, and is picked by name from `LOSSES`.

A loss is computed per token and then aggregated over the completion tokens of the batch in one
of three ways (`aggregate`). When the trainer splits a batch into micro-batches it passes the
whole batch's `denominator` (see `loss_denominator`), so the micro-batch losses sum to the loss
of the whole batch.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

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


@dataclasses.dataclass(frozen=True)
class LossOptions:
    """The settings the loss reads: the algorithm config's, the generation budget and the KL
    coefficient of this step (adaptive, tidal.algos.kl.KLController). `from_config` builds it."""

    loss: str = "ppo_clip"  # the policy loss, a name in LOSSES
    clip_low: float = 0.2
    clip_high: float = 0.28
    aggregation: Aggregation = "token"
    max_tokens: int | None = None  # token_sum's constant: the generation budget
    is_cap: float = 2.0  # decoupled_ppo, tis_pg: truncation of the importance weight
    kl_coef: float = 0.0
    kl_in: Literal["loss", "reward"] = "loss"  # reward: the KL is in the advantages, not here
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    entropy_coef: float = 0.0

    @classmethod
    def from_config(cls, algorithm: Any, max_tokens: int | None, kl_coef: float) -> LossOptions:
        """From `algorithm`, an AlgorithmConfig (untyped here: config/schema.py imports this module)."""
        return cls(
            loss=algorithm.loss, clip_low=algorithm.clip_low, clip_high=algorithm.clip_high,
            aggregation=algorithm.aggregation, max_tokens=max_tokens, is_cap=algorithm.is_cap, kl_coef=kl_coef,
            kl_in=algorithm.kl_in, kl_estimator=algorithm.kl_estimator, entropy_coef=algorithm.entropy_coef,
        )


@dataclasses.dataclass
class LossInputs:
    """One micro-batch as the loss sees it; the optional log-probs are present where used."""

    logprobs: Tensor  # (B, T) of the policy being trained, with gradient
    old_logprobs: Tensor  # (B, T) of the behaviour policy (the sampler's weights)
    advantages: Tensor  # (B,) per sequence or (B, T) per token
    mask: Tensor  # (B, T) 1 on the completion tokens trained
    entropy: Tensor | None = None  # (B, T) of the policy; with gradient when entropy_coef > 0
    ref_logprobs: Tensor | None = None  # (B, T) of the reference: the KL term and the `kl` metric
    prox_logprobs: Tensor | None = None  # (B, T) of the trainer's weights before this step (decoupled_ppo)
    denominator: float | None = None  # the whole batch's `loss_denominator`; None: this batch's own
    batch_tokens: float | None = None  # the whole batch's completion tokens; None: this batch's own


class LossOutputs(NamedTuple):
    """The scalar to differentiate and the metrics (token means; with `batch_tokens`, weighted
    by this micro-batch's share so that the micro-batches' metrics sum to the batch's)."""

    loss: Tensor  # ()
    metrics: dict[str, float]



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


def ppo_clip(inputs: LossInputs, options: LossOptions) -> LossOutputs:
    """PPO's clipped surrogate with separate lower and upper clip ranges.

    Differs from PPO (Schulman et al., 2017) by the asymmetric range [1 - clip_low,
    1 + clip_high] ("clip-higher", DAPO) that leaves low-probability tokens room to grow.
    Advantages (B,) or (B, T) (per token, e.g. GAE). Metrics are token means over
    the masked tokens of this batch: `clip_low_frac`/`clip_high_frac` are the tokens whose
    gradient the clip removed, `approx_kl` is the k3 estimate of KL(old || new).
    """
    logprobs, clip_low, clip_high = inputs.logprobs, options.clip_low, options.clip_high
    mask = inputs.mask.to(logprobs.dtype)  # (B, T)
    per_token, ratio, log_ratio, adv = _clipped_surrogate(logprobs, inputs.old_logprobs, inputs.advantages, mask,
                                                          clip_low, clip_high)
    loss = aggregate(per_token, mask, options.aggregation, options.max_tokens, inputs.denominator)
    return LossOutputs(loss, _clip_metrics(ratio, log_ratio, adv, mask, clip_low, clip_high))


def decoupled_ppo(inputs: LossInputs, options: LossOptions) -> LossOutputs:
    """Decoupled PPO (AReaL, Fu et al. 2025) for stale samples: clip around the proximal policy.

    `old_logprobs` are the behaviour policy's (the sampler's weights, maybe several updates old);
    `prox_logprobs` (B, T) the trainer's weights before this update. The clipped surrogate is
    taken on pi_theta / pi_prox, so the trust region is around the current weights, and the
    behaviour -> proximal gap is corrected by the weight pi_prox / pi_behaviour, truncated at
    `is_cap` (AReaL's behaviour weight cap). With fresh samples (prox == old) it is ppo_clip.
    """
    prox = inputs.prox_logprobs
    if prox is None:
        raise ValueError("policy loss 'decoupled_ppo' needs LossInputs.prox_logprobs (the trainer's weights before this step)")
    logprobs, clip_low, clip_high = inputs.logprobs, options.clip_low, options.clip_high
    mask = inputs.mask.to(logprobs.dtype)  # (B, T)
    per_token, ratio, log_ratio, adv = _clipped_surrogate(logprobs, prox, inputs.advantages, mask, clip_low, clip_high)
    weight, weight_metrics = _truncated_weight(prox - inputs.old_logprobs, mask, options.is_cap)
    loss = aggregate(per_token * weight, mask, options.aggregation, options.max_tokens, inputs.denominator)
    return LossOutputs(loss, {**_clip_metrics(ratio, log_ratio, adv, mask, clip_low, clip_high), **weight_metrics})


def tis_pg(inputs: LossInputs, options: LossOptions) -> LossOutputs:
    """Policy gradient with truncated importance sampling: per token -w * A * log pi_theta, where
    w = min(pi_theta / pi_behaviour, is_cap) is held constant (IMPALA's truncated rho).

    No trust-region clip (clip_low/clip_high are unused): the truncation alone bounds how much a
    stale, now-likelier token can weigh.
    """
    logprobs = inputs.logprobs
    mask = inputs.mask.to(logprobs.dtype)  # (B, T)
    weight, weight_metrics = _truncated_weight(logprobs.detach() - inputs.old_logprobs, mask, options.is_cap)
    adv = token_advantages(inputs.advantages, mask)  # (B, T)
    safe = torch.where(mask > 0, logprobs, torch.zeros_like(logprobs))  # (B, T)
    loss = aggregate(-weight * adv * safe, mask, options.aggregation, options.max_tokens, inputs.denominator)
    return LossOutputs(loss, weight_metrics)


def gspo(inputs: LossInputs, options: LossOptions) -> LossOutputs:
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
    logprobs, clip_low, clip_high = inputs.logprobs, options.clip_low, options.clip_high
    mask = inputs.mask.to(logprobs.dtype)  # (B, T)
    safe = torch.where(mask > 0, logprobs, torch.zeros_like(logprobs))  # (B, T)
    log_ratio = torch.where(mask > 0, logprobs - inputs.old_logprobs, torch.zeros_like(logprobs))  # (B, T)
    lengths = mask.sum(dim=-1).clamp(min=1)  # (B,)
    seq_log_ratio = log_ratio.sum(dim=-1) / lengths  # (B,)
    token_log_ratio = seq_log_ratio.detach().unsqueeze(-1) + safe - safe.detach()  # (B, T), value s_i
    ratio = torch.exp(token_log_ratio)  # (B, T)
    adv = token_advantages(inputs.advantages, mask)  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv  # (B, T)
    per_token = -torch.minimum(ratio * adv, clipped)  # (B, T)
    loss = aggregate(per_token, mask, options.aggregation, options.max_tokens, inputs.denominator)
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
    return LossOutputs(loss, metrics)


def cispo(inputs: LossInputs, options: LossOptions) -> LossOutputs:
    """CISPO (MiniMax-M1, 2025): REINFORCE with a clipped, stop-gradient importance weight.

    Per token -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) * A * log pi_theta(y_t), r_t =
    pi_theta / pi_old. Unlike PPO's clip, which zeroes the gradient of a token outside the range,
    every token keeps its gradient and only its weight is bounded, so rare tokens whose ratio
    jumps still learn. The paper leaves the lower side open (a large clip_low, e.g. 1) and tunes
    clip_high; with token aggregation (its choice). Metrics: the share of tokens whose weight
    was clipped on each side (`clip_low_frac`, `clip_high_frac`), `ratio_mean`, `approx_kl`.
    """
    logprobs, clip_low, clip_high = inputs.logprobs, options.clip_low, options.clip_high
    mask = inputs.mask.to(logprobs.dtype)  # (B, T)
    log_ratio = torch.where(mask > 0, logprobs - inputs.old_logprobs, torch.zeros_like(logprobs)).detach()  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)  # (B, T), no gradient
    adv = token_advantages(inputs.advantages, mask)  # (B, T)
    safe = torch.where(mask > 0, logprobs, torch.zeros_like(logprobs))  # (B, T)
    loss = aggregate(-weight * adv * safe, mask, options.aggregation, options.max_tokens, inputs.denominator)
    with torch.no_grad():
        metrics = {
            "clip_low_frac": _masked_mean((ratio < 1.0 - clip_low).to(mask.dtype), mask),
            "clip_high_frac": _masked_mean((ratio > 1.0 + clip_high).to(mask.dtype), mask),
            "ratio_mean": _masked_mean(ratio, mask),
            "approx_kl": _masked_mean((ratio - 1.0) - log_ratio, mask),
        }
    return LossOutputs(loss, metrics)


# The one signature of a policy loss: the aggregated policy term of a micro-batch and its metrics.
PolicyLoss = Callable[[LossInputs, LossOptions], LossOutputs]
LOSSES: dict[str, PolicyLoss] = {
    "ppo_clip": ppo_clip,
    "decoupled_ppo": decoupled_ppo,
    "tis_pg": tis_pg,
    "gspo": gspo,
    "cispo": cispo,
}
# What a loss reads beyond the common inputs; the trainer computes prox_logprobs only for a loss
# that declares it (an extra forward pass).
LOSS_INPUTS: dict[str, tuple[str, ...]] = {"decoupled_ppo": ("prox_logprobs", "is_cap"), "tis_pg": ("is_cap",)}
TRAINER_INPUTS = ("prox_logprobs", "is_cap")  # the optional inputs and options the trainer supplies


def needs_prox_logprobs(name: str) -> bool:
    """Whether the policy loss `name` reads `LossInputs.prox_logprobs`."""
    return "prox_logprobs" in LOSS_INPUTS.get(name, ())


def compute_loss(inputs: LossInputs, options: LossOptions) -> LossOutputs:
    """The loss of one micro-batch: the policy loss `options.loss`, plus kl_coef times the KL to
    the reference (kl_in=loss, with `ref_logprobs`), minus entropy_coef times the entropy, each
    aggregated with `options.aggregation` over `inputs.denominator`.

    Metrics: the policy loss's own, `policy_loss` (its value), `entropy` (with `inputs.entropy`)
    and `kl` (with `kl_estimator`, when there is a reference), weighted by this micro-batch's
    share of `batch_tokens`.
    """
    mask = inputs.mask  # (B, T)
    if options.entropy_coef > 0 and inputs.entropy is None:
        raise ValueError(f"entropy_coef={options.entropy_coef} needs LossInputs.entropy")
    loss, policy_metrics = _policy_loss(options.loss)(inputs, options)
    weight = 1.0 if inputs.batch_tokens is None else float(mask.sum()) / inputs.batch_tokens
    metrics = {key: value * weight for key, value in policy_metrics.items()}
    metrics["policy_loss"] = float(loss.detach())
    if inputs.entropy is not None:
        metrics["entropy"] = _masked_mean(inputs.entropy.detach(), mask) * weight
    if inputs.ref_logprobs is not None:
        kl = kl_penalty(inputs.logprobs, inputs.ref_logprobs, options.kl_estimator)  # (B, T)
        metrics["kl"] = _masked_mean(kl.detach(), mask) * weight
        if options.kl_in == "loss" and options.kl_coef > 0:
            loss = loss + options.kl_coef * aggregate(kl, mask, options.aggregation, options.max_tokens, inputs.denominator)
    if options.entropy_coef > 0:
        assert inputs.entropy is not None
        bonus = aggregate(inputs.entropy, mask, options.aggregation, options.max_tokens, inputs.denominator)
        loss = loss - options.entropy_coef * bonus
    return LossOutputs(loss, metrics)


TensorLoss = Callable[..., tuple[Tensor, dict[str, float]]]


@functools.cache
def tensor_form(policy: PolicyLoss) -> TensorLoss:
    """`policy` called with tensors and settings as arguments, (logprobs, old_logprobs,
    advantages, mask, clip_low, clip_high, aggregation, max_tokens, denominator, *,
    prox_logprobs, is_cap) -> (loss, metrics): one policy loss by hand (tests, benches)."""

    @functools.wraps(policy)
    def call(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, clip_low: float = 0.2,
             clip_high: float = 0.28, aggregation: Aggregation = "token", max_tokens: int | None = None,
             denominator: float | None = None, *, prox_logprobs: Tensor | None = None,
             is_cap: float = 2.0) -> LossOutputs:
        inputs = LossInputs(logprobs, old_logprobs, advantages, mask, prox_logprobs=prox_logprobs, denominator=denominator)
        return policy(inputs, LossOptions(clip_low=clip_low, clip_high=clip_high, aggregation=aggregation,
                                          max_tokens=max_tokens, is_cap=is_cap))

    return call


ppo_clip_loss = tensor_form(ppo_clip)
decoupled_ppo_loss = tensor_form(decoupled_ppo)
tis_pg_loss = tensor_form(tis_pg)
gspo_loss = tensor_form(gspo)
cispo_loss = tensor_form(cispo)


def register_loss(name: str, function: PolicyLoss, inputs: tuple[str, ...] = ()) -> None:
    """Make `function` the policy loss `name` (`algorithm.loss: name`); `inputs` are the optional
    inputs and options it reads, among `TRAINER_INPUTS`."""
    if not name.isidentifier():
        raise ValueError(f"policy loss name {name!r} must be an identifier")
    unknown = [i for i in inputs if i not in TRAINER_INPUTS]
    if unknown:
        raise ValueError(f"policy loss {name!r} asks for {unknown}; the trainer supplies {', '.join(TRAINER_INPUTS)}")
    existing = LOSSES.get(name)
    if existing is not None and existing is not function and getattr(existing, "__wrapped__", None) is not function:
        raise ValueError(f"policy loss {name!r} is already registered by {existing.__module__}")
    LOSSES[name] = function if _takes_inputs(function) else _from_tensor_form(function, tuple(inputs))
    if inputs:
        LOSS_INPUTS[name] = tuple(inputs)


def _takes_inputs(function: Callable[..., Any]) -> bool:
    """Whether `function` is a loss of the (LossInputs, LossOptions) form; else the tensor form."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind == p.VAR_POSITIONAL for p in parameters)
    return len(positional) == 2 and not variadic


def _from_tensor_form(function: TensorLoss, inputs: tuple[str, ...]) -> PolicyLoss:
    """A loss written in the tensor form (`tensor_form`'s signature, the form plugins used before
    `LossInputs`) as a `PolicyLoss`; its optional `inputs` passed as keywords."""

    @functools.wraps(function)
    def call(loss_inputs: LossInputs, options: LossOptions) -> LossOutputs:
        extra: dict[str, Any] = {}
        if "prox_logprobs" in inputs:
            extra["prox_logprobs"] = loss_inputs.prox_logprobs
        if "is_cap" in inputs:
            extra["is_cap"] = options.is_cap
        value, metrics = function(loss_inputs.logprobs, loss_inputs.old_logprobs, loss_inputs.advantages,
                                  loss_inputs.mask, options.clip_low, options.clip_high, options.aggregation,
                                  options.max_tokens, loss_inputs.denominator, **extra)
        return LossOutputs(value, metrics)

    return call


def loss(name: str, *, inputs: tuple[str, ...] = ()) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator form of `register_loss`."""

    def decorate(function: PolicyLoss) -> PolicyLoss:
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


def _policy_loss(name: str) -> PolicyLoss:
    _load_plugins()
    if name not in LOSSES:
        raise UnknownNameError("policy loss", name, list(LOSSES))
    return LOSSES[name]


def get_loss(name: str) -> TensorLoss:
    """The policy loss registered under `name` in its `tensor_form`; an unknown name raises with
    the known ones."""
    return tensor_form(_policy_loss(name))
