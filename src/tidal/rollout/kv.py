"""A KV cache that writes each step in place instead of re-concatenating the whole cache.

`transformers`' `DynamicCache` appends a token with `torch.cat`, copying every layer's cache at
every decode step; on a CPU that copy is a sizeable share of a small model's step. `FlatCache`
allocates each layer's keys and values once for the longest sequence of the batch and hands the
attention a view of the filled part. It is a `DynamicCache` whose layers override storage only,
so masks, positions and batch reordering go through the same `transformers` code paths. Models
whose cache needs other layer kinds (sliding windows, linear attention) keep `DynamicCache`.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer


class FlatLayer(DynamicLayer):
    """One layer's keys and values in buffers of `capacity` positions: (B, heads, capacity, head_dim)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._key_buffer: Tensor | None = None
        self._value_buffer: Tensor | None = None

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        batch, heads, _, key_dim = key_states.shape
        self.device = key_states.device
        self._key_buffer = key_states.new_empty((batch, heads, self.capacity, key_dim))
        self._value_buffer = value_states.new_empty((batch, value_states.shape[1], self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args: object, **kwargs: object) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self._key_buffer is not None and self._value_buffer is not None
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            self._grow(end)
        self._key_buffer[:, :, self.length : end] = key_states
        self._value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self._refresh_views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        # Same convention as DynamicLayer: a negative count of tokens to drop from the end.
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self.length = max(0, self.length + tokens_to_remove)
        self._refresh_views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._set_buffers(
                self._key_buffer.repeat_interleave(repeats, dim=0), self._value_buffer.repeat_interleave(repeats, dim=0)
            )

    def batch_select_indices(self, indices: Tensor) -> None:
        if self.is_initialized:
            self._set_buffers(self._key_buffer[indices], self._value_buffer[indices])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.is_initialized:
            self.batch_select_indices(beam_idx.to(self.device))

    def reset(self) -> None:
        self.length = 0
        self._key_buffer = self._value_buffer = None
        super().reset()

    def _grow(self, needed: int) -> None:
        """Reallocate for at least `needed` positions (only when a caller outruns the planned capacity)."""
        assert self._key_buffer is not None and self._value_buffer is not None
        self.capacity = max(needed, 2 * self.capacity)
        keys = self._key_buffer.new_empty((*self._key_buffer.shape[:2], self.capacity, self._key_buffer.shape[-1]))
        values = self._value_buffer.new_empty(
            (*self._value_buffer.shape[:2], self.capacity, self._value_buffer.shape[-1])
        )
        keys[:, :, : self.length] = self._key_buffer[:, :, : self.length]
        values[:, :, : self.length] = self._value_buffer[:, :, : self.length]
        self._set_buffers(keys, values)

    def _set_buffers(self, keys: Tensor, values: Tensor) -> None:
        self._key_buffer, self._value_buffer = keys, values
        self._refresh_views()

    def _refresh_views(self) -> None:
        # `keys`/`values` are what transformers' code reads; keep them the filled part of the buffers.
        if self._key_buffer is not None and self._value_buffer is not None:
            self.keys = self._key_buffer[:, :, : self.length]
            self.values = self._value_buffer[:, :, : self.length]


class FlatCache(DynamicCache):
    """A `DynamicCache` of `FlatLayer`s sized for `capacity` positions (prompt + completion)."""

    def __init__(self, config: PretrainedConfig, capacity: int) -> None:
        layers = [FlatLayer(capacity) for _ in range(_num_layers(config))]
        Cache.__init__(self, layers=layers)


def supports_flat_cache(model: PreTrainedModel) -> bool:
    """Whether `model`'s own dynamic cache is plain full-attention `DynamicLayer`s, which FlatLayer replaces."""
    try:
        layers = DynamicCache(config=model.config).layers
    except (TypeError, ValueError, AttributeError, KeyError):
        return False
    return bool(layers) and len(layers) == _num_layers(model.config) and all(type(layer) is DynamicLayer for layer in layers)


def _num_layers(config: PretrainedConfig) -> int:
    return int(config.get_text_config(decoder=True).num_hidden_layers)
