"""Weight publication: the trainer publishes versioned, checksummed weights with a canary; a
rollout worker verifies what it loaded before it generates with it.

A `Publication` is a CPU snapshot of the trainer's `state_dict` at one version, with
- `checksum`: SHA-256 over every tensor in name order (name, dtype, shape, raw bytes): it catches
  a tensor changed, dropped or reshaped on the way (a bad copy, a torn transfer, mixed versions);
- `canary`: the logprobs of a fixed prompt + completion (`canary_ids`) under the new weights. The
  worker recomputes them with its own model after loading, so equal bytes in a model that
  computes something else (tied weights not tied, a stale buffer, a wrong dtype or kernel) fail
  too, beyond `pipeline.canary_tolerance`.
A weight that fails either check is refused with `WeightVerificationError` (version, what
differed, by how much). Waiting for a version that never comes raises `WeightTimeoutError`
after `pipeline.weight_timeout_s` instead of hanging.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from tidal.errors import WeightTimeoutError, WeightVerificationError
from tidal.rollout.checksum import state_checksum
from tidal.rollout.protocol import UNLOADED, LoadsWeights, RolloutEngine
from tidal.trainer.logprobs import token_logprobs
from tidal.trainer.lora import adapter_state_dict, has_adapter, merged_state_dict

__all__ = [  # state_checksum and UNLOADED live in rollout/ (the server verifies with them too)
    "CANARY_TEXT", "UNLOADED", "Publication", "WeightChannel", "canary_ids", "canary_logprobs", "check_canary",
    "load_verified", "publish", "state_checksum", "weight_target",
]

# A fixed canary: plain words every tokenizer splits into several tokens. Its logprobs depend on
# every layer, so a weight that did not arrive shows in them.
CANARY_TEXT = "Canary check: the quick brown fox jumps over the lazy dog, 12 + 35 = 47."


def canary_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The canary's token ids under `tokenizer` (at least two: the first token has no logprob)."""
    ids = list(tokenizer(CANARY_TEXT, add_special_tokens=False)["input_ids"])
    if len(ids) < 2:
        raise ValueError(f"the canary text tokenizes to {len(ids)} token(s); it needs at least 2")
    return ids


def canary_logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 under `model`, in eval mode (no dropout), fp32 on the CPU."""
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            logprobs, _ = token_logprobs(model, input_ids, torch.ones_like(input_ids))  # (1, T)
    finally:
        model.train(was_training)
    return logprobs[0, 1:].float().cpu()  # (T-1,)


@dataclass
class Publication:
    """One published weight version. `state` holds CPU tensors; `canary` (T-1,) is what the
    trainer's model gave for `canary_ids`. `header()` is the same without the tensors (what a
    remote worker is sent with each call; the tensors travel once, by reference)."""

    version: int
    checksum: str
    canary_ids: list[int]
    canary: list[float]
    state: dict[str, torch.Tensor] | None = None

    def header(self) -> Publication:
        return dataclasses.replace(self, state=None)


def publish(model: torch.nn.Module, version: int, ids: list[int], adapter_only: bool = False) -> Publication:
    """Snapshot `model`'s weights as `version` (a CPU copy: the trainer keeps updating its own),
    with their checksum and the canary's logprobs under them.

    A LoRA-adapted model (trainer/lora.py) publishes its merged weights in the plain model's
    layout (for a worker holding `lora.plain_copy`), or with `adapter_only` its adapter's tensors
    alone (for a worker holding the same adapter layers on the same base). Either way the canary
    is the adapted model's: a worker that did not get the adapter's update fails it."""
    if has_adapter(model):
        source = adapter_state_dict(model) if adapter_only else merged_state_dict(model)
    elif adapter_only:
        raise ValueError("publish(adapter_only=True): the model has no LoRA adapter (trainer.lora.enabled is false?)")
    else:
        source = model.state_dict()
    state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in source.items()}
    return Publication(version, state_checksum(state), list(ids), canary_logprobs(model, ids).tolist(), state)


class EmbeddedWeights:
    """`LoadsWeights` for an embedded engine (rollout/engine.py): loads through its
    `load_verified`, says which tensors differ on a mismatch, and reads its model's canary."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def load_weights(self, state: dict[str, torch.Tensor], version: int, checksum: str) -> None:
        engine = self.engine
        loaded = engine.load_verified(state, version, checksum)
        if loaded != checksum:
            own = engine.model.state_dict()
            differing = [
                name for name, tensor in state.items() if state_checksum({name: own[name]}) != state_checksum({name: tensor})
            ]
            where = f"tensor(s) differing from the sent ones: {differing[:3]}" if differing else (
                "the sent tensors themselves do not match the published checksum (changed after publication)"
            )
            raise WeightVerificationError(
                f"weight version {version}: checksum mismatch (loaded {loaded[:12]}, published "
                f"{checksum[:12]}); {where}. Refusing to generate with these weights"
            )

    def sequence_logprobs(self, ids: list[int]) -> list[float]:
        return canary_logprobs(self.engine.model, ids).tolist()


