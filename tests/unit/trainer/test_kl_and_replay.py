"""Trainer: the KL in the reward, the adaptive KL coefficient across checkpoints, replay."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from tidal.algos.losses import kl_penalty
from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.errors import UnknownNameError
from tidal.trainer.checkpoint import load_training_state
from tidal.trainer.logprobs import token_logprobs
from tidal.trainer.trainer import TRAINER_STATE, ReplayBatch, Trainer

from .tiny import VOCAB, build_model, random_batch

TRAINER_CFG = TrainerConfig(lr=1e-3, micro_batch_size=3, precision="fp32")


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    for key, value in a.items():
        torch.testing.assert_close(value, b[key], atol=1e-12, rtol=1e-10)


def test_kl_in_reward_is_the_documented_per_token_advantage() -> None:
    """kl_in=reward trains exactly as the loss with (B, T) advantages A - kl_coef * (old - ref)
    and no KL term; and differently from kl_in=loss."""
    base = build_model(seed=20, dtype=torch.float64)
    batch = random_batch(base, batch=6, seed=21)
    generator = torch.Generator().manual_seed(22)
    batch.ref_logprobs = (batch.old_logprobs + 0.5 * torch.randn(batch.old_logprobs.shape, generator=generator, dtype=torch.float64)) * batch.completion_mask

    def run(algo: AlgorithmConfig, advantages: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        model = copy.deepcopy(base)
        trainer = Trainer(model, TRAINER_CFG, algo, "cpu", total_steps=4)
        metrics = trainer.rl_step(dataclasses.replace(batch, advantages=advantages))
        return _weights(model), metrics

    coef = 0.3
    in_reward, metrics = run(AlgorithmConfig(kl_coef=coef, kl_in="reward"), batch.advantages)
    k1 = (batch.old_logprobs - batch.ref_logprobs) * batch.completion_mask  # (B, T)
    by_hand = (batch.advantages.unsqueeze(-1) - coef * k1) * batch.completion_mask
    documented, _ = run(AlgorithmConfig(kl_coef=0.0), by_hand)
    _assert_same(in_reward, documented)
    assert metrics["kl_reward"] == pytest.approx(float(k1.sum() / batch.completion_mask.sum()))
    in_loss, _ = run(AlgorithmConfig(kl_coef=coef, kl_in="loss"), batch.advantages)
    assert not torch.equal(in_loss["lm_head.weight"], in_reward["lm_head.weight"])


def test_adaptive_kl_coefficient_follows_the_target_and_survives_checkpoints(tmp_path: Path) -> None:
    base = build_model(seed=23)
    batch = random_batch(base, batch=4, seed=24)
    batch.ref_logprobs = batch.old_logprobs - 0.5 * batch.completion_mask  # a KL well above 0
    coefs = {}
    for name, target in (("low", 1e-4), ("high", 100.0)):
        algo = AlgorithmConfig(kl_coef=0.1, kl_estimator="k2", kl_target=target, kl_horizon=40)
        trainer = Trainer(copy.deepcopy(base), TRAINER_CFG, algo, "cpu", total_steps=4)
        first = trainer.rl_step(batch)
        second = trainer.rl_step(batch)
        assert first["kl_coef"] == 0.1 and first["kl"] > 1e-4
        # 4 sequences, horizon 40: at most 2% a step, the error being clipped to +-0.2.
        step = 1.02 if name == "low" else 0.98
        assert second["kl_coef"] == pytest.approx(0.1 * step)
        assert trainer.kl.value == pytest.approx(0.1 * step * step)
        coefs[name] = trainer
    low = coefs["low"]
    folder = low.save(tmp_path / "rl" / "step-000002", 2, extra={"mixer": [1, 2]})
    state = json.loads((folder / "state.json").read_text())
    assert state["extra"][TRAINER_STATE]["kl_coef"] == pytest.approx(low.kl.value)
    fresh = Trainer(copy.deepcopy(base), TRAINER_CFG, low.algo, "cpu", total_steps=4)
    assert fresh.kl.value == 0.1
    step, extra = fresh.load(folder)
    assert step == 2 and extra == {"mixer": [1, 2]}  # the caller's extra, as given
    assert fresh.kl.value == low.kl.value
    _, raw_extra = load_training_state(folder, copy.deepcopy(base), None, None)  # other readers still work
    assert raw_extra["mixer"] == [1, 2]
    with pytest.raises(ValueError, match=TRAINER_STATE):
        low.save(tmp_path / "rl" / "step-000003", 3, extra={TRAINER_STATE: 1})


def _replay(seed: int) -> ReplayBatch:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, VOCAB, (5, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 6:] = 0
    loss_mask = torch.zeros(5, 9)
    loss_mask[:, 3:] = 1.0
    return ReplayBatch(input_ids, attention_mask, loss_mask)


def test_replay_adds_its_weighted_cross_entropy_to_the_same_update() -> None:
    base = build_model(seed=25, dtype=torch.float64)
    batch = random_batch(base, batch=6, seed=26)
    replay = _replay(27)
    with torch.no_grad():
        logprobs, _ = token_logprobs(base, replay.input_ids, replay.attention_mask)
    mask = replay.loss_mask * replay.attention_mask
    cross_entropy = float(-(logprobs * mask).sum() / mask.sum())

    def run(weight: float, micro: int, with_replay: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        model = copy.deepcopy(base)
        cfg = TrainerConfig(lr=1e-3, micro_batch_size=micro, precision="fp32")
        trainer = Trainer(model, cfg, AlgorithmConfig(replay_weight=weight), "cpu", total_steps=4)
        metrics = trainer.rl_step(batch, replay if with_replay else None)
        assert metrics["skipped"] == 0 and trainer.updates == 1
        return _weights(model), metrics

    plain, without = run(0.5, 3, with_replay=False)
    replayed, with_ = run(0.5, 3, with_replay=True)
    assert with_["replay_loss"] == pytest.approx(cross_entropy, rel=1e-9)
    assert with_["loss"] - without["loss"] == pytest.approx(0.5 * cross_entropy, rel=1e-9)
    assert with_["policy_loss"] == pytest.approx(without["policy_loss"], rel=1e-12)
    assert not torch.equal(plain["model.embed_tokens.weight"], replayed["model.embed_tokens.weight"])
    whole, _ = run(0.5, 16, with_replay=True)  # one micro-batch each: the same accumulated gradient
    _assert_same(replayed, whole)
    off, off_metrics = run(0.0, 3, with_replay=True)  # weight 0: the update without replay, exactly
    for key, value in plain.items():
        assert torch.equal(off[key], value), key
    assert "replay_loss" not in off_metrics


def test_unknown_advantage_fails_when_the_trainer_is_built() -> None:
    # The config refuses the name at load; a config built around validation still fails here.
    with pytest.raises(ValueError, match="reinforce_pp"):
        AlgorithmConfig(advantage="ppo")
    with pytest.raises(UnknownNameError, match="reinforce_pp"):
        Trainer(build_model(), TRAINER_CFG, AlgorithmConfig().model_copy(update={"advantage": "ppo"}), "cpu",
                total_steps=1)


def test_kl_estimator_k2_in_the_loss() -> None:
    model = build_model(seed=28)
    batch = random_batch(model, batch=3, seed=29)
    batch.ref_logprobs = batch.old_logprobs.clone()
    trainer = Trainer(model, TRAINER_CFG, AlgorithmConfig(kl_coef=0.1, kl_estimator="k2"), "cpu", total_steps=2)
    with torch.no_grad():
        current, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
    k2 = kl_penalty(current, batch.ref_logprobs, "k2") * batch.completion_mask
    metrics = trainer.rl_step(batch)
    assert metrics["kl"] == pytest.approx(float(k2.sum() / batch.completion_mask.sum()), rel=1e-4)
