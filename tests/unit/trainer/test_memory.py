"""trainer.micro_batch_size: auto (trainer/memory.py): the estimate's arithmetic, what memory is
read, and a trainer that sizes its micro-batches from it and trains as with that size fixed."""

from __future__ import annotations

import copy

import pytest
import torch

from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.trainer import memory
from tidal.trainer.memory import MemoryPlan, available_memory, plan_memory
from tidal.trainer.trainer import Trainer

from .tiny import build_model, random_batch

CPU = torch.device("cpu")
MIB = 1 << 20


def test_rows_fit_the_budget_and_stay_within_the_batch() -> None:
    plan = MemoryPlan(free=1000 * MIB, state=100 * MIB, head=0, per_token=MIB // 10,
                      attention_per_token_per_position=0, full_logits_per_token=0)
    assert plan.budget == 600 * MIB  # 0.7 of free, minus the optimizer state to come
    assert plan.rows(length=100, batch_rows=1000) == 59  # room for 60 of 10 MiB: 17 micro-batches of <= 59
    assert plan.rows(length=100, batch_rows=8) == 8
    assert plan.rows(length=100, batch_rows=64) == 32  # room for 60: two even micro-batches, not 60 + 4
    assert plan.rows(length=10**6, batch_rows=8) == 1  # never 0: one row is tried, whatever the estimate
    record = plan.record(100, 1000)
    assert record["micro_batch_size"] == 59 and record["mib_per_sequence"] == 10.0


def test_checkpointing_bf16_and_chunks_shrink_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "available_memory", lambda device: 8 << 30)
    model = build_model()
    base = plan_memory(model, CPU, None, gradient_checkpointing=False, chunk_tokens=1024, chunked=True)
    assert base.free == 8 << 30 and base.head == memory.HEAD_COPIES * 1024 * 300 * 4
    assert base.state == memory.STATE_BYTES * sum(p.numel() for p in model.parameters())
    checkpointed = plan_memory(model, CPU, None, gradient_checkpointing=True, chunk_tokens=1024, chunked=True)
    bf16 = plan_memory(model, CPU, torch.bfloat16, gradient_checkpointing=False, chunk_tokens=1024, chunked=True)
    full = plan_memory(model, CPU, None, gradient_checkpointing=False, chunk_tokens=0, chunked=True)
    assert checkpointed.per_token < bf16.per_token < base.per_token
    assert full.head == 0 and full.full_logits_per_token == memory.HEAD_COPIES * 300 * 4
    assert full.token_bytes(50) > base.token_bytes(50)
    critic = plan_memory(model, CPU, None, False, 1024, True, value_model=True)
    assert critic.state == 2 * base.state


def test_available_memory_is_positive_and_below_the_machine() -> None:
    free = available_memory(CPU)
    assert free > 0
    with open("/proc/meminfo") as handle:
        total = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("MemTotal:"))
    assert free <= total


def test_an_auto_trainer_sizes_its_micro_batches_and_trains_as_with_that_size(monkeypatch: pytest.MonkeyPatch) -> None:
    base = build_model(seed=4)
    batch = random_batch(base, batch=8, seed=5)
    length = int(batch.attention_mask.sum(dim=1).max())
    probe = plan_memory(base, CPU, None, False, 1024, True)
    # Free memory for exactly 3 sequences of this batch's length.
    free = int((probe.state + probe.head + 3 * length * probe.token_bytes(length)) / memory.SAFETY) + 1
    monkeypatch.setattr(memory, "available_memory", lambda device: free)
    results = []
    for size in ("auto", 3):
        trainer = Trainer(copy.deepcopy(base), TrainerConfig(lr=1e-3, micro_batch_size=size, precision="fp32"),
                          AlgorithmConfig(), "cpu", total_steps=2)
        results.append(trainer.rl_step(batch))
        assert trainer.micro_batch_size == 3
    auto, fixed = results
    assert trainer.setup["micro_batch_size"] == 3
    for key, value in fixed.items():
        assert auto[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
