"""A lean forward pass for sampling from Llama-family decoders (Qwen2, Llama, Mistral without
sliding windows): the same arithmetic as their `transformers` modules, without the module calls,
mask builders and cache bookkeeping around it.

On a CPU a small model's decode step pays a large share of overhead: `transformers` runs each
layer through a dozen `nn.Module` calls, builds a 4-D mask and looks up its attention interface
every step (bench/RESULTS.md, "Rollout", compares the two forwards: the transformers-forward column).
`LeanDecoder` reads the model's own parameters (the same tensor objects, so weight updates are
seen at once) and computes per layer RMSNorm, the q/k/v projections with their biases, the model's
own rotary embeddings (so rope scaling variants are its own), grouped-query attention with
`scaled_dot_product_attention` over a preallocated `LeanCache`, the output projection and the
SwiGLU MLP; then the final norm and the LM head on the last position only. Logits match the
`transformers` forward to float rounding (tests/unit/rollout/test_lean.py). `supports(model)` says
whether a model has exactly that structure; anything else falls back to the `transformers`
forward (`StaticEngine(..., kv_cache="dynamic")` forces it). The paged engine runs the same
arithmetic over paged KV (rollout/paged.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

SUPPORTED = ("qwen2", "llama", "mistral")


@dataclass
class _Layer:
    norm1: Tensor
    eps1: float
    q: tuple[Tensor, Tensor | None]
    k: tuple[Tensor, Tensor | None]
    v: tuple[Tensor, Tensor | None]
    o: tuple[Tensor, Tensor | None]
    norm2: Tensor
    eps2: float
    gate: tuple[Tensor, Tensor | None]
    up: tuple[Tensor, Tensor | None]
    down: tuple[Tensor, Tensor | None]


class LeanCache:
    """Each layer's keys and values in buffers of `capacity` positions, (B, kv_heads, capacity,
    head_dim), filled up to `length`; `batch_select_indices` reorders the rows (prefix reuse,
    dropping finished rows) as `transformers`' caches do."""

    def __init__(self, layers: int, capacity: int) -> None:
        self.capacity = capacity
        self.length = 0
        self.keys: list[Tensor | None] = [None] * layers
        self.values: list[Tensor | None] = [None] * layers

    def append(self, layer: int, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Write `keys`/`values` (B, kv_heads, T, head_dim) after the filled part of `layer`; the
        filled part, new positions included."""
        start = self.length
        end = start + keys.shape[2]
        buffer_k, buffer_v = self.keys[layer], self.values[layer]
        if buffer_k is None or buffer_v is None or end > buffer_k.shape[2]:
            capacity = max(end, self.capacity if buffer_k is None else 2 * buffer_k.shape[2])
            grown_k = keys.new_empty((keys.shape[0], keys.shape[1], capacity, keys.shape[3]))
            grown_v = values.new_empty((values.shape[0], values.shape[1], capacity, values.shape[3]))
            if buffer_k is not None and buffer_v is not None:
                grown_k[:, :, :start], grown_v[:, :, :start] = buffer_k[:, :, :start], buffer_v[:, :, :start]
            buffer_k, buffer_v = grown_k, grown_v
            self.keys[layer], self.values[layer] = buffer_k, buffer_v
        buffer_k[:, :, start:end] = keys
        buffer_v[:, :, start:end] = values
        return buffer_k[:, :, :end], buffer_v[:, :, :end]

    def advance(self, tokens: int) -> None:
        self.length += tokens

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: Tensor) -> None:
        self.keys = [None if k is None else k[indices] for k in self.keys]
        self.values = [None if v is None else v[indices] for v in self.values]


def _linear(module: torch.nn.Module) -> tuple[Tensor, Tensor | None]:
    return module.weight, getattr(module, "bias", None)


def _projections(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The LM head and every layer's attention and MLP projections, in order."""
    modules = [model.lm_head]
    for layer in model.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        modules += [attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj,
                    mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    return modules


class LeanDecoder:
    """The lean forward of one model (see the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        if not self.supports(model):
            raise ValueError(f"LeanDecoder does not support {type(model).__name__}; use the transformers forward")
        config = model.config
        inner = model.model
        self.model = model
        self.embed = inner.embed_tokens.weight
        self.rotary = inner.rotary_emb
        self.final_norm, self.final_eps = inner.norm.weight, float(inner.norm.variance_epsilon)
        self.head = _linear(model.lm_head)
        first = inner.layers[0].self_attn
        self.head_dim = int(first.head_dim)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.scaling = float(getattr(first, "scaling", self.head_dim**-0.5))
        self.layers = [
            _Layer(
                layer.input_layernorm.weight, float(layer.input_layernorm.variance_epsilon),
                _linear(layer.self_attn.q_proj), _linear(layer.self_attn.k_proj), _linear(layer.self_attn.v_proj),
                _linear(layer.self_attn.o_proj),
                layer.post_attention_layernorm.weight, float(layer.post_attention_layernorm.variance_epsilon),
                _linear(layer.mlp.gate_proj), _linear(layer.mlp.up_proj), _linear(layer.mlp.down_proj),
            )
            for layer in inner.layers
        ]
        self._modules = [id(module) for module in _projections(model)]

    @staticmethod
    def supports(model: torch.nn.Module, plain_projections: bool = True) -> bool:
        """Whether `model` is a plain Llama-family decoder this forward computes exactly
        (`plain_projections=False`: whatever modules stand in for its projections)."""
        config = getattr(model, "config", None)
        if config is None or getattr(config, "model_type", None) not in SUPPORTED:
            return False
        layer_types = getattr(config, "layer_types", None) or []
        if any(kind != "full_attention" for kind in layer_types) or getattr(config, "use_sliding_window", False):
            return False
        if getattr(config, "sliding_window", None) and config.model_type == "mistral":
            return False
        if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "pretraining_tp", 1) != 1:
            return False
        inner = getattr(model, "model", None)
        try:
            layer = inner.layers[0]  # type: ignore[union-attr]
            parts = (inner.embed_tokens, inner.norm, inner.rotary_emb, model.lm_head, layer.input_layernorm,  # type: ignore[union-attr]
                     layer.post_attention_layernorm, layer.self_attn.q_proj, layer.self_attn.k_proj,
                     layer.self_attn.v_proj, layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj,
                     layer.mlp.down_proj)
        except (AttributeError, IndexError, TypeError):
            return False
        norms = (inner.norm, layer.input_layernorm, layer.post_attention_layernorm)  # type: ignore[union-attr]
        if not all(p is not None for p in parts) or not all(hasattr(n, "variance_epsilon") for n in norms):
            return False
        # Plain nn.Linear projections only: a LoRA layer (peft) exposes its base layer's `weight`,
        # and reading that alone would sample from the base model, the adapter ignored.
        return not plain_projections or all(isinstance(module, torch.nn.Linear) for module in _projections(model))

    def current(self) -> bool:
        """Whether the model still holds the projection modules this forward read (an adapter
        injected since, e.g. LoRA, replaces them: then this forward would compute the old model)."""
        return [id(module) for module in _projections(self.model)] == self._modules

    def new_cache(self, capacity: int) -> LeanCache:
        return LeanCache(len(self.layers), capacity)

    def last_logits(self, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor,
                    cache: LeanCache) -> Tensor:
        """Logits (B, V) in float32 at the last position of `input_ids` (B, T), which follow the
        `cache.length` cached positions; `attention_mask` (B, cached + T) marks real tokens (None:
        all are). The new keys and values are appended to `cache`."""
        batch, tokens = input_ids.shape
        past = cache.length
        # Activations are kept (B * T, H), so each projection is one matrix product with no reshape
        # around it (a decode step has T = 1), and a norm in float32 is one call (`_norm`).
        hidden = F.embedding(input_ids.reshape(-1), self.embed)  # (B * T, H)
        cos, sin = self.rotary(hidden.view(batch, tokens, -1), position_ids)  # (B, T, D) each
        # The rotary sign folded into sin once: x * cos + rotate_half(x) * sin, with rotate_half(x) =
        # (-x2, x1), equals x * cos + (x2, x1) * (-s1, s2) exactly ((-a) * b == a * (-b)), without
        # negating q and k in every layer.
        half = cos.shape[-1] // 2
        cos, sin = cos[:, None], torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)[:, None]  # (B, 1, T, D)
        mask = _mask(attention_mask, batch, past, tokens, hidden.device)
        for index, layer in enumerate(self.layers):
            normed = _norm(hidden, layer.norm1, layer.eps1)
            q = F.linear(normed, *layer.q).view(batch, tokens, self.heads, self.head_dim).transpose(1, 2)
            k = F.linear(normed, *layer.k).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
            v = F.linear(normed, *layer.v).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + _swap_halves(q) * sin
            k = k * cos + _swap_halves(k) * sin
            keys, values = cache.append(index, k, v)  # (B, kv_heads, past + T, D)
            attended = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=self.kv_heads != self.heads,
                is_causal=mask is None and tokens > 1,
            )  # (B, heads, T, D)
            hidden = hidden + F.linear(attended.transpose(1, 2).reshape(batch * tokens, -1), *layer.o)
            normed = _norm(hidden, layer.norm2, layer.eps2)
            hidden = hidden + F.linear(F.silu(F.linear(normed, *layer.gate)) * F.linear(normed, *layer.up), *layer.down)
        cache.advance(tokens)
        last = _norm(hidden.view(batch, tokens, -1)[:, -1], self.final_norm, self.final_eps)  # (B, H)
        return F.linear(last, *self.head).float()  # (B, V)


def _mask(attention_mask: Tensor | None, batch: int, past: int, tokens: int, device: torch.device) -> Tensor | None:
    """A boolean (B, 1, T, past + T) mask: key j visible to query i when it is a real token at or
    before i. Each query also sees itself, so a padding query's row is never empty (its output is
    discarded; an empty row would give NaN). None when nothing is padded and no causal mask is
    needed beyond sdpa's own."""
    if attention_mask is None:
        if past == 0 or tokens == 1:
            return None
        attention_mask = torch.ones((batch, past + tokens), dtype=torch.bool, device=device)
    keys = attention_mask[:, : past + tokens].bool()[:, None, None, :]  # (B, 1, 1, K)
    query_positions = torch.arange(past, past + tokens, device=device)[:, None]  # (T, 1)
    key_positions = torch.arange(past + tokens, device=device)[None, :]  # (1, K)
    causal = key_positions <= query_positions  # (T, K)
    return (keys & causal) | (key_positions == query_positions)


def _rms_norm(hidden: Tensor, weight: Tensor, eps: float) -> Tensor:
    dtype = hidden.dtype
    values = hidden.to(torch.float32)
    values = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + eps)
    return weight * values.to(dtype)


def _norm(hidden: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm of the last dimension: one call to `F.rms_norm` where both are float32 (on the CPU it
    runs `_rms_norm`'s ops in the same order, without a Python call for each); else `_rms_norm`,
    whose order of casts is the `transformers` modules' for half precision."""
    if hidden.dtype == weight.dtype == torch.float32:
        return F.rms_norm(hidden, (hidden.shape[-1],), weight, eps)
    return _rms_norm(hidden, weight, eps)


def _swap_halves(x: Tensor) -> Tensor:
    """(x1, x2) -> (x2, x1) on the last dimension: `rotate_half` without its sign (folded into sin)."""
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], x[..., :half]), dim=-1)
