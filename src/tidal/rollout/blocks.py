"""Paged KV memory: a pool of fixed-size blocks per layer, a free list, refcounts, and a prefix
cache of full blocks keyed by their tokens.

Each layer holds keys and values as `[num_blocks, block_size, kv_heads, head_dim]`; a sequence owns
a block table (the ids of its blocks, in order), so position `p` of a sequence lives in block
`table[p // block_size]` at offset `p % block_size`, its "slot" `block * block_size + offset` of
the pool viewed flat. Blocks are refcounted: the samples of a GRPO group share their prompt's
full blocks, and a block returns to the free list when its last holder lets go.

Prefix cache: a full block is registered under the hash of its tokens chained with the hash of
the blocks before it (so equal hashes mean equal whole prefixes, not just equal blocks), rooted in
the weight version it was computed with (KV of old weights never matches a lookup under new
ones). A registered block whose refcount drops to zero is kept, evictable, in least-recently-used
order: a later prompt with the same prefix (a system prompt, an agent's earlier turns) takes it
instead of recomputing it. Allocation takes a free block first, then evicts the least recently
used cached one. Python's tuple hash is 64-bit: a collision between two different prefixes in one
process is possible in principle and ignored here, as vLLM ignores it with its default hash.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PoolStats:
    """Prefix-cache counts since the engine started (or `reset`)."""

    prompt_tokens: int = 0  # prompt tokens of every sequence admitted (each sample of a group counts)
    cached_tokens: int = 0  # of those, read from the prefix cache instead of computed
    forked_tokens: int = 0  # of those, shared with the first sample of the same group (one prefill per group)
    recomputed_tokens: int = 0  # tokens prefilled again after a preemption
    preemptions: int = 0  # sequences preempted (their blocks freed, requeued) when blocks ran out
    evictions: int = 0  # cached blocks evicted to make room

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens whose KV was reused (prefix cache or group fork), not computed."""
        return (self.cached_tokens + self.forked_tokens) / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        """Share of prompt tokens found in the prefix cache (forks not counted)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class BlockPool:
    """`num_blocks` KV blocks of `block_size` positions for each of `layers` layers."""

    def __init__(self, layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, prefix_cache: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a block pool needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (num_blocks * block_size, kv_heads, head_dim)  # flat: slot -> (kv_heads, head_dim)
        # torch.empty on a CPU reserves address space; pages are touched only as blocks are used,
        # and the free list hands out the most recently freed blocks first.
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.prefix_cache = prefix_cache
        self.refcount = [0] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: pop() gives block 0 first
        self._hash_of: dict[int, int] = {}  # block -> its chained hash, for registered blocks
        self._by_hash: dict[int, int] = {}  # chained hash -> block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # registered blocks nobody holds, oldest first
        self.stats = PoolStats()

    def available(self) -> int:
        """Blocks an `allocate` can hand out: free ones and cached ones nobody holds."""
        return len(self._free) + len(self._evictable)

    def allocate(self) -> int | None:
        """A block held once by the caller, or None when every block is held."""
        if self._free:
            block = self._free.pop()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            del self._by_hash[self._hash_of.pop(block)]
            self.stats.evictions += 1
        else:
            return None
        self.refcount[block] = 1
        return block

    def hold(self, block: int) -> None:
        """One more holder of `block` (a forked sample, a prefix-cache hit)."""
        if self.refcount[block] == 0:
            self._evictable.pop(block, None)
        self.refcount[block] += 1

    def release(self, blocks: list[int]) -> None:
        """Let go of `blocks`; each one nobody holds any more is freed, or kept evictable when registered."""
        for block in blocks:
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                if block in self._hash_of:
                    self._evictable[block] = None
                else:
                    self._free.append(block)

    def copy_block(self, source: int, target: int, positions: int) -> None:
        """The first `positions` slots of `source` into `target`, every layer (copy on write of a
        group's partial last prompt block)."""
        size = self.block_size
        src, dst = slice(source * size, source * size + positions), slice(target * size, target * size + positions)
        for keys, values in zip(self.keys, self.values):
            keys[dst] = keys[src]
            values[dst] = values[src]

    # ---------------------------------------------------------------- prefix cache

    @staticmethod
    def chain(previous: int, tokens: list[int]) -> int:
        """The hash of a full block of `tokens` after a prefix whose hash is `previous`."""
        return hash((previous, tuple(tokens)))

    def lookup(self, tokens: list[int], root: int, limit: int) -> tuple[list[int], list[int]]:
        """The cached blocks of the longest run of full blocks of `tokens` (at most `limit`
        tokens' worth) found in the cache, each now held once more by the caller, and the chained
        hashes of those blocks."""
        found: list[int] = []
        hashes: list[int] = []
        if not self.prefix_cache:
            return found, hashes
        size, previous = self.block_size, root
        for start in range(0, limit - size + 1, size):
            current = self.chain(previous, tokens[start : start + size])
            block = self._by_hash.get(current)
            if block is None:
                break
            self.hold(block)
            if block in self._evictable:  # touched: the most recently used now
                self._evictable.move_to_end(block)
            found.append(block)
            hashes.append(current)
            previous = current
        return found, hashes

    def register(self, block: int, chained: int) -> None:
        """Record the full `block` under `chained`, unless another block holds that prefix already."""
        if self.prefix_cache and chained not in self._by_hash and block not in self._hash_of:
            self._by_hash[chained] = block
            self._hash_of[block] = chained

    def clear_cache(self) -> None:
        """Forget every registered prefix (new weights: the cached KV is wrong); the blocks nobody
        holds go back to the free list, held ones are freed as usual when let go."""
        for block in self._evictable:
            self._free.append(block)
        self._evictable.clear()
        self._by_hash.clear()
        self._hash_of.clear()

    def gather(self, layer: int, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values at `slots` (...,) of `layer`: (..., kv_heads, head_dim) each."""
        return self.keys[layer][slots], self.values[layer][slots]
