"""PPO with a value model (advantage gae): the critic's alignment, updates, warmup, checkpoints."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from tidal.algos.advantages import ADVANTAGES, CRITIC_ADVANTAGES
from tidal.algos.gae import gae, gae_advantages, token_rewards, whiten
from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.errors import CheckpointError
from tidal.trainer.checkpoint import MARKER
from tidal.trainer.critic import CRITIC_FILE, Critic, ValueModel
from tidal.trainer.trainer import Trainer

from .tiny import build_model, random_batch

TRAINER_CFG = TrainerConfig(lr=1e-3, micro_batch_size=3, precision="fp32")
GAE = AlgorithmConfig(advantage="gae", critic_lr=3e-3, value_clip=0.5, lam=0.95)


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(before[k], v) for k, v in module.state_dict().items())


def _gae_batch(model: torch.nn.Module, seed: int, batch: int = 6):
    data = random_batch(model, batch=batch, seed=seed)
    data.rewards = torch.linspace(0.0, 1.0, batch)
    data.advantages = torch.zeros(batch)  # not read for gae: the trainer computes per-token advantages
    return data


def test_values_see_only_the_tokens_before_their_position() -> None:
    policy = build_model(seed=30)
    value_model = ValueModel(policy)
    torch.nn.init.normal_(value_model.head.weight)  # zero-initialised: make the values informative
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        values = value_model(ids, attn)  # (2, 5)
        changed = value_model(torch.tensor([[5, 6, 99, 8, 9], [5, 6, 7, 0, 0]]), attn)
    assert values[:, 0].abs().max() == 0 and values[1, 3:].abs().max() == 0
    torch.testing.assert_close(values[0, :3], changed[0, :3])  # token 2 changed: V_0..V_2 do not see it
    assert not torch.equal(values[0, 3], changed[0, 3])
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(value_model.backbone.parameters(), policy.model.parameters()))


def test_a_value_model_is_built_for_the_estimators_that_declare_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer follows the declaration (`CRITIC_ADVANTAGES`), not the name: a group estimator
    gets no value model, and gae registered under another name trains exactly as gae does."""
    assert Trainer(build_model(seed=31), TRAINER_CFG, AlgorithmConfig(), "cpu", total_steps=10).critic is None
    monkeypatch.setitem(CRITIC_ADVANTAGES, "gae_too", gae_advantages)
    monkeypatch.setitem(ADVANTAGES, "gae_too", gae_advantages)
    metrics = []
    for name in ("gae", "gae_too"):
        model = build_model(seed=31)
        trainer = Trainer(model, TRAINER_CFG, GAE.model_copy(update={"advantage": name}), "cpu", total_steps=10)
        assert trainer.critic is not None
        metrics.append(trainer.rl_step(_gae_batch(model, seed=32)))
    assert metrics[0] == metrics[1]


def test_ppo_step_trains_policy_and_critic_with_the_gae_advantages() -> None:
    model = build_model(seed=31)
    batch = _gae_batch(model, seed=32)
    trainer = Trainer(model, TRAINER_CFG, GAE, "cpu", total_steps=10)
    assert trainer.critic is not None
    policy_before, critic_before = _weights(model), _weights(trainer.critic.model)
    old_values = trainer.critic.values(batch.input_ids, batch.attention_mask, 3)
    metrics = trainer.rl_step(batch)
    assert metrics["skipped"] == 0 and metrics["critic_skipped"] == 0 and metrics["critic_warmup"] == 0
    assert _changed(policy_before, model) and _changed(critic_before, trainer.critic.model)
    for key in ("value_loss", "value_mean", "returns_mean", "explained_variance", "critic_grad_norm"):
        assert math.isfinite(metrics[key]), key
    # Zero-initialised head: values 0, so the returns are the lambda-discounted rewards.
    assert old_values.abs().max() == 0 and metrics["value_mean"] == 0
    mask = batch.completion_mask
    _, returns = gae(token_rewards(batch.rewards, mask), old_values, mask, 1.0, 0.95)
    assert metrics["returns_mean"] == pytest.approx(float(returns.sum() / mask.sum()), rel=1e-5)
    assert metrics["value_loss"] == pytest.approx(float((0.5 * returns**2).sum() / mask.sum()), rel=1e-5)


def test_per_token_advantages_reach_the_loss() -> None:
    """The policy update of a gae step equals a plain ppo_clip step on the whitened GAE
    advantages (B, T), computed here by hand from the critic's values."""
    base = build_model(seed=33, dtype=torch.float64)
    batch = _gae_batch(base, seed=34)
    trainer = Trainer(copy.deepcopy(base), TRAINER_CFG, GAE, "cpu", total_steps=10)
    assert trainer.critic is not None
    torch.nn.init.normal_(trainer.critic.model.head.weight, std=0.1)  # non-zero values
    values = trainer.critic.values(batch.input_ids, batch.attention_mask, 3).to(torch.float64)
    mask = batch.completion_mask
    advantages, _ = gae(token_rewards(batch.rewards.to(torch.float64), mask), values, mask, 1.0, 0.95)
    advantages = whiten(advantages, mask)
    assert advantages.std() > 0 and not torch.allclose(advantages[:, -1:], advantages[:, -2:-1])
    trainer.rl_step(batch)
    plain = Trainer(copy.deepcopy(base), TRAINER_CFG, AlgorithmConfig(), "cpu", total_steps=10)
    batch.advantages = advantages
    plain.rl_step(batch)
    for key, value in plain.model.state_dict().items():
        torch.testing.assert_close(trainer.model.state_dict()[key], value, atol=1e-12, rtol=1e-10)


