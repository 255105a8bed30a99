"""The protocol every rollout engine implements: the embedded engine, an HTTP client, vLLM."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

    from tidal.rollout.engine import Cancel, SamplingParams
    from tidal.types import Completion


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples completions for token-id prompts and tags each with the weight version that made it."""

    weight_version: int
    tokenizer: Any  # renders the prompts it is given (a Hugging Face tokenizer)

    def generate(
        self, prompts: list[list[int]], n: int, params: SamplingParams, cancel: Cancel | None = None
    ) -> list[list[Completion]]:
        """`n` completions per prompt: the outer list follows `prompts`. Once `cancel` is set,
        generation stops at its next decode step and `PreemptedError` is raised."""
        ...

    def update_weights(self, state_dict: dict[str, Tensor] | None, version: int) -> None:
        """Load new policy weights (None: already shared with the trainer) and set the version."""
        ...
