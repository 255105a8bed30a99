"""Publishing a LoRA policy to rollout (pipeline/weights.py, trainer/lora.py): merged weights or the
adapter alone reach a worker that then *samples* from the updated adapter, and a publication that
was skipped, stale, or built without the adapter is caught by the canary."""

from __future__ import annotations

import copy

import pytest
import torch

from tidal.config.scale import LoraConfig
from tidal.config.schema import ModelConfig, TinyModelConfig
from tidal.models import LoadedModel, load_model
from tidal.pipeline import weights
from tidal.pipeline.weights import (
    UNLOADED,
    WeightVerificationError,
    canary_ids,
    canary_logprobs,
    check_canary,
    load_verified,
    publish,
)
from tidal.rollout.engine import EmbeddedEngine, SamplingParams
from tidal.rollout.paged import PagedDecoder
from tidal.trainer import lora
from tidal.trainer.logprobs import token_logprobs

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
TOLERANCE = 1e-4


@pytest.fixture
def adapted() -> LoadedModel:
    """The tiny model with a LoRA adapter (B = 0: it computes the base model until trained)."""
    loaded = load_model(ModelConfig(path="tiny", tiny=TINY, device="cpu", seed=0))
    lora.apply_lora(loaded.model, LoraConfig(enabled=True, r=4, alpha=16.0), seed=0)
    return loaded


def _update_adapter(model: torch.nn.Module, seed: int) -> None:
    """What an optimizer step does to the adapter: every adapter tensor moves."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in lora.adapter_state_dict(model).values():
            tensor.add_(0.3 * torch.randn(tensor.shape, generator=generator))


def _worker(loaded: LoadedModel, mode: str) -> EmbeddedEngine:
    engine = EmbeddedEngine(lora.rollout_copy(loaded.model, mode).eval().requires_grad_(False), loaded.tokenizer, "cpu")
    engine.weight_version = UNLOADED
    return engine


def _sampled_logprobs(engine: EmbeddedEngine, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """A completion the engine samples, and the sampler's logprobs of its tokens."""
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7, ignore_eos=True)
    completion = engine.generate([prompt], n=1, params=params)[0][0]
    return completion.token_ids, torch.tensor(completion.logprobs)


def _scored(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """`model`'s logprobs of `tokens` after `prompt` (the trainer's computation)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        values, _ = token_logprobs(model, ids, torch.ones_like(ids))
    return values[0, len(prompt):]


@pytest.mark.parametrize("mode", ["merged", "adapter"])
def test_rollout_samples_from_the_published_adapter(adapted: LoadedModel, mode: str) -> None:
    model, tokenizer = adapted.model, adapted.tokenizer
    ids = canary_ids(tokenizer)
    worker = _worker(adapted, mode)
    load_verified(worker, publish(model, 0, ids, adapter_only=mode == "adapter"), TOLERANCE)
    _update_adapter(model, seed=1)
    publication = publish(model, 1, ids, adapter_only=mode == "adapter")
    assert publication.state is not None
    if mode == "merged":  # the plain model's layout, nothing of the adapter's
        assert not any("lora_" in name or "base_layer" in name for name in publication.state)
        assert not lora.has_adapter(worker.model) and PagedDecoder.supports(worker.model, plain_projections=True)
    else:  # the adapter's tensors alone, every one of them
        assert set(publication.state) == set(lora.adapter_state_dict(model))
    load_verified(worker, publication, TOLERANCE)
    assert worker.weight_version == 1

    with lora.adapter_disabled(model):
        base_canary = canary_logprobs(model, ids)
    assert (canary_logprobs(worker.model, ids) - torch.tensor(publication.canary)).abs().max() <= TOLERANCE
    assert (base_canary - torch.tensor(publication.canary)).abs().max() > 1e-2  # the update shows in the canary

    # What the worker samples comes from the updated adapter: the sampler's logprobs of its own
    # tokens are the trainer's (adapted) logprobs of them, not the base model's.
    prompt = ids[:6]
    tokens, sampled = _sampled_logprobs(worker, prompt)
    assert torch.allclose(sampled, _scored(model, prompt, tokens), atol=1e-4)
    with lora.adapter_disabled(model):
        assert (sampled - _scored(model, prompt, tokens)).abs().max() > 1e-2


@pytest.mark.parametrize("mode", ["merged", "adapter"])
def test_a_skipped_publication_is_caught(adapted: LoadedModel, mode: str) -> None:
    """The worker still holds version 0 when the trainer's version 1 is checked against it."""
    model, ids = adapted.model, canary_ids(adapted.tokenizer)
    worker = _worker(adapted, mode)
    load_verified(worker, publish(model, 0, ids, adapter_only=mode == "adapter"), TOLERANCE)
    _update_adapter(model, seed=2)
    current = publish(model, 1, ids, adapter_only=mode == "adapter")
    with pytest.raises(WeightVerificationError, match="weight version 1: canary logprobs differ"):
        check_canary(worker, current.header(), TOLERANCE)


def test_a_stale_adapter_is_refused(adapted: LoadedModel) -> None:
    """The adapter's tensors of version 0 sent as version 1: checksummed, but not what the trainer computes."""
    model, ids = adapted.model, canary_ids(adapted.tokenizer)
    worker = _worker(adapted, "adapter")
    stale = publish(model, 0, ids, adapter_only=True)
    _update_adapter(model, seed=3)
    current = publish(model, 1, ids, adapter_only=True)
    sent = copy.copy(current)
    sent.state, sent.checksum = stale.state, stale.checksum
    with pytest.raises(WeightVerificationError, match="weight version 1: canary"):
        load_verified(worker, sent, TOLERANCE)
    assert worker.weight_version == UNLOADED


def test_merged_weights_without_the_adapter_are_refused(adapted: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The peers' bug: the base weights published as if merged, the adapter never synced."""
    model, ids = adapted.model, canary_ids(adapted.tokenizer)
    worker = _worker(adapted, "merged")
    _update_adapter(model, seed=4)

    def base_only(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        with lora.adapter_disabled(model):
            return lora.merged_state_dict(model)

    monkeypatch.setattr(weights, "merged_state_dict", base_only)
    with pytest.raises(WeightVerificationError, match="canary logprobs differ"):
        load_verified(worker, publish(model, 1, ids), TOLERANCE)


def test_an_engine_built_before_the_adapter_samples_from_it() -> None:
    """The engine's forward reads plain projections' weights directly: it must not serve an adapted
    model as the base one, not even one whose adapter was injected after the engine was built."""
    loaded = load_model(ModelConfig(path="tiny", tiny=TINY, device="cpu", seed=0))
    engine = EmbeddedEngine(loaded.model, loaded.tokenizer, "cpu")
    assert engine._forward_pass.current()
    lora.apply_lora(loaded.model, LoraConfig(enabled=True, r=4, alpha=16.0), seed=0)
    assert not PagedDecoder.supports(loaded.model, plain_projections=True) and not engine._forward_pass.current()
    _update_adapter(loaded.model, seed=5)
    prompt = canary_ids(loaded.tokenizer)[:6]
    tokens, sampled = _sampled_logprobs(engine, prompt)
    assert torch.allclose(sampled, _scored(loaded.model, prompt, tokens), atol=1e-4)
    with pytest.raises(ValueError, match="adapter_only"):
        publish(load_model(ModelConfig(path="tiny", tiny=TINY, device="cpu", seed=0)).model, 0, prompt, adapter_only=True)
