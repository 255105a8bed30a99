"""Per-token log-probabilities of a causal LM, and collation of episodes into a `TrainBatch`."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

from tidal.algos.advantages import episode_reward, has_valid_reward
from tidal.types import Episode, TrainBatch


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> Any:
    """torch.autocast for `dtype` on `device`'s type (e.g. bf16 on CUDA), or nothing when None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def trim_padding(input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor, int]:
    """Drop the padding columns that no row of this micro-batch uses (rows are right-padded)."""
    length = max(int(attention_mask.sum(dim=1).max()), 1)
    return input_ids[:, :length], attention_mask[:, :length], length


def _row_logprobs(
    logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool, entropy_grad: bool
) -> tuple[Tensor, Tensor | None]:
    """logits (..., V), targets (...) -> logprobs (...), entropy (...) | None: one sequence
    (T-1, V) or a batch of them (B, T-1, V)."""
    # At least fp32 (a view when the model already returns fp32; fp64 stays fp64).
    scores = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (T-1, V)
    if temperature != 1.0:
        scores = scores / temperature
    log_z = torch.logsumexp(scores, dim=-1)  # (T-1,)
    picked = scores.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (T-1,)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            probs = torch.softmax(scores, dim=-1)  # (T-1, V)
            entropy = log_z - (probs * scores).sum(dim=-1)  # (T-1,)
    return picked - log_z, entropy


def sequence_logprobs(
    scores: Tensor, targets: Tensor, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Logprobs (B, T) of `targets` (B, T) under softmax(scores / temperature), scores (B, T, V),
    and the entropies (B, T) when asked, in at least fp32.

    fp32 (or wider) scores are computed in one pass over the batch: no copy is made. Narrower
    ones (autocast) one row at a time, so that only one row's fp32 copy exists at once. Rows are
    taken with `unbind`, whose backward writes every row's gradient into one (B, T, V) tensor:
    indexing row b instead (`scores[b]`) has autograd zero-fill a whole (B, T, V) gradient for
    each row and add them up, B times the work of the loss's own backward."""
    if scores.dtype in (torch.float32, torch.float64):
        return _row_logprobs(scores, targets, temperature, with_entropy, entropy_grad)
    rows = [_row_logprobs(row, target, temperature, with_entropy, entropy_grad)
            for row, target in zip(scores.unbind(0), targets.unbind(0))]
    if not rows:
        empty = scores.new_zeros(targets.shape, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    logprobs = torch.stack([lp for lp, _ in rows])
    return logprobs, (torch.stack([ent for _, ent in rows]) if with_entropy else None)  # type: ignore[misc]


def token_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    autocast_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probabilities of each token given the ones before it, for right-padded batches.

    Returns logprobs (B, T) with logprobs[:, t] = log p(input_ids[:, t] | input_ids[:, :t]) under
    softmax(logits / temperature), 0 at position 0 and on padding; and, with `with_entropy`, the
    entropy (B, T) of the same next-token distribution (0 at position 0 and on padding). The
    entropy stays out of the autograd graph unless `entropy_grad` (an entropy bonus needs it).
    The log-softmax runs in at least fp32 (`sequence_logprobs`: one row at a time when the
    logits are narrower, so no (B, T, V) fp32 copy is made).
    `autocast_dtype` runs the model's forward under autocast (e.g. torch.bfloat16).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to compute logprobs, got {temperature}")
    batch = input_ids.shape[0]
    with autocast_context(input_ids.device, autocast_dtype):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits  # (B, T, V)

    shifted, shifted_entropy = sequence_logprobs(
        logits[:, :-1], input_ids[:, 1:], temperature, with_entropy, entropy_grad)  # (B, T-1) each
    del logits
    valid = attention_mask[:, 1:].bool()  # (B, T-1)
    first = torch.zeros(batch, 1, dtype=shifted.dtype, device=input_ids.device)  # (B, 1)
    logprobs = torch.cat([first, torch.where(valid, shifted, torch.zeros_like(shifted))], dim=1)  # (B, T)
    if shifted_entropy is None:
        return logprobs, None
    entropy = torch.cat([first, torch.where(valid, shifted_entropy, torch.zeros_like(shifted_entropy))], dim=1)
    return logprobs, entropy  # (B, T), (B, T)


def collate(episodes: list[Episode], pad_id: int, device: torch.device | str = "cpu") -> TrainBatch:
    """Right-padded tensors for training on the completions of `episodes`.

    Each row is prompt_ids + token_ids; `completion_mask` is 1 on the completion tokens (only on
    the generated ones when the completion has a `loss_mask`: a multi-turn episode) and
    `old_logprobs` holds the sampler's logprob of each completion token at its position.
    `rewards` (B,) holds each episode's `episode_reward` (NaN when it has no valid reward), which
    the `gae` estimator turns into per-token rewards; `prompt_lengths` (B,) where each completion
    starts (shared-prompt training: trainer/prefix.py).
    """
    if not episodes:
        raise ValueError("collate needs at least one episode")
    lengths = []
    for episode in episodes:
        c = episode.completion
        if len(c.logprobs) != len(c.token_ids):
            raise ValueError(
                f"episode {episode.id}: {len(c.token_ids)} completion tokens but {len(c.logprobs)} "
                "logprobs; the sampler must return one logprob per generated token"
            )
        if not c.prompt_ids:
            raise ValueError(f"episode {episode.id}: empty prompt_ids (the first token has no logprob)")
        if c.loss_mask is not None and len(c.loss_mask) != len(c.token_ids):
            raise ValueError(f"episode {episode.id}: {len(c.token_ids)} completion tokens but a loss mask of {len(c.loss_mask)}")
        lengths.append(len(c.prompt_ids) + len(c.token_ids))
    batch, length = len(episodes), max(lengths)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros(batch, length, dtype=torch.long)  # (B, T)
    completion_mask = torch.zeros(batch, length, dtype=torch.float32)  # (B, T)
    old_logprobs = torch.zeros(batch, length, dtype=torch.float32)  # (B, T)
    for b, episode in enumerate(episodes):
        c = episode.completion
        start, end = len(c.prompt_ids), lengths[b]
        input_ids[b, :end] = torch.tensor(c.prompt_ids + c.token_ids, dtype=torch.long)
        attention_mask[b, :end] = 1
        if c.loss_mask is None:
            completion_mask[b, start:end] = 1.0
        else:  # a multi-turn episode: tool results between the model's turns are not trained
            completion_mask[b, start:end] = torch.tensor(c.loss_mask, dtype=torch.float32)
        old_logprobs[b, start:end] = torch.tensor(c.logprobs, dtype=torch.float32)
    advantages = torch.tensor([e.advantage for e in episodes], dtype=torch.float32)  # (B,)
    rewards = torch.tensor(
        [episode_reward(e) if has_valid_reward(e) else float("nan") for e in episodes], dtype=torch.float32
    )  # (B,)
    return TrainBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        completion_mask=completion_mask.to(device),
        old_logprobs=old_logprobs.to(device),
        advantages=advantages.to(device),
        rewards=rewards.to(device),
        prompt_lengths=torch.tensor([len(e.completion.prompt_ids) for e in episodes], dtype=torch.long).to(device),
    )
