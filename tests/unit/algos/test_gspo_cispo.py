"""GSPO and CISPO against values and gradients computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tidal.algos.losses import LOSS_INPUTS, cispo_loss, get_loss, gspo_loss, ppo_clip_loss

# GSPO: sequence 0 (A = +1) trains 2 tokens with log-ratios 0.1, 0.3 (mean 0.2, s0 = e^0.2 =
# 1.2214); sequence 1 (A = -1) trains 3 tokens with -0.3, 0, 0 (mean -0.1, s1 = e^-0.1 = 0.9048).
# Clip range [0.8, 1.2]: s0 is above 1 + 0.2 with A > 0, so sequence 0 is clipped at 1.2 (loss
# -1.2 on each token, no gradient); s1 is inside, loss -(s1 * -1) = +0.9048 on each token.
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
OLD = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -1.5, -2.5]])
LOG_RATIOS = torch.tensor([[0.1, 0.3, 5.0], [-0.3, 0.0, 0.0]])  # 5.0 sits on padding: ignored
ADV = torch.tensor([1.0, -1.0])
S0, S1 = math.exp(0.2), math.exp(-0.1)


def _new() -> torch.Tensor:
    return (OLD + LOG_RATIOS).clone().requires_grad_(True)


def test_gspo_sequence_aggregation_is_the_papers_mean_over_sequences() -> None:
    new = _new()
    loss, metrics = gspo_loss(new, OLD, ADV, MASK, clip_low=0.2, clip_high=0.2, aggregation="sequence")
    assert float(loss.detach()) == pytest.approx((-1.2 + S1) / 2, abs=1e-6)
    loss.backward()
    # d/d logp_t of (s1 * 1) averaged over sequence 1's 3 tokens and the 2 sequences: s1 / 6
    expected = torch.tensor([[0.0, 0.0, 0.0], [S1 / 6, S1 / 6, S1 / 6]])
    assert torch.allclose(new.grad, expected, atol=1e-6)
    assert metrics["clip_high_frac"] == pytest.approx(0.5)  # one of two sequences
    assert metrics["clip_low_frac"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx((S0 + S1) / 2, abs=1e-6)


def test_gspo_matches_the_sequence_level_formula_and_its_gradient() -> None:
    # Independently: s_i = exp(mean_t (logp - old)), J = mean_i min(s_i A_i, clip(s_i) A_i).
    clip = 0.3  # wide enough that nothing is clipped: the gradient of every token shows
    new = _new()
    loss, _ = gspo_loss(new, OLD, ADV, MASK, clip_low=clip, clip_high=clip, aggregation="sequence")
    loss.backward()
    direct = _new()
    s = torch.exp(((direct - OLD) * MASK).sum(-1) / MASK.sum(-1))  # (B,)
    objective = torch.minimum(s * ADV, torch.clamp(s, 1 - clip, 1 + clip) * ADV).mean()
    (-objective).backward()
    assert float(loss.detach()) == pytest.approx(float(-objective), abs=1e-6)
    assert torch.allclose(new.grad, direct.grad * MASK, atol=1e-6)


def test_gspo_clips_whole_sequences_where_ppo_clips_tokens() -> None:
    # One sequence whose tokens move 1.5x and 0.8x: PPO (clip 0.2) clips the first token only;
    # GSPO sees the geometric mean sqrt(1.2) = 1.095 and clips nothing.
    old = torch.tensor([[-1.0, -1.0]])
    new = old + torch.log(torch.tensor([[1.5, 0.8]]))
    mask, adv = torch.ones(1, 2), torch.tensor([1.0])
    _, ppo = ppo_clip_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.2)
    _, gspo = gspo_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert ppo["clip_high_frac"] == 0.5 and gspo["clip_high_frac"] == 0.0
    assert gspo["ratio_mean"] == pytest.approx(math.sqrt(1.2), abs=1e-6)


def test_gspo_token_aggregation_weighs_sequences_by_length() -> None:
    loss, _ = gspo_loss(_new(), OLD, ADV, MASK, clip_low=0.2, clip_high=0.2, aggregation="token")
    assert float(loss.detach()) == pytest.approx((2 * -1.2 + 3 * S1) / 5, abs=1e-6)


def test_cispo_keeps_the_gradient_of_clipped_tokens_with_a_bounded_weight() -> None:
    # Ratios 2 and 0.5, clip [0.8, 1.28]: weights 1.28 and 0.8 (held constant), A = 1.
    old = torch.log(torch.tensor([[0.25, 0.5]]))
    new = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_(True)
    mask, adv = torch.ones(1, 2), torch.tensor([1.0])
    loss, metrics = cispo_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.28)
    expected = -(1.28 * math.log(0.5) + 0.8 * math.log(0.25)) / 2
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-6)
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[-1.28 / 2, -0.8 / 2]]), atol=1e-6)
    assert (metrics["clip_high_frac"], metrics["clip_low_frac"]) == (0.5, 0.5)
    assert metrics["ratio_mean"] == pytest.approx(1.25)
    # PPO's clip drops the first token's gradient (r = 2 > 1.28 with A > 0); CISPO kept it above.
    ppo_new = new.detach().clone().requires_grad_(True)
    ppo_clip_loss(ppo_new, old, adv, mask, clip_low=0.2, clip_high=0.28)[0].backward()
    assert float(ppo_new.grad[0, 0]) == 0.0


def test_cispo_ignores_padding_and_takes_per_token_advantages() -> None:
    old = torch.tensor([[-1.0, -1.0, float("nan")]])
    new = torch.tensor([[-1.0, -1.0, float("inf")]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, _ = cispo_loss(new, old, torch.tensor([[2.0, -1.0, float("nan")]]), mask)
    assert float(loss.detach()) == pytest.approx(-(2.0 * -1.0 + -1.0 * -1.0) / 2)
    loss.backward()
    assert torch.isfinite(new.grad).all()


def test_both_are_selected_by_name_with_no_extra_inputs() -> None:
    assert get_loss("gspo") is gspo_loss and get_loss("cispo") is cispo_loss
    assert "gspo" not in LOSS_INPUTS and "cispo" not in LOSS_INPUTS


def test_the_config_accepts_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tidal.config import load_config

    for name in ("gspo", "cispo"):
        cfg = load_config(None, ["tasks.domains.math.family=math", f"algorithm.loss={name}"])
        assert cfg.algorithm.loss == name


@pytest.mark.parametrize(("name", "aggregation"), [("gspo", "sequence"), ("gspo", "token"), ("cispo", "token")])
def test_the_trainer_updates_with_them_and_micro_batches_sum_to_the_batch(name: str, aggregation: str) -> None:
    import copy

    from trainer.tiny import build_model, random_batch  # tests/unit/trainer: the trainer tests' tiny model

    from tidal.config.schema import AlgorithmConfig, TrainerConfig
    from tidal.trainer.trainer import Trainer

    model = build_model(seed=3, dtype=torch.float64)
    batch = random_batch(model, batch=6, seed=4, noise=0.3)
    states = []
    for micro in (6, 2):
        trainer = Trainer(copy.deepcopy(model), TrainerConfig(lr=1e-3, micro_batch_size=micro, precision="fp32"),
                          AlgorithmConfig(loss=name, aggregation=aggregation), "cpu", total_steps=5)
        metrics = trainer.rl_step(batch)
        assert math.isfinite(metrics["policy_loss"]) and metrics["grad_norm"] > 0
        states.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
    before = model.state_dict()
    assert any(not torch.equal(states[0][k], before[k]) for k in before)  # it trained
    for key in before:
        torch.testing.assert_close(states[0][key], states[1][key])
