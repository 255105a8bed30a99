"""One trainer rank's view of the others: the model wrapped for DDP or FSDP2, which rows of a batch
are its own, and the collectives the update needs.

Every rank holds the whole batch (rank 0 broadcasts it), so every rank computes every rank's plan
locally and identically: contiguous row ranges balanced by tokens (at prompt-group boundaries, so
the shared-prefix path shares per rank), and the same number of micro-batches on each rank (a rank
with fewer runs zero-weight micro-batches), because FSDP2 gathers each layer's parameters in its
forward and every rank must take part in every gather.

The loss of each rank is normalised by the whole batch's denominator and multiplied by the world
size: DDP and FSDP2 average gradients over the ranks, so the averaged gradient is the gradient of
the whole batch's loss, as in one process.

A rank calls its training module through `call`: the Hugging Face model is the module DDP wraps and
FSDP2 shards as the root, and the trainer's log-prob passes (which run the decoder and the LM head
apart, trainer/logprobs.py) run inside that module's forward (its forward is swapped for the pass
for the call), so DDP prepares its gradient reduction and FSDP2 gathers the root's parameters (the
embeddings, the final norm, the LM head) as they expect, and parameter names stay those of the model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from tidal.config.scale import ParallelConfig

DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}  # None: the parameters' own


@dataclasses.dataclass
class RankContext:
    """This process's rank in the trainer group, and the group's config."""

    rank: int
    world_size: int
    cfg: ParallelConfig
    device: torch.device
    module: torch.nn.Module | None = None  # the wrapped training module, once `wrap` ran

    @property
    def strategy(self) -> str:
        return self.cfg.strategy

    @property
    def sharded(self) -> bool:
        return self.cfg.strategy == "fsdp2"

    # ---------------------------------------------------------------- the model

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` as this strategy trains it: DDP around it, or FSDP2 over each decoder layer and
        the model as the root (in place: its parameters become shards). Returns the module to call."""
        if self.cfg.strategy == "ddp":
            ids = [self.device.index] if self.device.type == "cuda" else None
            # Buffers never change in training (rotary tables); rank 0's reached every rank with its weights.
            sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in _ddp_parameters()
                    else {"broadcast_buffers": False})
            self.module = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=ids, find_unused_parameters=False, **sync
            )
        elif self.cfg.strategy == "fsdp2":
            self.module = _fully_shard(model, self.cfg, self.device, self.world_size)
        else:
            raise ValueError(f"trainer.parallel.strategy {self.cfg.strategy!r} wraps nothing")
        return self.module

    def release(self) -> None:
        """Drop the wrapper before the group is destroyed: a DDP reducer that outlives its process
        group deadlocks in the group's destructor (it joins a thread that needs the GIL)."""
        self.module = None
        gc.collect()

    def inner(self) -> torch.nn.Module:
        """The Hugging Face model (itself under FSDP2, the module DDP wraps)."""
        assert self.module is not None, "wrap() first"
        return self.module.module if isinstance(self.module, torch.nn.parallel.DistributedDataParallel) else self.module

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(model, *args, **kwargs)` run as the training module's forward (module docstring)."""
        inner = self.inner()
        own = inner.forward

        def forward(*a: Any, **k: Any) -> Any:
            # Inside the pass the model computes as itself: a pass that calls the whole model (its
            # full logits, for a model without a separable head: GPT-2, Gemma) must not call the pass.
            with _forward_as(inner, own):
                return _owned(fn(inner, *a, **k))

        with _forward_as(inner, forward):
            assert self.module is not None
            return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def gradient_sync(self, enabled: bool) -> Iterator[None]:
        """Micro-batches before a rank's last accumulate their gradients locally; the last reduces."""
        module = self.module
        if isinstance(module, torch.nn.parallel.DistributedDataParallel) and not enabled:
            with module.no_sync():
                yield
            return
        if self.sharded and module is not None:
            module.set_requires_gradient_sync(enabled)  # type: ignore[operator]
        yield

    # ---------------------------------------------------------------- the batch

    def row_ranges(self, tokens: Sequence[int], boundaries: Sequence[bool] | None = None) -> list[tuple[int, int]]:
        """Every rank's contiguous rows [start, end) of a batch whose rows have `tokens` tokens,
        cut where `boundaries[i]` (row i starts a prompt group) allows, balanced by tokens."""
        return split_rows(tokens, self.world_size, boundaries)

    def my_rows(self, tokens: Sequence[int], boundaries: Sequence[bool] | None = None) -> tuple[int, int]:
        return self.row_ranges(tokens, boundaries)[self.rank]

    def my_chunks(self, parts: Sequence[Any], micro_batch: int) -> list[tuple[Callable[..., Any], slice, float]]:
        """This rank's micro-batches of `parts` (trainer.Part: rows, loss, tokens, starts) as
        (loss, rows, weight): its rows of each part in slices of `micro_batch`, then zero-weight
        ones (row 0) up to the most any rank has of that part, so that every rank runs the same
        passes of the same part in the same order."""
        chunks: list[tuple[Callable[..., Any], slice, float]] = []
        for part in parts:
            tokens = part.tokens if part.tokens is not None else [1] * part.rows
            ranges = self.row_ranges(tokens, part.starts)
            most = max(-(-(end - start) // micro_batch) for start, end in ranges)
            start, end = ranges[self.rank]
            own = [(part.loss, slice(s, min(s + micro_batch, end)), 1.0) for s in range(start, end, micro_batch)]
            chunks += own + [(part.loss, slice(0, 1), 0.0)] * (most - len(own))
        return chunks

    # ---------------------------------------------------------------- collectives

    def sum_(self, values: Tensor) -> Tensor:
        """All-reduce SUM in place (on the group's device), returned."""
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def sum_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The sum over ranks of every rank's `metrics` (the same keys on every rank)."""
        keys = sorted(metrics)
        values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=self._comm_device())
        self.sum_(values)
        return dict(zip(keys, values.tolist()))

    def all_true(self, flag: bool) -> bool:
        value = torch.tensor([0.0 if flag else 1.0], dtype=torch.float64, device=self._comm_device())
        return float(self.sum_(value)) == 0.0

    def broadcast_object(self, value: Any = None) -> Any:
        """Rank 0's `value` on every rank."""
        holder = [value]
        dist.broadcast_object_list(holder, src=0, device=self._comm_device() if dist.get_backend() == "nccl" else None)
        return holder[0]

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")


def full_norm(norm: Tensor) -> float:
    """A gradient norm as a float (FSDP2's is a DTensor: its full value, the same on every rank)."""
    full = getattr(norm, "full_tensor", None)
    return float(full() if full is not None else norm)


def split_rows(tokens: Sequence[int], parts: int, boundaries: Sequence[bool] | None = None) -> list[tuple[int, int]]:
    """`parts` contiguous ranges [start, end) covering rows 0..len(tokens), cut only before a row
    whose `boundaries` entry is true (anywhere when None), each cut where the running token count
    is nearest its share of the total. A range may be empty (fewer groups than parts)."""
    count = len(tokens)
    allowed = [0, *(i for i in range(1, count) if boundaries is None or boundaries[i]), count]
    prefix = [0]
    for n in tokens:
        prefix.append(prefix[-1] + int(n))
    cuts, last = [], 0
    for part in range(1, parts):
        target = prefix[-1] * part / parts
        last = min((c for c in allowed if c >= last), key=lambda c: (abs(prefix[c] - target), c))
        cuts.append(last)
    edges = [0, *cuts, count]
    return [(edges[i], edges[i + 1]) for i in range(parts)]


@contextlib.contextmanager
def _forward_as(module: torch.nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """`module.forward` is `forward` inside (an instance attribute over the class's method)."""
    had = "forward" in module.__dict__
    previous = module.__dict__.get("forward")
    module.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        if had:
            module.forward = previous  # type: ignore[method-assign]
        else:
            del module.forward


def _ddp_parameters() -> set[str]:
    import inspect

    return set(inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters)


def _owned(result: Any) -> Any:
    """Tensors of a forward's result that are views, copied: FSDP2 hooks its backward onto the
    outputs, and an in-place op on a view would drop that hook."""
    if isinstance(result, Tensor):
        return result.clone() if result._is_view() else result
    if isinstance(result, tuple):
        return tuple(_owned(item) for item in result)
    return result


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (the units FSDP2 shards one by one)."""
    for path in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        module: Any = model
        for name in path.split("."):
            module = getattr(module, name, None)
            if module is None:
                break
        if isinstance(module, torch.nn.ModuleList) and len(module):
            return list(module)
    return []


def _fully_shard(model: torch.nn.Module, cfg: ParallelConfig, device: torch.device, world: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    mesh = init_device_mesh(device.type, (world,))
    options: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": cfg.reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(param_dtype=DTYPES[cfg.param_dtype], reduce_dtype=DTYPES[cfg.reduce_dtype]),
        "offload_policy": CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy(),
    }
    for layer in decoder_layers(model):
        fully_shard(layer, **options)
    fully_shard(model, **options)
    return model


def rank_device(base: torch.device, rank: int) -> torch.device:
    """Rank `rank`'s device: cuda:<rank> on CUDA, else the CPU."""
    return torch.device("cuda", rank) if base.type == "cuda" else torch.device("cpu")


def broadcast_weights(model: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank (before wrapping; tied ones once)."""
    seen: set[int] = set()
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                dist.broadcast(tensor.data, src=0)
