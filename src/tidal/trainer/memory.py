"""How many sequences a micro-batch holds (`trainer.micro_batch_size: auto`).

The estimate, in bytes, for a batch whose rows are `length` tokens long:

    budget    = SAFETY * free - state - head
    per_token = layers * (ACT_HIDDEN * hidden + ACT_MLP * intermediate) * width
                  (with gradient checkpointing: layers * hidden * 4 for the layer inputs, plus
                  CHECKPOINT_RETAINED of the layers' activations)
                + layers * heads * length * 4 (attention weights, unless the model uses SDPA)
    rows      = budget // (length * per_token), at least 1, at most the batch's rows

- free: memory available when the trainer is built, before its gradients and optimizer state
  exist: torch.cuda.mem_get_info on CUDA; on a CPU the least of /proc/meminfo's MemAvailable and
  the cgroup's limit minus its usage (v2 or v1), psutil where there is no /proc.
- state: what the trainer allocates later: a gradient and AdamW's two moments, STATE_BYTES per
  trainable parameter (twice for gae's value model, a copy of the backbone).
- width: the bytes of a kept activation: 4 in fp32, BF16_WIDTH under bf16 autocast (the
  matmuls' inputs and outputs are bf16, the norms and the residual stream stay fp32).
- The estimate is of the resident set, which is what a memory kill looks at, not of the live
  tensors. Under gradient checkpointing the tensors kept for the backward are the layer inputs
  and one replayed layer (113 KB a token on SmolLM2-135M, against 1.46 MB without), but the
  resident set falls only to about half (CHECKPOINT_RETAINED): glibc keeps the replayed layers'
  freed activations in its heap, among the gradients allocated meanwhile. With
  MALLOC_MMAP_THRESHOLD_=1048576, which hands such blocks back at once, it follows the tensors
  (bench/RESULTS.md, "Real-model update on CPU", the -mmap row). BF16_WIDTH is fitted to the
  resident set the same way.
- head: the log-prob head's working set, HEAD_COPIES fp32 (tokens, vocab) tensors (logits,
  softmax, gradient, scaled copy): of one chunk on the chunked path (trainer/logprobs.py), of the
  whole micro-batch (added to per_token) when the full logits are computed.
ACT_HIDDEN and ACT_MLP count the tensors of those widths a Llama/Qwen2 decoder layer keeps for
its backward (norm inputs and outputs, q/k/v/o, GQA's repeated k/v, the MLP's gate, up, SiLU and
product); bench/update_cpu.py prints this estimate against the peak memory it measures.
SAFETY leaves room for the allocator's slack, the frozen passes and the other processes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

import torch

ACT_HIDDEN = 12
ACT_MLP = 4
BF16_WIDTH = 3.0
CHECKPOINT_RETAINED = 0.5
STATE_BYTES = 12
HEAD_COPIES = 4
SAFETY = 0.7
GIB = 1 << 30


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_headroom() -> int | None:
    """The cgroup's memory limit minus its usage (v2, else v1), or None when it sets no limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit_text, usage = Path(limit_file).read_text().strip(), int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or int(limit_text) >= 1 << 60:  # v1 writes "no limit" as ~2**63
            return None
        return max(int(limit_text) - usage, 0)
    return None


