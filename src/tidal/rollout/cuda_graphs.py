"""CUDA graphs for the engine's decode steps (`rollout.cuda_graphs`), where CUDA is there.

A decode step of a small model on a GPU is mostly kernel launches: a few hundred small kernels
whose launch cost exceeds their work. A CUDA graph records one step's kernels once and replays
them with one launch. A graph holds fixed shapes and fixed memory, so `StaticDecode` computes a
decode-only step (every row one token, no prefill chunk, no drafts) from tensors alone, no
Python-side value of the inputs steering it:

- rows are padded to a bucket (1, 2, 4, ... up to the decode view's rows); a padding row feeds
  token 0 at position 0 and writes its keys and values to a scratch block of the pool that no
  sequence owns, and into its own unused row of the view, so it touches nothing real;
- the keys attended to are the view's first `span` positions (a power of two, at least the
  longest row), masked per row by its length, instead of slicing to the longest row;
- the inputs are copied into the graph's static buffers before each replay, the logits copied out.

A graph is kept per (rows bucket, span) and valid while the view and the pool keep their memory:
the view's `generation` changes when it grows, and every graph is dropped then. Weight updates
copy into the parameters in place and keep the graphs valid; a forward rebuilt (new cast copies
in bfloat16, an adapter injected) comes with a new `StaticDecode`.

`StaticDecode.run` is also callable eagerly (`graphs=False`, the CPU path of the tests): the
computation that is captured, run op by op, must give the dynamic forward's logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from tidal.rollout.blocks import BlockPool
from tidal.rollout.paged import _norm, _swap_halves

if TYPE_CHECKING:
    from tidal.rollout.paged import DecodeView, PagedDecoder, StepInput

WARMUP_RUNS = 2  # eager runs on a side stream before a capture (cuBLAS and allocator warm-up)


def graphs_available(device: torch.device) -> bool:
    """Whether CUDA graphs can be captured on `device` (a CUDA device, and torch built with them)."""
    return device.type == "cuda" and torch.cuda.is_available() and hasattr(torch.cuda, "CUDAGraph")


def bucket(value: int) -> int:
    """The smallest power of two >= `value`."""
    return 1 << max(0, value - 1).bit_length()


class StaticDecode:
    """Decode-only steps of one `PagedDecoder` over one pool and view, replayed from CUDA graphs
    (`graphs=True`) or run eagerly with the same padded, tensor-only computation."""

    def __init__(self, decoder: PagedDecoder, pool: BlockPool, view: DecodeView, graphs: bool) -> None:
        self.decoder, self.pool, self.view, self.graphs = decoder, pool, view, graphs
        scratch = pool.allocate()
        if scratch is None:
            raise RuntimeError("no free KV block for the decode graphs' scratch slot")
        self.scratch_block = scratch  # held for the engine's life: padding rows write here
        self._captured: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, dict[str, Tensor], Tensor]] = {}
        self._generation = view.generation
        self.replays = 0  # steps served from a graph (the tests' and the bench's evidence)

    def supports(self, step: StepInput) -> bool:
        """Whether `step` is one this path computes: decode rows only, one token each."""
        return step.decode_rows > 0 and not step.chunks and step.decode_counts is None

    def __call__(self, step: StepInput) -> Tensor:
        """Logits (D, V) float32 of a decode-only step, keys and values written as the dynamic forward does."""
        rows = step.decode_rows
        padded_rows = min(bucket(rows), self.view.rows)
        span = min(bucket(max(step.decode_lengths)), self.view.capacity)
        inputs = self._inputs(step, padded_rows)
        if not self.graphs:
            self.replays += 1
            return self.run(inputs, span)[:rows]
        if self.view.generation != self._generation:  # the view grew: its memory moved
            self._captured.clear()
            self._generation = self.view.generation
        key = (padded_rows, span)
        if key not in self._captured:
            self._captured[key] = self._capture(inputs, span)
        graph, static, out = self._captured[key]
        for name, tensor in inputs.items():
            static[name].copy_(tensor)
        graph.replay()
        self.replays += 1
        return out[:rows].clone()

    def _inputs(self, step: StepInput, padded_rows: int) -> dict[str, Tensor]:
        rows, device = step.decode_rows, step.tokens.device
        pad = padded_rows - rows
        scratch_slot = self.scratch_block * self.pool.block_size
        tokens = torch.cat([step.tokens[:rows], torch.zeros(pad, dtype=torch.long, device=device)])
        positions = torch.cat([step.positions[:rows], torch.zeros(pad, dtype=torch.long, device=device)])
        slots = torch.cat([step.slots[:rows], torch.full((pad,), scratch_slot, dtype=torch.long, device=device)])
        lengths = torch.tensor(list(step.decode_lengths) + [1] * pad, dtype=torch.long, device=device)
        return {"tokens": tokens, "positions": positions, "slots": slots, "lengths": lengths}

    def _capture(self, inputs: dict[str, Tensor], span: int) -> tuple[torch.cuda.CUDAGraph, dict[str, Tensor], Tensor]:
        static = {name: tensor.clone() for name, tensor in inputs.items()}
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                self.run(static, span)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.run(static, span)
        return graph, static, out

    def run(self, inputs: dict[str, Tensor], span: int) -> Tensor:
        """One padded decode step from tensors alone: logits (padded rows, V) float32."""
        d = self.decoder
        tokens, positions, slots, lengths = inputs["tokens"], inputs["positions"], inputs["slots"], inputs["lengths"]
        count = tokens.shape[0]
        hidden = F.embedding(tokens, d.embed)
        cos, sin = d.rotary(hidden[None], positions[None])
        half = cos.shape[-1] // 2
        cos, sin = cos[0, :, None], torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)[0, :, None]
        rows = torch.arange(count, device=tokens.device)
        mask = (torch.arange(span, device=tokens.device)[None, :] < lengths[:, None])[:, None, None, :]
        for index, (norm1, eps1, q_proj, k_proj, v_proj, o_proj, norm2, eps2, gate, up, down) in enumerate(d.layers):
            normed = _norm(hidden, norm1, eps1)
            q = q_proj(normed).view(count, d.heads, d.head_dim)
            k = k_proj(normed).view(count, d.kv_heads, d.head_dim)
            v = v_proj(normed).view(count, d.kv_heads, d.head_dim)
            q = q * cos + _swap_halves(q) * sin
            k = k * cos + _swap_halves(k) * sin
            self.pool.keys[index].index_copy_(0, slots, k)
            self.pool.values[index].index_copy_(0, slots, v)
            self.view.keys[index][rows, :, positions] = k
            self.view.values[index][rows, :, positions] = v
            keys = self.view.keys[index][:count, :, :span]
            values = self.view.values[index][:count, :, :span]
            attended = F.scaled_dot_product_attention(
                q[:, :, None], keys, values, attn_mask=mask, scale=d.scaling, enable_gqa=d.kv_heads != d.heads
            )[:, :, 0]
            hidden = hidden + o_proj(attended.reshape(count, -1))
            normed = _norm(hidden, norm2, eps2)
            hidden = hidden + down(F.silu(gate(normed)) * up(normed))
        return d.head(_norm(hidden, d.final_norm, d.final_eps)).float()


def decode_forward(static: StaticDecode | None, dynamic: Callable[[StepInput], Tensor]) -> Callable[[StepInput], Tensor]:
    """The step function: decode-only steps through `static` where given, everything else `dynamic`."""
    if static is None:
        return dynamic

    def forward(step: StepInput) -> Tensor:
        return static(step) if static.supports(step) else dynamic(step)

    return forward
