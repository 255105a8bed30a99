"""The engine's forward pass: one packed step of decode rows and prefill chunks over paged KV.

A step's tokens are packed into one (N, H) activation, N = the decode rows (one token each) plus
the tokens of this step's prefill chunks, so every projection of the step is one matrix product
whatever mix of sequences it serves. This is the hand-written "llama" forward of the engine
(the "generic" one runs the model's own modules: rollout/modules.py): the Llama family's
arithmetic (Qwen2, Llama, Mistral without sliding windows; `PagedDecoder.supports`) without the
`transformers` module calls, mask builders and cache bookkeeping around it: RMSNorm, q/k/v
projections, the model's own rotary embeddings (so rope scaling variants are its own),
grouped-query attention with `scaled_dot_product_attention`, SwiGLU. A projection that is a plain
`nn.Linear` is computed from its weight directly; any other module in its place (a LoRA layer) is
called, so adapters are sampled as the trainer sees them.

Attention: each token's keys and values are written to its slot of the `BlockPool`. Decode rows
attend through a `DecodeView`, a contiguous (rows, kv_heads, capacity, head_dim) copy of their
blocks kept up to date in place (a row's blocks are gathered into it once, when it starts
decoding; each step writes one position per row). Gathering every row's blocks at every step
instead (`decode_attention="gather"`) reads the whole cache twice per step; on a CPU the view is
faster (bench/RESULTS.md, "Rollout engine"). Each prefill chunk gathers its sequence's earlier
blocks once and attends causally. On CUDA the same `scaled_dot_product_attention` calls dispatch
to the flash or memory-efficient kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from tidal.rollout.attention import (  # noqa: F401
    PagedAttention,
    VerifyLayout,
    chunk_mask,
    length_mask,
)
from tidal.rollout.blocks import BlockPool

Projection = Callable[[Tensor], Tensor]

SUPPORTED = ("qwen2", "llama", "mistral")  # the model types the "llama" forward computes


@dataclass
class Chunk:
    """One sequence's prefill chunk in a packed step."""

    start: int  # its first token's index in the pack
    tokens: int  # T, tokens in this chunk
    past: int  # P, tokens of the sequence already in the pool
    key_slots: Tensor  # (P + T,) long, pool slots of every key the chunk attends to, in order


@dataclass
class StepInput:
    """What one packed forward computes: decode rows first, then prefill chunks."""

    tokens: Tensor  # (N,) long
    positions: Tensor  # (N,) long
    slots: Tensor  # (N,) long, the pool slot each token's keys and values are written to
    decode_rows: int  # D: tokens [0, D) are decode rows, row i in the decode view's row i
    decode_lengths: list[int] = field(default_factory=list)  # (D,) keys each decode row attends to
    decode_key_slots: Tensor | None = None  # (D, max length) pool slots of their keys ("gather" only)
    chunks: list[Chunk] = field(default_factory=list)
    logit_rows: Tensor | None = None  # (R,) long, pack indices whose logits to return
    # Speculative steps: decode row i feeds decode_counts[i] tokens (its last, then its drafts),
    # packed row after row in [0, sum(decode_counts)); decode_lengths[i] counts its keys through
    # its last fed token (its first fed token's position + its count). None: one token per row.
    decode_counts: list[int] | None = None


