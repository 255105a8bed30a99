"""Weight publication: a rollout engine loads a published version only when its checksum and the
canary's logprobs match what the trainer published; waiting for weights times out."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

from tidal.config.schema import ModelConfig, TinyModelConfig
from tidal.models import LoadedModel, load_model
from tidal.pipeline.quickstart import find_config
from tidal.pipeline.weights import (
    UNLOADED,
    WeightChannel,
    WeightTimeoutError,
    WeightVerificationError,
    canary_ids,
    canary_logprobs,
    load_verified,
    publish,
    state_checksum,
)
from tidal.rollout.engine import EmbeddedEngine

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)


@pytest.fixture
def trainer_model() -> LoadedModel:
    """The tiny model with its blocks scaled up: at the default init attention is nearly uniform,
    and nothing that changes only where tokens attend would show in its logprobs."""
    loaded = load_model(ModelConfig(path="tiny", tiny=TINY, device="cpu", seed=0))
    with torch.no_grad():
        for name, parameter in loaded.model.named_parameters():
            if name.startswith("model.layers.") and parameter.dim() == 2:
                parameter.mul_(8.0)
    return loaded


def _rollout_engine(loaded: LoadedModel) -> EmbeddedEngine:
    """A rollout engine on a copy of `loaded`'s model holding *other* weights, so that only a real
    load makes it match."""
    model = copy.deepcopy(loaded.model).eval().requires_grad_(False)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05)
    engine = EmbeddedEngine(model, loaded.tokenizer, "cpu")
    engine.weight_version = UNLOADED
    return engine


def test_checksum_is_stable_and_sees_one_changed_value(trainer_model: LoadedModel) -> None:
    state = {name: tensor.clone() for name, tensor in trainer_model.model.state_dict().items()}
    assert state_checksum(state) == state_checksum(dict(reversed(list(state.items()))))  # order of the dict
    name = sorted(state)[1]
    state[name].view(-1)[0] += 1e-6
    assert state_checksum(state) != state_checksum(trainer_model.model.state_dict())
    renamed = {("x" if n == name else n): t for n, t in trainer_model.model.state_dict().items()}
    assert state_checksum(renamed) != state_checksum(trainer_model.model.state_dict())


def test_a_verified_publication_loads_the_trainers_weights(trainer_model: LoadedModel) -> None:
    engine = _rollout_engine(trainer_model)
    ids = canary_ids(trainer_model.tokenizer)
    assert not torch.allclose(canary_logprobs(engine.model, ids), canary_logprobs(trainer_model.model, ids))
    publication = publish(trainer_model.model, 3, ids)
    load_verified(engine, publication, tolerance=1e-5)
    assert engine.weight_version == 3
    for name, tensor in trainer_model.model.state_dict().items():
        assert torch.equal(engine.model.state_dict()[name], tensor), name


def test_a_corrupted_publication_is_refused(trainer_model: LoadedModel) -> None:
    engine = _rollout_engine(trainer_model)
    publication = publish(trainer_model.model, 5, canary_ids(trainer_model.tokenizer))
    assert publication.state is not None
    name = max(publication.state)
    publication.state[name].view(-1)[7] *= -1.0  # one value flipped on the way
    with pytest.raises(WeightVerificationError, match=r"weight version 5: checksum mismatch") as error:
        load_verified(engine, publication, tolerance=1e-3)
    assert "changed after publication" in str(error.value)
    assert engine.weight_version == UNLOADED  # it must not generate with them


def test_a_model_that_computes_something_else_is_refused_by_the_canary(trainer_model: LoadedModel) -> None:
    """Same bytes in every tensor of the state_dict, but a buffer outside it (the rotary
    frequencies) differs: the checksum passes, the canary's logprobs do not."""
    engine = _rollout_engine(trainer_model)
    buffers = [b for name, b in engine.model.named_buffers() if name not in engine.model.state_dict()]
    assert buffers, "the tiny model has no non-persistent buffer to spoil"
    with torch.no_grad():
        for buffer in buffers:
            buffer.mul_(3.0)
    publication = publish(trainer_model.model, 2, canary_ids(trainer_model.tokenizer))
    with pytest.raises(WeightVerificationError, match=r"weight version 2: canary logprobs differ .* by up to [0-9.e+-]+") as error:
        load_verified(engine, publication, tolerance=1e-3)
    assert "pipeline.canary_tolerance=0.001" in str(error.value)
    assert engine.weight_version == UNLOADED