def available_memory(device: torch.device) -> int:
    """Bytes the trainer may still allocate on `device` (module docstring: free)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    candidates = [value for value in (_meminfo_available(), _cgroup_headroom()) if value is not None]
    if not candidates:
        import psutil  # only where there is no /proc (macOS)

        candidates.append(int(psutil.virtual_memory().available))
    return min(candidates)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """The fixed parts of the estimate (module docstring), measured once; `rows` per batch."""

    free: int  # bytes available when the trainer was built
    state: int  # gradients and AdamW moments still to come
    head: int  # the chunked head's working set (0 when the full logits are computed)
    per_token: int  # bytes kept per token for the backward, without the attention weights
    attention_per_token_per_position: int  # layers * heads * 4 when attention weights are kept, else 0
    full_logits_per_token: int  # HEAD_COPIES * vocab * 4 when the full logits are computed, else 0

    @property
    def budget(self) -> int:
        return int(SAFETY * self.free) - self.state - self.head

    def token_bytes(self, length: int) -> int:
        """Bytes kept per token of a micro-batch of rows `length` tokens long."""
        return self.per_token + self.attention_per_token_per_position * length + self.full_logits_per_token

    def rows(self, length: int, batch_rows: int) -> int:
        """Sequences of `length` tokens per micro-batch: at least 1, at most `batch_rows`, and
        spread evenly over the fewest micro-batches that fit (64 rows with room for 55: 2 x 32)."""
        batch_rows = max(batch_rows, 1)
        fit = int(min(max(self.budget // max(length * self.token_bytes(length), 1), 1), batch_rows))
        micro_batches = -(-batch_rows // fit)
        return -(-batch_rows // micro_batches)

    def record(self, length: int, batch_rows: int) -> dict[str, Any]:
        """The estimate for one batch, for the log."""
        return {"micro_batch_size": self.rows(length, batch_rows), "length": length,
                "free_gib": round(self.free / GIB, 2), "budget_gib": round(self.budget / GIB, 2),
                "mib_per_sequence": round(length * self.token_bytes(length) / (1 << 20), 1)}


class Dims(NamedTuple):
    """The shapes the estimate reads from a model's config."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    vocab: int


def model_dims(model: torch.nn.Module) -> Dims:
    """The `Dims` of `model`'s config, with stand-ins for a model whose config lacks one (4x
    hidden for the MLP, hidden / 64 heads). Works on a model built on the meta device."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = getattr(text, "hidden_size", None) or model.get_input_embeddings().embedding_dim  # type: ignore[operator]
    layers = getattr(text, "num_hidden_layers", None) or 1
    intermediate = getattr(text, "intermediate_size", None) or 4 * hidden
    heads = getattr(text, "num_attention_heads", None) or max(hidden // 64, 1)
    vocab = getattr(text, "vocab_size", None) or model.get_input_embeddings().num_embeddings  # type: ignore[operator]
    return Dims(int(layers), int(hidden), int(intermediate), int(heads), int(vocab))


def estimate_memory(
    dims: Dims,
    trainable: int,
    free: int,
    autocast_dtype: torch.dtype | None,
    gradient_checkpointing: bool,
    chunk_tokens: int,
    chunked: bool,
    value_model: bool = False,
    attention: str = "sdpa",
) -> MemoryPlan:
    """The estimate (module docstring) for a model of `dims` with `trainable` parameters and
    `free` bytes available; `attention` is the config's `_attn_implementation` (eager keeps the
    attention weights). `tidal.trainer.plan` sizes a whole run from the same numbers."""
    layers, hidden, intermediate, heads, vocab = dims
    width = 4.0 if autocast_dtype is None else BF16_WIDTH
    layer = (ACT_HIDDEN * hidden + ACT_MLP * intermediate) * width
    per_token = layers * (hidden * 4 + CHECKPOINT_RETAINED * layer) if gradient_checkpointing else layers * layer
    chunked = chunked and chunk_tokens > 0
    return MemoryPlan(
        free=free,
        state=STATE_BYTES * trainable * (2 if value_model else 1),
        head=HEAD_COPIES * chunk_tokens * vocab * 4 if chunked else 0,
        per_token=int(per_token),
        attention_per_token_per_position=(layers if not gradient_checkpointing else 1) * heads * 4
        if attention == "eager" else 0,
        full_logits_per_token=0 if chunked else HEAD_COPIES * vocab * 4,
    )


def plan_memory(
    model: torch.nn.Module,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    gradient_checkpointing: bool,
    chunk_tokens: int,
    chunked: bool,
    value_model: bool = False,
) -> MemoryPlan:
    """The estimate for `model` on `device` (module docstring); `chunked`: the model takes the
    chunked log-prob path (`tidal.trainer.logprobs.split_model`) and `chunk_tokens` > 0."""
    attention = getattr(getattr(model, "config", None), "_attn_implementation", "sdpa")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return estimate_memory(model_dims(model), trainable, available_memory(device), autocast_dtype,
                           gradient_checkpointing, chunk_tokens, chunked, value_model, str(attention))