class DecodeView:
    """Decoding rows' keys and values, contiguous per layer: (rows, kv_heads, capacity, head_dim)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.layers, self.kv_heads, self.head_dim, self.dtype, self.device = layers, kv_heads, head_dim, dtype, device
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.rows = self.capacity = 0
        self.generation = 0  # bumped whenever the tensors are reallocated (CUDA graphs hold their addresses)

    def reserve(self, rows: int, capacity: int, max_rows: int | None = None, max_capacity: int | None = None) -> None:
        """Room for `rows` rows of `capacity` positions, keeping what is there. Only a short
        dimension grows, by doubling but at most to `max_rows` / `max_capacity` (what the work
        submitted can reach): growing both at once made the view of a 256-row evaluation 6x the
        keys and values it held (13.7 GiB for 2.3, issue 42)."""
        if rows <= self.rows and capacity <= self.capacity:
            return
        allocated = bool(self.keys)
        new_rows = self.rows if rows <= self.rows else max(rows, min(2 * self.rows, max_rows or 2 * self.rows), 1)
        new_capacity = self.capacity if capacity <= self.capacity else max(
            capacity, min(2 * self.capacity, max_capacity or 2 * self.capacity))
        shape = (new_rows, self.kv_heads, new_capacity, self.head_dim)
        for store in (self.keys, self.values):
            for layer in range(self.layers):
                # Zeros, not empty: a masked-out position still enters sdpa's product as 0 * value,
                # and uninitialised memory can hold NaN.
                grown = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if allocated:
                    grown[: self.rows, :, : self.capacity] = store[layer]
                    store[layer] = grown
                else:
                    store.append(grown)
        self.rows, self.capacity = new_rows, new_capacity
        self.generation += 1

    def load(self, pool: BlockPool, row: int, slots: Tensor) -> None:
        """Row `row` := the keys and values at pool `slots` (L,), positions [0, L)."""
        length = slots.shape[0]
        for layer in range(self.layers):
            keys, values = pool.gather(layer, slots)  # (L, kv_heads, D)
            self.keys[layer][row, :, :length] = keys.transpose(0, 1)
            self.values[layer][row, :, :length] = values.transpose(0, 1)

    def move(self, source: int, target: int, length: int) -> None:
        """Row `target` := row `source`'s first `length` positions (a finished row's place refilled)."""
        for store in (self.keys, self.values):
            for layer in range(self.layers):
                store[layer][target, :, :length] = store[layer][source, :, :length]


class PagedDecoder:
    """The packed paged forward of one model (module docstring)."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
        if not self.supports(model):
            raise ValueError(
                f"the llama forward runs Llama-family decoders ({', '.join(SUPPORTED)}), not {type(model).__name__}; "
                "the engine's generic forward (rollout/modules.py) runs any causal LM"
            )
        config, inner = model.config, model.model
        self.model = model
        own = inner.embed_tokens.weight.dtype
        self.dtype = own if dtype is None else dtype
        # Another compute dtype than the model's (bf16 sampling from an fp32 policy): the forward
        # reads cast copies of the weights, refreshed by rebuilding it after a weight update.
        cast: Callable[[Tensor], Tensor] = (lambda t: t) if self.dtype == own else (lambda t: t.to(self.dtype))
        self.embed = cast(inner.embed_tokens.weight)
        self.rotary = inner.rotary_emb
        first = inner.layers[0].self_attn
        self.head_dim = int(first.head_dim)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.scaling = float(getattr(first, "scaling", self.head_dim**-0.5))
        self.num_layers = len(inner.layers)
        self._modules = _module_ids(model)
        def project(module: torch.nn.Module) -> Projection:
            if type(module) is torch.nn.Linear:
                bias = None if module.bias is None else cast(module.bias)
                return partial(F.linear, weight=cast(module.weight), bias=bias)
            if self.dtype != own:
                raise ValueError(f"sampling in {self.dtype} needs plain nn.Linear projections, not {type(module).__name__}")
            return module  # a LoRA layer: called as the trainer calls it

        self.head = project(model.lm_head)
        self.final_norm, self.final_eps = cast(inner.norm.weight), float(inner.norm.variance_epsilon)
        self.layers = []
        for layer in inner.layers:
            attention, mlp = layer.self_attn, layer.mlp
            self.layers.append((
                cast(layer.input_layernorm.weight), float(layer.input_layernorm.variance_epsilon),
                project(attention.q_proj), project(attention.k_proj), project(attention.v_proj), project(attention.o_proj),
                cast(layer.post_attention_layernorm.weight), float(layer.post_attention_layernorm.variance_epsilon),
                project(mlp.gate_proj), project(mlp.up_proj), project(mlp.down_proj),
            ))

    @staticmethod
    def supports(model: torch.nn.Module, plain_projections: bool = False) -> bool:
        """Whether `model` is a Llama-family decoder this forward computes exactly, whatever modules
        stand in for its projections (`plain_projections=True`: only if they are all `nn.Linear`)."""
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
        return not plain_projections or all(isinstance(module, torch.nn.Linear) for module in _projections(model))

    def current(self) -> bool:
        """Whether the model still holds the modules this forward read (an adapter injected since replaces them)."""
        return _module_ids(self.model) == self._modules

    def forward(self, step: StepInput, pool: BlockPool, view: DecodeView | None) -> Tensor:
        """Logits (R, V) float32 at `step.logit_rows`; every token's keys and values are written
        to its pool slot (and the decode rows' to `view`, when given)."""
        count = step.tokens.shape[0]
        attention = PagedAttention(step, pool, view, self.heads, self.kv_heads, self.head_dim, self.scaling)
        hidden = F.embedding(step.tokens, self.embed)  # (N, H)
        cos, sin = self.rotary(hidden[None], step.positions[None])  # (1, N, D) each
        half = cos.shape[-1] // 2
        cos, sin = cos[0, :, None], torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)[0, :, None]  # (N, 1, D)
        for index, (norm1, eps1, q_proj, k_proj, v_proj, o_proj, norm2, eps2, gate, up, down) in enumerate(self.layers):
            normed = _norm(hidden, norm1, eps1)
            q = q_proj(normed).view(count, self.heads, self.head_dim)
            k = k_proj(normed).view(count, self.kv_heads, self.head_dim)
            v = v_proj(normed).view(count, self.kv_heads, self.head_dim)
            q = q * cos + _swap_halves(q) * sin
            k = k * cos + _swap_halves(k) * sin
            attended = attention(index, q, k, v)
            hidden = hidden + o_proj(attended.view(count, -1))
            normed = _norm(hidden, norm2, eps2)
            hidden = hidden + down(F.silu(gate(normed)) * up(normed))
        assert step.logit_rows is not None
        last = _norm(hidden[step.logit_rows], self.final_norm, self.final_eps)  # (R, H)
        return self.head(last).float()  # (R, V)


