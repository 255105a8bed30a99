"""Per-token log-probabilities of a causal LM, and collation of episodes into a `TrainBatch`.

The trainer's passes never hold the logits of a whole micro-batch. For a model whose logits are
its LM head applied to the decoder's last hidden states (`split_model`), the decoder runs alone;
the hidden states of the positions that are wanted (completion tokens, in RL) are gathered, and
the head, the log-softmax and the entropy run over chunks of `chunk_tokens` of them
(`head_logprobs`), each chunk under `torch.utils.checkpoint`: the backward recomputes a chunk's
logits instead of keeping them, so at most one chunk's (chunk_tokens, V) fp32 logits exist at any
time, forward or backward. The numbers are those of the full logits up to float rounding. Other
models (a soft-capped or scaled head, or no separable one) take the full-logits path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from tidal.algos.advantages import episode_reward, has_valid_reward
from tidal.types import Episode, TrainBatch

# Tokens per chunk of the LM head in the trainer's passes (trainer.logprob_chunk_tokens): with a
# 49k vocabulary one chunk's fp32 logits are 200 MB, and the head's matmul is still large enough
# to run at full speed.
DEFAULT_CHUNK_TOKENS = 1024

# Model types whose logits are exactly lm_head(decoder(...).last_hidden_state): nothing between
# the two (Gemma 2's soft-capping, Cohere's logit_scale, Granite's logits_scaling are such things).
# Others take the full-logits path.
PLAIN_HEAD_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "olmo2", "smollm3",
})


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


@dataclasses.dataclass(frozen=True)
class SplitModel:
    """A causal LM as its decoder and its LM head (`split_model`)."""

    body: torch.nn.Module  # input ids -> last_hidden_state (B, T, H)
    head: torch.nn.Linear  # hidden (..., H) -> logits (..., V)


def split_model(model: torch.nn.Module) -> SplitModel | None:
    """The decoder and LM head of a Hugging Face causal LM of a `PLAIN_HEAD_MODEL_TYPES` type,
    or None (the caller computes full logits)."""
    if getattr(getattr(model, "config", None), "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    get_head, get_body = getattr(model, "get_output_embeddings", None), getattr(model, "get_decoder", None)
    if get_head is None or get_body is None:
        return None
    head, body = get_head(), get_body()
    if not isinstance(head, torch.nn.Linear) or not isinstance(body, torch.nn.Module) or body is model:
        return None
    return SplitModel(body, head)


def _chunk_logprobs(
    hidden: Tensor, targets: Tensor, weight: Tensor | None, bias: Tensor | None,
    temperature: float, with_entropy: bool, entropy_grad: bool,
) -> tuple[Tensor, ...]:
    """hidden (n, H) [or logits (n, V) when `weight` is None], targets (n,) -> (logprobs (n,),
    [entropy (n,)]): one chunk of `head_logprobs`."""
    logits = hidden if weight is None else torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias)  # (n, V)
    logprobs, entropy = _row_logprobs(logits, targets, temperature, with_entropy, entropy_grad)
    return (logprobs,) if entropy is None else (logprobs, entropy)


def head_logprobs(
    features: Tensor,
    targets: Tensor,
    head: torch.nn.Linear | None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[Tensor, Tensor | None]:
    """Logprobs (N,) of `targets` (N,) under softmax(head(features) / temperature), features
    (N, H), and their entropies (N,) when asked; `head` None: the features are the logits.

    `chunk_tokens` tokens at a time; with gradients, each chunk but the last under a
    non-reentrant checkpoint (which also replays autocast), so the backward recomputes its
    logits. Under
    autocast the head's weight is cast once for all chunks, not once per chunk; the log-softmax
    always runs in at least fp32."""
    weight = bias = None
    if head is not None:
        weight, bias = head.weight, head.bias
        device_type = features.device.type
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            weight, bias = weight.to(dtype), (None if bias is None else bias.to(dtype))
    run = functools.partial(_chunk_logprobs, weight=weight, bias=bias, temperature=temperature,
                            with_entropy=with_entropy, entropy_grad=entropy_grad)
    needs_grad = torch.is_grad_enabled() and (
        features.requires_grad or (weight is not None and weight.requires_grad)
        or (bias is not None and bias.requires_grad))
    pieces, count = [], features.shape[0]
    for start in range(0, count, chunk_tokens):
        chunk = (features[start : start + chunk_tokens], targets[start : start + chunk_tokens])
        # Not the last chunk: the backward consumes its saved logits first, so keeping them costs
        # no more memory than a recomputed chunk, and a micro-batch of one chunk recomputes nothing.
        last = start + chunk_tokens >= count
        pieces.append(checkpoint(run, *chunk, use_reentrant=False) if needs_grad and not last else run(*chunk))
    if not pieces:
        empty = features.new_zeros(0, dtype=torch.promote_types(features.dtype, torch.float32))
        return empty, (empty if with_entropy else None)
    logprobs = torch.cat([piece[0] for piece in pieces])  # (N,)
    return logprobs, (torch.cat([piece[1] for piece in pieces]) if with_entropy else None)


def scatter_positions(values: Tensor, index: Tensor, shape: tuple[int, int]) -> Tensor:
    """A (B, T) tensor, 0 except `values` (N,) at the flat positions `index` (N,); differentiable."""
    flat = values.new_zeros(shape[0] * shape[1])
    return flat.index_put((index,), values).view(shape)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    autocast_dtype: torch.dtype | None = None,
    positions: Tensor | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[Tensor, Tensor | None]:
    """Log-probabilities of each token given the ones before it, for right-padded batches.

    Returns logprobs (B, T) with logprobs[:, t] = log p(input_ids[:, t] | input_ids[:, :t]) under
    softmax(logits / temperature), 0 at position 0 and on padding; and, with `with_entropy`, the
    entropy (B, T) of the same next-token distribution (0 at position 0 and on padding). The
    entropy stays out of the autograd graph unless `entropy_grad` (an entropy bonus needs it).
    `positions` (B, T), when given, says which tokens are wanted (e.g. the completion mask): the
    others are 0 and, on the chunked path, not computed at all. `chunk_tokens` > 0 takes the
    chunked path where the model allows it (module docstring; 0: the full logits).
    The log-softmax runs in at least fp32 (`sequence_logprobs` on the full-logits path: one row
    at a time when the logits are narrower, so no (B, T, V) fp32 copy is made).
    `autocast_dtype` runs the model's forward under autocast (e.g. torch.bfloat16).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to compute logprobs, got {temperature}")
    split = split_model(model) if chunk_tokens > 0 else None
    wanted = attention_mask[:, 1:].bool()  # (B, T-1): position t + 1 is predicted at t
    if positions is not None:
        wanted = wanted & (positions[:, 1:] > 0)
    if split is None:
        return _full_logits_logprobs(model, input_ids, attention_mask, wanted, temperature, with_entropy,
                                     entropy_grad, autocast_dtype)
    batch, length = input_ids.shape
    with autocast_context(input_ids.device, autocast_dtype):
        hidden = split.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        values, entropies = head_logprobs(hidden[:, :-1][wanted], input_ids[:, 1:][wanted], split.head,
                                          temperature, with_entropy, entropy_grad, chunk_tokens)  # (N,) each
    rows, columns = wanted.nonzero(as_tuple=True)
    index = rows * length + columns + 1  # (N,) flat positions in (B, T)
    logprobs = scatter_positions(values, index, (batch, length))  # (B, T)
    return logprobs, (None if entropies is None else scatter_positions(entropies, index, (batch, length)))


def _full_logits_logprobs(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, wanted: Tensor, temperature: float,
    with_entropy: bool, entropy_grad: bool, autocast_dtype: torch.dtype | None,
) -> tuple[Tensor, Tensor | None]:
    """`token_logprobs` from the model's whole logits (B, T, V); `wanted` (B, T-1) as there."""
    batch = input_ids.shape[0]
    with autocast_context(input_ids.device, autocast_dtype):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits  # (B, T, V)

    shifted, shifted_entropy = sequence_logprobs(
        logits[:, :-1], input_ids[:, 1:], temperature, with_entropy, entropy_grad)  # (B, T-1) each
    del logits
    first = torch.zeros(batch, 1, dtype=shifted.dtype, device=input_ids.device)  # (B, 1)
    logprobs = torch.cat([first, torch.where(wanted, shifted, torch.zeros_like(shifted))], dim=1)  # (B, T)
    if shifted_entropy is None:
        return logprobs, None
    entropy = torch.cat([first, torch.where(wanted, shifted_entropy, torch.zeros_like(shifted_entropy))], dim=1)
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