def test_a_tampered_canary_reports_the_difference(trainer_model: LoadedModel) -> None:
    engine = _rollout_engine(trainer_model)
    publication = publish(trainer_model.model, 1, canary_ids(trainer_model.tokenizer))
    publication.canary[3] += 0.25
    with pytest.raises(WeightVerificationError, match=r"by up to 0\.25"):
        load_verified(engine, publication, tolerance=1e-3)
    publication.canary[3] -= 0.25
    load_verified(engine, publication, tolerance=1e-3)
    assert engine.weight_version == 1


def test_waiting_for_weights_times_out_instead_of_hanging(trainer_model: LoadedModel) -> None:
    channel, stop = WeightChannel(), threading.Event()
    channel.publish(publish(trainer_model.model, 0, canary_ids(trainer_model.tokenizer)))
    began = time.monotonic()
    with pytest.raises(WeightTimeoutError, match=r"waited 0.3 s for weight version 2 or newer; version 0 was published"):
        channel.wait_for(2, timeout_s=0.3, stop=stop, poll_s=0.05)
    assert 0.3 <= time.monotonic() - began < 5
    # A publication that arrives in time ends the wait.
    later = publish(trainer_model.model, 2, canary_ids(trainer_model.tokenizer))
    threading.Timer(0.1, channel.publish, [later]).start()
    assert channel.wait_for(2, timeout_s=10, stop=stop, poll_s=0.05) is later
    stop.set()
    assert channel.wait_for(9, timeout_s=10, stop=stop) is None  # stopped: no error, no wait


def test_the_ray_rollout_actor_verifies_what_it_fetched(trainer_model: LoadedModel, ray_cluster: str) -> None:
    """Through the object store and into a Ray actor: a corrupted version is refused there (the
    typed error reaches the driver), a good one is loaded and generates."""
    import ray

    from tidal.config import load_config
    from tidal.pipeline.backends.ray import (
        NAMESPACE,
        RayRollout,
        RolloutActor,
        _PutWeights,
        _Restarts,
    )
    from tidal.types import Task

    ray.init(address=ray_cluster, namespace=NAMESPACE)
    try:
        cfg = load_config(find_config("smoke"), ["rollout.group_size=2", "rollout.max_new_tokens=4"])
        policy = ray.put((copy.deepcopy(trainer_model.model), trainer_model.tokenizer))
        actor = ray.remote(num_cpus=1)(RolloutActor).remote(cfg, "run", "cpu", 64)
        rollout = RayRollout(ray, actor, 0, cfg.pipeline, policy, _PutWeights(ray), _Restarts())
        task = Task(id="t1", domain="math", prompt="1 + 1?", verifier={"name": "exact_match", "answer": "2"})
        ids = canary_ids(trainer_model.tokenizer)

        corrupted = publish(trainer_model.model, 4, ids)
        assert corrupted.state is not None
        corrupted.state[max(corrupted.state)].view(-1)[0] += 0.5
        with pytest.raises(WeightVerificationError, match=r"weight version 4: checksum mismatch"):
            rollout.sample([task], 0, corrupted)
        [group] = rollout.sample([task], 0, publish(trainer_model.model, 5, ids))
        episodes = group.episodes
        assert [e.completion.weight_version for e in episodes] == [5, 5]
        assert [e.id for e in episodes] == ["run/step-000000/g000/s00", "run/step-000000/g000/s01"]
    finally:
        ray.shutdown()