def matmul_rate(dtype: torch.dtype, device: torch.device | str, rows: int, inputs: int, outputs: int,
                repeats: int = 10) -> float:
    """FLOP/s of `F.linear` of a (rows, inputs) activation by an (outputs, inputs) weight in
    `dtype` on `device`: the decode step's own shape, the bound its matmuls run against."""
    import time

    activation = torch.randn(rows, inputs, device=device).to(dtype)
    weight = torch.randn(outputs, inputs, device=device).to(dtype)
    synchronize = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    F.linear(activation, weight)
    fastest = float("inf")
    for _ in range(5):  # the fastest of a few trials: the bound, not the load of the moment
        synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            F.linear(activation, weight)
        synchronize()
        fastest = min(fastest, time.perf_counter() - start)
    return 2.0 * rows * inputs * outputs * repeats / fastest


def _projections(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The LM head and every layer's attention and MLP projections, in order."""
    modules = [model.lm_head]
    for layer in model.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        modules += [attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj,
                    mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    return modules


def _module_ids(model: torch.nn.Module) -> list[int]:
    return [id(module) for module in _projections(model)]


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
    """(x1, x2) -> (x2, x1) on the last dimension: `rotate_half` without its sign, which the caller
    folds into sin once: x * cos + rotate_half(x) * sin, with rotate_half(x) = (-x2, x1), equals
    x * cos + (x2, x1) * (-s1, s2) exactly ((-a) * b == a * (-b))."""
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], x[..., :half]), dim=-1)
