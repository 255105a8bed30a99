"""Trainer: gradient accumulation equals the whole batch, SFT learns, bad updates are skipped."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.trainer.trainer import Trainer, WarmupSchedule, autocast_dtype_for

from .tiny import build_model, random_batch


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "algo",
    [
        AlgorithmConfig(aggregation="token"),
        AlgorithmConfig(aggregation="sequence", kl_coef=0.1, entropy_coef=0.01),
        AlgorithmConfig(aggregation="token_sum", kl_coef=0.05, kl_estimator="k1", epochs=2),
    ],
    ids=["token", "sequence+kl+entropy", "token_sum+2epochs"],
)
def test_micro_batches_give_the_whole_batch_update(algo: AlgorithmConfig) -> None:
    # float64 so that summation order cannot flip the sign of a near-zero gradient (AdamW's
    # first step is close to lr * sign(grad)).
    base = build_model(seed=3, dtype=torch.float64)
    batch = random_batch(base, batch=8, seed=4)
    results = {}
    for micro in (2, 8, 3):
        model = copy.deepcopy(base)
        ref = copy.deepcopy(base)
        cfg = TrainerConfig(lr=1e-3, micro_batch_size=micro, precision="fp32", grad_clip=0.5)
        trainer = Trainer(model, cfg, algo, "cpu", total_steps=10, temperature=0.9, ref_model=ref, max_tokens=8)
        metrics = trainer.rl_step(batch)
        assert metrics["skipped"] == 0 and trainer.updates == algo.epochs
        results[micro] = (_weights(model), metrics)
    whole_weights, whole = results[8]
    for micro in (2, 3):
        weights, metrics = results[micro]
        for key in whole_weights:
            torch.testing.assert_close(weights[key], whole_weights[key], atol=1e-10, rtol=1e-9)
        for key in ("loss", "policy_loss", "grad_norm", "entropy", "kl", "clip_low_frac", "ratio_mean"):
            assert metrics[key] == pytest.approx(whole[key], rel=1e-8, abs=1e-12), key
    assert whole["grad_norm"] > 0.5  # clipping was active, and the pre-clip norm is reported
    assert not torch.equal(whole_weights["lm_head.weight"], base.lm_head.weight)


def test_rl_step_reports_its_metrics() -> None:
    model = build_model(seed=5)
    batch = random_batch(model, batch=4, seed=6)
    trainer = Trainer(model, TrainerConfig(micro_batch_size=2), AlgorithmConfig(), "cpu", total_steps=5)
    metrics = trainer.rl_step(batch)
    for key in ("loss", "grad_norm", "lr", "entropy", "clip_low_frac", "clip_high_frac", "approx_kl", "skipped"):
        assert math.isfinite(metrics[key]), key
    assert "kl" not in metrics  # no reference: not measured, so not reported as 0
    assert metrics["entropy"] > 0
    assert metrics["tokens"] == float(batch.completion_mask.sum())


def test_kl_needs_a_reference() -> None:
    model = build_model(seed=5)
    batch = random_batch(model, batch=2, seed=6)
    trainer = Trainer(model, TrainerConfig(), AlgorithmConfig(kl_coef=0.1), "cpu", total_steps=5)
    with pytest.raises(ValueError, match="ref_model"):
        trainer.rl_step(batch)
    batch.ref_logprobs = batch.old_logprobs.clone()  # given with the batch: no reference model needed
    assert trainer.rl_step(batch)["kl"] >= 0


def test_sft_step_lowers_the_loss() -> None:
    model = build_model(seed=7)
    generator = torch.Generator().manual_seed(8)
    input_ids = torch.randint(1, 300, (4, 10), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0
    loss_mask = torch.zeros(4, 10)
    loss_mask[:, 4:] = 1.0
    cfg = TrainerConfig(lr=3e-3, micro_batch_size=3, warmup_steps=2, schedule="cosine")
    trainer = Trainer(model, cfg, AlgorithmConfig(), "cpu", total_steps=20)
    losses = [trainer.sft_step(input_ids, attention_mask, loss_mask)["loss"] for _ in range(8)]
    assert losses[0] == pytest.approx(math.log(300), rel=0.1)  # random init: about uniform
    assert losses[-1] < losses[0] - 0.5
    assert all(b < a for a, b in zip(losses[2:], losses[3:]))


def test_non_finite_loss_skips_the_update() -> None:
    model = build_model(seed=9)
    batch = random_batch(model, batch=4, seed=10)
    trainer = Trainer(model, TrainerConfig(micro_batch_size=2), AlgorithmConfig(), "cpu", total_steps=5)
    before = _weights(model)
    lr = trainer.optimizer.param_groups[0]["lr"]
    batch.advantages[3] = float("nan")  # second micro-batch: the first one already backpropagated
    metrics = trainer.rl_step(batch)
    assert metrics["skipped"] == 1 and not math.isfinite(metrics["loss"])
    assert trainer.updates == 0 and trainer.scheduler.last_epoch == 0
    assert not trainer.optimizer.state  # AdamW moments untouched
    assert all(p.grad is None for p in model.parameters())
    for key, value in _weights(model).items():
        assert torch.equal(value, before[key]), key
    batch.advantages[3] = 0.5
    assert trainer.rl_step(batch)["skipped"] == 0  # the next good batch trains normally
    assert trainer.optimizer.param_groups[0]["lr"] == lr


def test_non_finite_gradient_skips_the_update() -> None:
    model = build_model(seed=11)
    trainer = Trainer(model, TrainerConfig(), AlgorithmConfig(), "cpu", total_steps=5)
    before = _weights(model)
    # A finite loss whose gradient overflows: inf * 0 in the embedding gradient.
    model.model.embed_tokens.weight.register_hook(lambda grad: grad * float("inf"))
    ids = torch.tensor([[1, 2, 3, 4]])
    metrics = trainer.sft_step(ids, torch.ones_like(ids), torch.ones(1, 4))
    assert metrics["skipped"] == 1 and math.isfinite(metrics["loss"]) and not math.isfinite(metrics["grad_norm"])
    for key, value in _weights(model).items():
        assert torch.equal(value, before[key]), key


def test_warmup_schedules() -> None:
    cosine = WarmupSchedule(warmup_steps=2, total_steps=6, schedule="cosine")
    assert [cosine(s) for s in range(7)] == pytest.approx([0.5, 1.0, 1.0, 0.8535534, 0.5, 0.1464466, 0.0])
    linear = WarmupSchedule(warmup_steps=0, total_steps=4, schedule="linear")
    assert [linear(s) for s in range(5)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    assert WarmupSchedule(3, 10, "constant")(9) == 1.0

    model = build_model(seed=12)
    cfg = TrainerConfig(lr=0.01, warmup_steps=2, schedule="linear")
    trainer = Trainer(model, cfg, AlgorithmConfig(), "cpu", total_steps=4)
    ids = torch.tensor([[1, 2, 3]])
    lrs = [trainer.sft_step(ids, torch.ones_like(ids), torch.ones(1, 3))["lr"] for _ in range(4)]
    assert lrs == pytest.approx([0.005, 0.01, 0.01, 0.005])


def test_precision() -> None:
    assert autocast_dtype_for("auto", torch.device("cpu")) is None
    assert autocast_dtype_for("fp32", torch.device("cuda")) is None
    assert autocast_dtype_for("bf16", torch.device("cpu")) is torch.bfloat16
    model = build_model(seed=13)
    batch = random_batch(model, batch=2, seed=14)
    trainer = Trainer(model, TrainerConfig(precision="bf16"), AlgorithmConfig(), "cpu", total_steps=2)
    metrics = trainer.rl_step(batch)
    assert metrics["skipped"] == 0 and math.isfinite(metrics["loss"])
    assert next(model.parameters()).dtype == torch.float32  # autocast: the weights stay fp32


def test_token_sum_needs_the_generation_budget() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        Trainer(build_model(), TrainerConfig(), AlgorithmConfig(aggregation="token_sum"), "cpu", total_steps=1)
