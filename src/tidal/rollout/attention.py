"""Paged attention for one packed engine step, shared by both of the engine's forwards.

A step packs decode rows (one token each, or a speculative row's last token and its drafts) and
prefill chunks into one (N, ...) activation (rollout/paged.py `StepInput`). `PagedAttention`
computes one layer's attention for all of them: it writes every token's keys and values to its
pool slot (and decode rows' to the `DecodeView`), then lets decode rows attend over the view (or
their gathered blocks), speculative rows causally over theirs, and each prefill chunk over its
sequence's earlier blocks and itself. Per-layer options cover what architectures vary: the
softmax `scaling`, a sliding `window` (a query at position p sees keys (p - window, p], as
transformers' sliding-window masks do) and attention-logit soft-capping (`softcap`).

The generic forward (rollout/modules.py) runs a model's own transformers modules and reaches this
through transformers' attention interface: `register(fallback)` adds the implementation
"tidal_paged" ("tidal_paged_<fallback>" for another fallback than sdpa), whose attention function
computes paged attention while a step is active on this thread (`active(...)`) and builds no mask
then, and otherwise is the implementation the model had before (sdpa, eager, ...) with that
implementation's masks, so a model object shared with the trainer trains exactly as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tidal.rollout.blocks import BlockPool

IMPLEMENTATION = "tidal_paged"
_ACTIVE: contextvars.ContextVar[PagedAttention | None] = contextvars.ContextVar("tidal_paged_step", default=None)


@dataclass
class VerifyLayout:
    """Where a speculative step's decode tokens sit: packed (sum of counts) and padded (D, T)."""

    token_rows: Tensor  # (M,) long, each packed decode token's row
    token_positions: Tensor  # (M,) long, its position in the sequence
    padded_index: Tensor  # (M,) long, its index in the (D * T) padded layout
    rows: int  # D
    width: int  # T, the longest row's tokens
    mask: Tensor  # (D, 1, T, L) bool: query t of row i sees key j when j <= its position
    query: Tensor  # (D, T) long, each padded query's position (a padding query: the row's last)

    @classmethod
    def of(cls, step: Any, device: torch.device) -> VerifyLayout:
        assert step.decode_counts is not None
        counts, rows = step.decode_counts, len(step.decode_counts)
        width, longest = max(counts), max(step.decode_lengths)
        token_rows = torch.repeat_interleave(torch.arange(rows, device=device), torch.tensor(counts, device=device))
        offsets = torch.cat([torch.arange(c, device=device) for c in counts])
        positions = step.positions[: token_rows.shape[0]]
        first = torch.tensor([length - count for length, count in zip(step.decode_lengths, counts)], device=device)
        # a padding query (t >= count) sees what the row's last real query sees: finite, and dropped
        query = first[:, None] + torch.minimum(torch.arange(width, device=device)[None, :],
                                               torch.tensor(counts, device=device)[:, None] - 1)  # (D, T)
        mask = torch.arange(longest, device=device)[None, None, :] <= query[:, :, None]
        return cls(token_rows, positions, token_rows * width + offsets, rows, width, mask[:, None], query)