def weight_target(engine: RolloutEngine) -> LoadsWeights:
    """How publications reach `engine`: itself when it implements `LoadsWeights` (the HTTP
    engine), else through its model in this process (`EmbeddedWeights`)."""
    return engine if isinstance(engine, LoadsWeights) else EmbeddedWeights(engine)


def load_verified(engine: RolloutEngine, publication: Publication, tolerance: float) -> None:
    """Load `publication` into `engine`, then check what the engine now holds: the checksum of its
    tensors (checked where they were loaded: in this process, or by the server of an HTTP engine)
    and the canary's logprobs under its model. On a mismatch the engine is left marked `UNLOADED`
    (it must not generate) and `WeightVerificationError` says what differed."""
    if publication.state is None:
        raise ValueError(f"weight version {publication.version}: a header without tensors cannot be loaded")
    engine.weight_version = UNLOADED  # until verified
    weight_target(engine).load_weights(publication.state, publication.version, publication.checksum)
    engine.weight_version = UNLOADED  # the checksum is right; the canary decides
    check_canary(engine, publication, tolerance)
    engine.weight_version = publication.version


def check_canary(engine: RolloutEngine, publication: Publication, tolerance: float) -> None:
    """Raise `WeightVerificationError` unless `engine`'s model gives the canary logprobs that
    `publication` (a header is enough) carries, within `tolerance`. After a load it verifies the
    load; later, a health check that the weights in memory are still the ones verified. For an
    HTTP engine the logprobs are the server's (its prompt logprobs of the canary)."""
    got = torch.tensor(weight_target(engine).sequence_logprobs(publication.canary_ids), dtype=torch.float32)
    expected = torch.tensor(publication.canary, dtype=torch.float32)
    difference = float((got - expected).abs().max()) if got.shape == expected.shape else float("inf")
    if not difference <= tolerance:  # also catches NaN
        raise WeightVerificationError(
            f"weight version {publication.version}: canary logprobs differ from the trainer's by up to "
            f"{difference:.3g} (pipeline.canary_tolerance={tolerance:g}); the loaded model does not "
            "compute what the trainer's does. Refusing to generate with these weights"
        )


def publish_to_engine(engine: RolloutEngine, model: torch.nn.Module, version: int, tolerance: float) -> Publication:
    """Publish `model`'s weights as `version` straight into `engine` (one that holds its own copy,
    e.g. an HTTP server) and verify them there: the loop's publication when it has no weight
    channel (`pipeline.mode: sync`). A LoRA model publishes its merged weights (the server holds a
    plain model). Returns the publication's header."""
    publication = publish(model, version, canary_ids(engine.tokenizer))
    load_verified(engine, publication, tolerance)
    return publication.header()


class WeightChannel:
    """The newest publication, handed from the trainer to the sampler.

    `publish` (trainer) replaces it and returns at once; the sampler reads `latest()` and waits
    with `wait_for` until a version recent enough is there. Versions superseded before the sampler
    looked are never loaded, which is fine: only the newest matters.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._latest: Publication | None = None

    def publish(self, publication: Publication) -> None:
        with self._changed:
            self._latest = publication
            self._changed.notify_all()

    def latest(self) -> Publication | None:
        with self._changed:
            return self._latest

    def wait(self, timeout: float) -> None:
        """Block until something is published or `timeout` seconds pass."""
        with self._changed:
            self._changed.wait(timeout)

    def wait_for(self, version: int, timeout_s: float, stop: threading.Event, poll_s: float = 0.2) -> Publication | None:
        """The newest publication once its version is `version` or newer; None if `stop` is set
        first. Raises `WeightTimeoutError` after `timeout_s` seconds without one."""
        deadline = time.monotonic() + timeout_s
        while not stop.is_set():
            latest = self.latest()
            if latest is not None and latest.version >= version:
                return latest
            left = deadline - time.monotonic()
            if left <= 0:
                newest = "nothing" if latest is None else f"version {latest.version}"
                raise WeightTimeoutError(
                    f"waited {timeout_s:g} s for weight version {version} or newer; {newest} was published. "
                    "Is the trainer alive? If it is just slow, raise pipeline.weight_timeout_s"
                )
            self.wait(min(poll_s, left))
        return None
