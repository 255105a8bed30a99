"""Shared-prompt training: each distinct prompt of a micro-batch is run through the model once.

A GRPO group is `group_size` completions of one prompt, so a micro-batch of right-padded
prompt + completion rows runs every prompt `group_size` times, forward and backward. Here the
distinct prompts run once (left-padded, with a KV cache kept in the autograd graph), their cache
rows are gathered to the completions that follow them, and the completions run on top of it. The
prompts' keys and values get the gradient of every completion that attended to them (the gather's
backward sums it), so the loss and its gradient are those of the plain forward, up to float
rounding; the saving is the prompt tokens of all but one row per group, forward and backward.

Only completion positions are computed: the result is zero at prompt positions (the trainer's
losses read completion positions only: `completion_mask` is 0 on the prompt). As in
`token_logprobs`, the LM head runs in checkpointed chunks over the wanted positions' hidden states
where the model splits into decoder and head (trainer/logprobs.py), else on its full logits. Left padding of
the prompts is masked and their positions count from each prompt's first token, as in the
rollout engine's prefill, so a row sees exactly what it saw when it was sampled.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor
from transformers import DynamicCache

from tidal.trainer.logprobs import (
    DEFAULT_CHUNK_TOKENS,
    autocast_context,
    head_logprobs,
    scatter_positions,
    split_model,
)


def prompt_groups(input_ids: Tensor, prompt_lengths: Tensor) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts of the rows (each as its token ids, in order of first appearance)
    and, per row, the index of its prompt."""
    index: dict[tuple[int, ...], int] = {}
    prompts: list[list[int]] = []
    source: list[int] = []
    for row, length in zip(input_ids.tolist(), prompt_lengths.tolist()):
        key = tuple(row[:length])
        if key not in index:
            index[key] = len(prompts)
            prompts.append(list(key))
        source.append(index[key])
    return prompts, source


def _cache_argument(model: torch.nn.Module) -> str:
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def shared_prefix_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_lengths: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    autocast_dtype: torch.dtype | None = None,
    pad_id: int = 0,
    groups: tuple[list[list[int]], list[int]] | None = None,
    positions: Tensor | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[Tensor, Tensor | None]:
    """As `token_logprobs` (right-padded rows (B, T) of prompt + completion; logprobs and
    entropies (B, T); `positions` and `chunk_tokens` as there), but each distinct prompt runs
    once and prompt positions are 0. `prompt_lengths` (B,) says where each row's completion
    starts (at least 1); `groups`, when the caller has them, are `prompt_groups` of the rows."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to compute logprobs, got {temperature}")
    device = input_ids.device
    batch, length = input_ids.shape
    lengths = attention_mask.sum(dim=1).tolist()  # real tokens per row
    starts = prompt_lengths.tolist()
    if min(starts) < 1 or any(s > n for s, n in zip(starts, lengths)):
        raise ValueError(f"prompt lengths {starts} must be >= 1 and within the rows' lengths {lengths}")
    prompts, source = groups if groups is not None else prompt_groups(input_ids, prompt_lengths)
    width = max(len(p) for p in prompts)
    # The distinct prompts, left-padded: each ends at column `width - 1`.
    prompt_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)  # (U, P)
    prompt_mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)  # (U, P)
    for u, prompt in enumerate(prompts):
        prompt_ids[u, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long, device=device)
        prompt_mask[u, width - len(prompt):] = 1
    prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # (U, P)
    # The completions, right-padded, after their prompt's cache row.
    completion_lengths = [n - s for n, s in zip(lengths, starts)]
    span = max(max(completion_lengths), 1)
    completion_ids = torch.full((batch, span), pad_id, dtype=torch.long, device=device)  # (B, C)
    completion_mask = torch.zeros((batch, span), dtype=torch.long, device=device)  # (B, C)
    for b in range(batch):
        completion_ids[b, : completion_lengths[b]] = input_ids[b, starts[b] : lengths[b]]
        completion_mask[b, : completion_lengths[b]] = 1
    rows = torch.tensor(source, dtype=torch.long, device=device)  # (B,)
    offsets = torch.arange(span, device=device)[None, :]  # (1, C)
    starts_column = prompt_lengths.to(device)[:, None]  # (B, 1)
    completion_positions = starts_column + offsets  # (B, C)
    wanted = completion_mask.bool()  # (B, C): row b's completion token j sits at column starts[b] + j
    if positions is not None:
        wanted = wanted & (positions.gather(1, completion_positions.clamp(max=length - 1)) > 0)

    split = split_model(model) if chunk_tokens > 0 else None
    network = model if split is None else split.body
    cache_arg = _cache_argument(network)
    cache = DynamicCache(config=model.config)
    with autocast_context(device, autocast_dtype):
        prompt_out = network(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=prompt_positions,
                             use_cache=True, **{cache_arg: cache})
        cache.batch_select_indices(rows)  # each row gets its prompt's keys and values (a gather: grads sum)
        full_mask = torch.cat([prompt_mask[rows], completion_mask], dim=1)  # (B, P + C)
        completion_out = network(input_ids=completion_ids, attention_mask=full_mask,
                                 position_ids=completion_positions, use_cache=True, **{cache_arg: cache})
        name = "logits" if split is None else "last_hidden_state"
        prompt_features, completion_features = getattr(prompt_out, name), getattr(completion_out, name)
        # Row b's completion token j is predicted by its prompt's last position (j = 0), else by
        # completion position j - 1: hidden states (F = H), or logits (F = V) without a split.
        features = torch.cat([prompt_features[:, -1][rows][:, None], completion_features[:, :-1]], dim=1)  # (B, C, F)
        del prompt_out, completion_out, prompt_features, completion_features
        values, entropies = head_logprobs(features[wanted], completion_ids[wanted], None if split is None else split.head,
                                          temperature, with_entropy, entropy_grad,
                                          chunk_tokens or max(int(wanted.sum()), 1))  # (N,) each
    row_index, column = wanted.nonzero(as_tuple=True)
    index = row_index * length + (starts_column[row_index, 0] + column)  # (N,) flat positions in (B, T)
    logprobs = scatter_positions(values, index, (batch, length))  # (B, T)
    return logprobs, (None if entropies is None else scatter_positions(entropies, index, (batch, length)))
