"""Weight-space merging against forgetting: the policy a run evaluates and exports is
`anchor + weight * (trained - anchor)`, the anchor being the weights RL started from.

This is WiSE-FT (Wortsman et al., 2022, "Robust fine-tuning of zero-shot models") applied to RL
post-training: interpolating the fine-tuned weights back toward the starting point keeps much of
what fine-tuning gained on its own tasks and gives back much of what it cost elsewhere, because
the two do not move linearly along the line between the weights. Measured on the quickstart
(docs/experiments/quickstart_rl.md): halfway back kept most of RL's held-out reasoning gain and
gave back most of the knowledge it had erased.

Training itself is unchanged: the optimizer keeps stepping the trained weights, checkpoints hold
them (so a run resumes exactly), and only evaluation and the exported policy see the merge.
`Merge.view(model)` swaps the merged weights in for a block and restores the trained ones after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from tidal.errors import CheckpointError


class Merge:
    """The anchor (a copy of the starting weights) and the share of the update to keep."""

    def __init__(self, model: torch.nn.Module, weight: float) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"merge weight {weight}: must be in (0, 1]")
        self.weight = weight
        # Floating-point tensors only: integer buffers (positions, masks) are not interpolated.
        self.anchor = {
            name: tensor.detach().clone()
            for name, tensor in model.state_dict().items() if tensor.is_floating_point()
        }

    @property
    def active(self) -> bool:
        return self.weight < 1

    def merged_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The merged weights for `model`'s current (trained) weights; integer buffers as they are."""
        state = model.state_dict()
        missing = sorted(set(self.anchor) - set(state))
        if missing:
            raise CheckpointError(f"merge: the model lacks anchor weights {missing[:5]} (a different architecture?)")
        merged: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            anchor = self.anchor.get(name)
            if anchor is None:
                merged[name] = tensor
                continue
            if anchor.shape != tensor.shape:
                raise CheckpointError(f"merge: {name} has shape {tuple(tensor.shape)}, the anchor {tuple(anchor.shape)}")
            # Computed in float32 so a bf16 model does not lose the small update to rounding.
            mixed = anchor.float() + self.weight * (tensor.detach().float() - anchor.float())
            merged[name] = mixed.to(tensor.dtype)
        return merged

    @contextlib.contextmanager
    def view(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """Within the block `model` holds the merged weights; the trained ones are back after it."""
        if not self.active:
            yield model
            return
        trained = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        with torch.no_grad():
            model.load_state_dict(self.merged_state(model))
        try:
            yield model
        finally:
            with torch.no_grad():
                model.load_state_dict(trained)