def test_value_loss_falls_on_a_fixed_batch() -> None:
    model = build_model(seed=35)
    batch = _gae_batch(model, seed=36)
    trainer = Trainer(model, TrainerConfig(lr=1e-5, micro_batch_size=3, precision="fp32"), GAE, "cpu", total_steps=10)
    losses = [trainer.rl_step(batch)["value_loss"] for _ in range(6)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert trainer.rl_step(batch)["explained_variance"] > 0


def test_a_sequence_without_reward_neither_trains_nor_poisons_the_update() -> None:
    model = build_model(seed=37)
    batch = _gae_batch(model, seed=38)
    batch.rewards[2] = float("nan")  # e.g. an infrastructure error that reached the batch
    trainer = Trainer(model, TRAINER_CFG, GAE, "cpu", total_steps=10)
    metrics = trainer.rl_step(batch)
    assert metrics["skipped"] == 0 and metrics["critic_skipped"] == 0
    assert all(math.isfinite(p.detach().sum().item()) for p in trainer.critic.model.parameters())  # type: ignore[union-attr]
    batch.rewards = None
    with pytest.raises(ValueError, match="rewards"):
        trainer.rl_step(batch)


def test_critic_warmup_trains_only_the_critic() -> None:
    model = build_model(seed=39)
    batch = _gae_batch(model, seed=40)
    trainer = Trainer(model, TRAINER_CFG, GAE.model_copy(update={"critic_warmup_steps": 1}), "cpu", total_steps=10)
    before = _weights(model)
    first = trainer.rl_step(batch)
    assert first["critic_warmup"] == 1 and "policy_loss" not in first and trainer.updates == 0
    assert not _changed(before, model)
    second = trainer.rl_step(batch)
    assert second["critic_warmup"] == 0 and trainer.updates == 1 and _changed(before, model)


def test_critic_is_saved_in_the_checkpoint_and_restored(tmp_path: Path) -> None:
    base = build_model(seed=41)
    batch = _gae_batch(base, seed=42)
    trainer = Trainer(copy.deepcopy(base), TRAINER_CFG, GAE, "cpu", total_steps=10)
    trainer.rl_step(batch)
    folder = trainer.save(tmp_path / "rl" / "step-000001", 1, extra={"mixer": {}})
    marker = json.loads((folder / MARKER).read_text())
    assert CRITIC_FILE in marker["files"]  # written inside the atomic save, size-checked on load
    assert not (folder / "model" / CRITIC_FILE).exists()
    fresh = Trainer(copy.deepcopy(base), TRAINER_CFG, GAE, "cpu", total_steps=10)
    fresh.load(folder)
    assert fresh.critic is not None and trainer.critic is not None and fresh.critic.steps == 1
    for key, value in trainer.critic.model.state_dict().items():
        assert torch.equal(fresh.critic.model.state_dict()[key], value), key
    # Both continue identically: weights and AdamW moments of the critic were restored.
    torch.manual_seed(0)
    expected = trainer.rl_step(batch)
    torch.manual_seed(0)
    resumed = fresh.rl_step(batch)
    assert resumed["value_loss"] == pytest.approx(expected["value_loss"], rel=1e-6)
    for key, value in trainer.critic.model.state_dict().items():
        torch.testing.assert_close(fresh.critic.model.state_dict()[key], value)

    (folder / CRITIC_FILE).write_bytes(b"corrupt")
    with pytest.raises(CheckpointError, match=CRITIC_FILE):
        fresh.load(folder)
    plain = Trainer(copy.deepcopy(base), TRAINER_CFG, AlgorithmConfig(), "cpu", total_steps=10)
    plain_folder = plain.save(tmp_path / "plain" / "step-000001", 1)
    with pytest.raises(CheckpointError, match="no value model"):
        Trainer(copy.deepcopy(base), TRAINER_CFG, GAE, "cpu", total_steps=10).load(plain_folder)


class _NoBackbone(torch.nn.Module):
    """A causal LM that does not expose its transformer as `base_model`."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.lm.get_input_embeddings()

    def forward(self, **kwargs):
        return self.lm(**kwargs)


def test_critic_of_a_model_without_a_backbone_reads_its_hidden_states() -> None:
    policy = build_model(seed=43)
    usual, whole = Critic(policy, lr=1e-3), Critic(_NoBackbone(policy), lr=1e-3)
    assert not usual.model.whole_model and whole.model.whole_model
    for critic in (usual, whole):
        torch.nn.init.constant_(critic.model.head.weight, 0.01)
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    values = usual.values(ids, attn, 4)
    assert values.shape == (2, 4) and values[0, 1:].abs().min() > 0
    torch.testing.assert_close(whole.values(ids, attn, 1), values)
