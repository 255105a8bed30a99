"""The protocols rollout engines implement, so that the loop, the agent runner and the held-out
evaluation drive any of them the same way: the embedded engine (rollout/engine.py) and the HTTP
engine (rollout/http_engine.py, an external OpenAI-compatible server such as `tidal serve` or vLLM).

- `RolloutEngine`: what every engine does: sample completions of token-id prompts, tagged with the
  weight version that made them.
- `LoadsWeights`: what an engine holding its own copy of the policy adds, so that a weight
  publication (pipeline/weights.py) can be loaded and verified through it: load a state under a
  version and check its checksum, and score a token sequence (the canary) under the weights it
  holds. The HTTP engine implements it over the server's reload endpoint; the embedded engine's
  side lives in pipeline/weights.py (`weight_target`) until engine.py implements it itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

    from tidal.rollout.sampling import Cancel, SamplingParams
    from tidal.types import Completion

UNLOADED = -1  # the weight version of an engine that holds no verified publication


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples completions for token-id prompts and tags each with the weight version that made it."""

    weight_version: int
    tokenizer: Any  # renders the prompts it is given (a Hugging Face tokenizer)
    eos_ids: list[int]  # the token ids that end a completion (a completion ending in one ended by itself)

    def generate(
        self, prompts: list[list[int]], n: int, params: SamplingParams, cancel: Cancel | None = None
    ) -> list[list[Completion]]:
        """`n` completions per prompt: the outer list follows `prompts`. Once `cancel` is set,
        generation stops at its next decode step and `PreemptedError` is raised."""
        ...

    def update_weights(self, state_dict: dict[str, Tensor] | None, version: int) -> None:
        """Make `version` current with these weights: `state_dict` holds all or some of the model's
        tensors, by their names in `model.state_dict()`; None means the engine samples from the
        trainer's own model object, which already holds them (an engine with a copy of its own
        raises TypeError). Names the model lacks or shapes it does not have are refused before
        `version` becomes current (ValueError in process; the server's answer as an error over HTTP).
        Nothing sampled after the call uses the old weights' KV (the prefix cache is emptied);
        completions already running keep the version they started with. The one implementation per
        engine: `EmbeddedEngine.update_weights` copies into its model, `HttpEngine.update_weights`
        sends to its server (checksummed, `load_weights`)."""
        ...


@runtime_checkable
class LoadsWeights(Protocol):
    """An engine that holds its own copy of the policy and verifies what it loaded."""

    def load_weights(self, state: dict[str, Tensor], version: int, checksum: str) -> None:
        """Load `state` (all or some of the model's tensors) and make `version` current once what
        was loaded hashes to `checksum` (`rollout.checksum.state_checksum` over the loaded names).
        On a mismatch raise `WeightVerificationError` (what differed), holding no verified version."""
        ...

    def sequence_logprobs(self, ids: list[int]) -> list[float]:
        """log p(ids[t] | ids[:t]) for t >= 1, at temperature 1, under the weights it holds now:
        (len(ids) - 1,) values, what the trainer's canary check compares."""
        ...


@runtime_checkable
class ReportsMetrics(Protocol):
    """An engine with counters of its own for the run's metrics rows: the embedded engine's prefix
    cache, preemptions and speculative acceptance, the HTTP engine's requests."""

    def run_metrics(self) -> dict[str, float]: ...
