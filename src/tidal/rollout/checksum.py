"""The checksum a weight publication carries and every engine verifies after loading it: the
trainer (pipeline/weights.py), the embedded engine's loader and `tidal serve`'s reload endpoint
(serve/weights.py) all hash with this one function, so their answers are comparable."""

from __future__ import annotations

import hashlib

import torch


def state_checksum(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 (hex) over the tensors of `state` in name order: each name, dtype, shape and the
    tensor's bytes. Two states have the same checksum only if they hold the same bytes."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        flat = tensor.contiguous().reshape(-1)
        if flat.numel():
            digest.update(flat.cpu().view(torch.uint8).numpy())  # hashed in place, not copied to bytes
    return digest.hexdigest()
