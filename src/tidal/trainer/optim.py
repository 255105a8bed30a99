"""The optimizer the trainer and the value model use."""

from __future__ import annotations

from typing import Any

import torch


def adamw(params: list[torch.nn.Parameter], **options: Any) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel where the parameters allow it (floating point, on a CPU or
    CUDA device): one pass over all tensors instead of a dozen ops per tensor, whose per-op cost
    is most of a small model's optimizer step on a CPU; the same update up to float rounding.
    Otherwise the default."""
    devices = {p.device.type for p in params}
    if params and devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in params):
        try:
            return torch.optim.AdamW(params, fused=True, **options)
        except (RuntimeError, ValueError):  # a dtype or device this torch build has no fused kernel for
            pass
    return torch.optim.AdamW(params, **options)