class PagedAttention:
    """One step's attention over the pool, layer by layer (module docstring)."""

    def __init__(self, step: Any, pool: BlockPool, view: Any, heads: int, kv_heads: int, head_dim: int,
                 scaling: float) -> None:
        self.step, self.pool, self.view = step, pool, view
        self.heads, self.kv_heads, self.head_dim, self.scaling = heads, kv_heads, head_dim, scaling
        device = step.tokens.device
        self.verify = VerifyLayout.of(step, device) if step.decode_counts is not None else None
        self.decode = step.decode_rows
        self.fed = self.decode if self.verify is None else self.verify.token_rows.shape[0]
        plain_decode = self.decode and self.verify is None
        self.decode_mask = length_mask(step.decode_lengths, device) if plain_decode else None
        self.longest = max(step.decode_lengths, default=0)
        self.same_position = (self.longest - 1 if plain_decode and min(step.decode_lengths) == self.longest
                              else None)
        self.positions = step.positions[: self.decode]
        self.rows = torch.arange(self.decode, device=device)
        self.chunk_masks = [chunk_mask(chunk, device) for chunk in step.chunks]
        self._windowed: dict[int, tuple[Tensor | None, Tensor | None, list[Tensor]]] = {}

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scaling: float | None = None,
                 window: int | None = None, softcap: float | None = None) -> Tensor:
        """q (N, heads, hd), k/v (N, kv_heads, hd) of `layer` -> attention output (N, heads, hd)."""
        step, pool = self.step, self.pool
        scale = self.scaling if scaling is None else float(scaling)
        pool.keys[layer].index_copy_(0, step.slots, k)
        pool.values[layer].index_copy_(0, step.slots, v)
        decode_mask, verify_mask, chunk_masks = self._masks(window)
        out = torch.empty_like(q)
        fed = self.fed
        if self.verify is not None:
            out[:fed] = self._verify(layer, q[:fed], k[:fed], v[:fed], verify_mask, scale, softcap)
        elif self.decode:
            keys, values = self._decode_keys(layer, k, v)
            out[:fed] = _decode_attention(q[:fed], keys, values, decode_mask, scale, softcap)
        for chunk, mask in zip(step.chunks, chunk_masks):
            keys, values = pool.gather(layer, chunk.key_slots)  # (P + T, kv_heads, hd)
            queries = q[chunk.start : chunk.start + chunk.tokens].transpose(0, 1)[None]  # (1, heads, T, hd)
            attended = attend(queries, keys.transpose(0, 1)[None], values.transpose(0, 1)[None], mask, scale, softcap,
                              causal=mask is None and chunk.tokens > 1)
            out[chunk.start : chunk.start + chunk.tokens] = attended[0].transpose(0, 1)
        return out

    def _masks(self, window: int | None) -> tuple[Tensor | None, Tensor | None, list[Tensor]]:
        """The decode, verify and chunk masks, narrowed to a sliding `window` when one is given."""
        verify_mask = None if self.verify is None else self.verify.mask
        if window is None or window >= self._longest_key():
            return self.decode_mask, verify_mask, self.chunk_masks
        if window not in self._windowed:
            device = self.step.tokens.device
            decode_mask = None
            if self.decode and self.verify is None:
                lengths = torch.tensor(self.step.decode_lengths, device=device)
                keys = torch.arange(self.longest, device=device)[None, :]
                decode_mask = ((keys < lengths[:, None]) & (keys > lengths[:, None] - 1 - window))[:, None, None, :]
            if self.verify is not None:
                keys = torch.arange(self.longest, device=device)[None, None, :]
                verify_mask = self.verify.mask & (keys > self.verify.query[:, :, None] - window)[:, None]
            chunk_masks = []
            for chunk in self.step.chunks:
                queries = torch.arange(chunk.past, chunk.past + chunk.tokens, device=device)[:, None]
                keys = torch.arange(chunk.past + chunk.tokens, device=device)[None, :]
                chunk_masks.append((keys <= queries) & (keys > queries - window))
            self._windowed[window] = (decode_mask, verify_mask, chunk_masks)
        return self._windowed[window]

    def _longest_key(self) -> int:
        ends = [chunk.past + chunk.tokens for chunk in self.step.chunks]
        return max([self.longest, *ends])

    def _decode_keys(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Decode rows' keys and values (D, kv_heads, L, hd), this step's position written."""
        view, decode = self.view, self.decode
        if view is None:
            assert self.step.decode_key_slots is not None
            keys, values = self.pool.gather(layer, self.step.decode_key_slots)  # (D, L, kv_heads, hd)
            return keys.transpose(1, 2), values.transpose(1, 2)
        if self.same_position is not None:  # a GRPO batch: one strided copy
            view.keys[layer][:decode, :, self.same_position] = k[:decode]
            view.values[layer][:decode, :, self.same_position] = v[:decode]
        else:
            view.keys[layer][self.rows, :, self.positions] = k[:decode]
            view.values[layer][self.rows, :, self.positions] = v[:decode]
        return view.keys[layer][:decode, :, : self.longest], view.values[layer][:decode, :, : self.longest]

    def _verify(self, layer: int, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                softcap: float | None) -> Tensor:
        """Speculative rows: each row's T tokens attend causally over its keys; q, k, v packed (M, ...)."""
        verify, step, view = self.verify, self.step, self.view
        assert verify is not None
        if view is not None:
            view.keys[layer][verify.token_rows, :, verify.token_positions] = k
            view.values[layer][verify.token_rows, :, verify.token_positions] = v
            keys = view.keys[layer][: verify.rows, :, : self.longest]
            values = view.values[layer][: verify.rows, :, : self.longest]
        else:
            assert step.decode_key_slots is not None
            keys, values = self.pool.gather(layer, step.decode_key_slots)
            keys, values = keys.transpose(1, 2), values.transpose(1, 2)
        padded = q.new_zeros((verify.rows * verify.width, self.heads, self.head_dim))
        padded[verify.padded_index] = q
        queries = padded.view(verify.rows, verify.width, self.heads, self.head_dim).transpose(1, 2)  # (D, heads, T, hd)
        out = attend(queries, keys, values, mask, scale, softcap)
        return out.transpose(1, 2).reshape(verify.rows * verify.width, self.heads, self.head_dim)[verify.padded_index]


def attend(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, scale: float, softcap: float | None,
           causal: bool = False) -> Tensor:
    """q (B, heads, T, hd) over keys/values (B, kv_heads, L, hd), `mask` bool broadcastable to
    (B, heads, T, L) -> (B, heads, T, hd). sdpa, or the explicit product when logits are soft-capped."""
    gqa = keys.shape[1] != q.shape[1]
    if softcap is None:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal, scale=scale,
                                              enable_gqa=gqa)
    if gqa:
        keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
        values = values.repeat_interleave(q.shape[1] // values.shape[1], dim=1)
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if causal:
        mask = torch.ones(q.shape[2], keys.shape[2], dtype=torch.bool, device=q.device).tril(keys.shape[2] - q.shape[2])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1).to(values.dtype), values)


def _decode_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, scale: float,
                      softcap: float | None) -> Tensor:
    """Decode rows' attention: q (D, heads, hd) over keys/values (D, kv_heads, L, hd) -> (D, heads, hd).
    Two matrix products on a CPU in float32 (faster there, bench/RESULTS.md "Rollout"), else sdpa
    (flash and memory-efficient kernels on CUDA; on a CPU in bfloat16 sdpa is the faster)."""
    if q.device.type == "cpu" and q.dtype == torch.float32 and softcap is None:
        rows, heads, dim = q.shape
        kv_heads = keys.shape[1]
        scores = torch.matmul(q.view(rows, kv_heads, heads // kv_heads, dim), keys.transpose(-1, -2)) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.matmul(scores.softmax(dim=-1), values).view(rows, heads, dim)
    return attend(q[:, :, None], keys, values, mask, scale, softcap)[:, :, 0]


@contextlib.contextmanager
def active(attention: PagedAttention) -> Iterator[None]:
    """Within this block, on this thread, "tidal_paged" attention computes `attention`'s step."""
    token = _ACTIVE.set(attention)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def _attention_function(fallback: str) -> Any:
    """transformers' attention-function signature: query (1, heads, N, hd), key/value (1, kv, N, hd)
    -> (1, N, heads, hd). Paged while a step is active on this thread; otherwise the `fallback`
    implementation the model had before (its own eager function for "eager")."""

    def attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                  scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, None]:
        step = _ACTIVE.get()
        if step is None:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            own = ALL_ATTENTION_FUNCTIONS.get(fallback) if fallback != "eager" else None
            own = own or sys.modules[type(module).__module__].eager_attention_forward
            return own(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise ValueError(f"{type(module).__name__} has no layer_idx: the paged engine cannot tell its layer")
        out = step(int(layer), query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                   scaling=scaling, window=kwargs.get("sliding_window"), softcap=kwargs.get("softcap"))
        return out[None], None

    return attention


def _mask_function(fallback: str) -> Any:
    """No mask inside a paged step (PagedAttention masks by itself); the `fallback`'s mask otherwise."""

    def mask(*args: Any, **kwargs: Any) -> Any:
        if _ACTIVE.get() is not None:
            return None
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        return ALL_MASK_ATTENTION_FUNCTIONS[fallback](*args, **kwargs)

    return mask


def register(fallback: str | None) -> str:
    """Register the paged implementation whose fallback is `fallback` (the model's implementation
    until now: "sdpa", "eager", ...) with transformers' attention and mask interfaces; its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import (
        ALL_MASK_ATTENTION_FUNCTIONS,
        AttentionMaskInterface,
    )

    fallback = fallback or "sdpa"
    if fallback.startswith(IMPLEMENTATION):
        return fallback  # the model runs a paged implementation already
    if fallback not in ALL_MASK_ATTENTION_FUNCTIONS:
        fallback = "sdpa"  # a kernel implementation without a mask function of its own
    name = IMPLEMENTATION if fallback == "sdpa" else f"{IMPLEMENTATION}_{fallback}"
    AttentionInterface.register(name, _attention_function(fallback))
    AttentionMaskInterface.register(name, _mask_function(fallback))
    return name


def length_mask(lengths: list[int], device: torch.device) -> Tensor | None:
    """(D, 1, 1, L) bool: key j visible to decode row i when j < lengths[i]; None when all are equal."""
    if min(lengths) == max(lengths):
        return None
    keys = torch.arange(max(lengths), device=device)[None, :]
    return (keys < torch.tensor(lengths, device=device)[:, None])[:, None, None, :]


def chunk_mask(chunk: Any, device: torch.device) -> Tensor | None:
    """(T, P + T) bool causal mask of a chunk after P cached positions; None when P = 0 (sdpa's own)."""
    if chunk.past == 0:
        return None
    queries = torch.arange(chunk.past, chunk.past + chunk.tokens, device=device)[:, None]
    return torch.arange(chunk.past + chunk.tokens, device=device)[None, :] <= queries
