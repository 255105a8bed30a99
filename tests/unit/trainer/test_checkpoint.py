"""Checkpoints: exact restore, exact resume, atomicity, corruption, pruning."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.errors import CheckpointError
from tidal.trainer.checkpoint import (
    LATEST,
    MARKER,
    latest_checkpoint,
    list_checkpoints,
    load_training_state,
    prune_checkpoints,
    save_training_state,
)
from tidal.trainer.trainer import Trainer

from .tiny import build_model, random_batch

TRAINER_CFG = TrainerConfig(lr=1e-3, warmup_steps=2, schedule="cosine", micro_batch_size=3)


def _trainer(seed: int, tie: bool = False) -> Trainer:
    return Trainer(build_model(seed=seed, tie=tie), TRAINER_CFG, AlgorithmConfig(), "cpu", total_steps=8)


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def _train_step(trainer: Trainer) -> None:
    """One step whose batch depends on the global RNGs, as a real loop's sampling does."""
    seed = random.randrange(1 << 30) + int(np.random.randint(1 << 20))
    batch = random_batch(trainer.model, batch=5, seed=seed)
    batch.advantages = torch.randn(5)
    trainer.rl_step(batch)


def test_save_then_load_restores_everything(tmp_path: Path) -> None:
    trainer = _trainer(seed=0)
    for _ in range(3):
        _train_step(trainer)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    moments = {i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(trainer.optimizer.state.values())}
    lr = trainer.scheduler.get_last_lr()
    folder = save_training_state(
        tmp_path / "step_3", trainer.model, trainer.optimizer, trainer.scheduler, 3, {"cursor": [7, "abc"]}
    )
    after_save = _draws()
    _train_step(trainer)  # move every state on before loading

    fresh = _trainer(seed=99)
    step, extra = load_training_state(folder, fresh.model, fresh.optimizer, fresh.scheduler)
    assert (step, extra) == (3, {"cursor": [7, "abc"]})
    assert _draws() == after_save  # python, numpy and torch streams continue where they were
    for key, value in fresh.model.state_dict().items():
        assert torch.equal(value, weights[key]), key
    for i, state in enumerate(fresh.optimizer.state.values()):
        for key, value in state.items():
            assert torch.equal(value, moments[i][key]), key
    assert fresh.scheduler.get_last_lr() == lr and fresh.scheduler.last_epoch == 3
    assert fresh.optimizer.param_groups[0]["lr"] == lr[0]


def test_resumed_training_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    def seed_all() -> None:
        random.seed(1)
        np.random.seed(1)
        torch.manual_seed(1)

    seed_all()
    straight = _trainer(seed=5)
    for _ in range(4):
        _train_step(straight)

    seed_all()
    first = _trainer(seed=5)
    for _ in range(2):
        _train_step(first)
    first.save(tmp_path / "ckpt" / "step_2", step=2, extra={"sampler": 2})
    del first
    random.seed(123)  # a new process starts with other RNG states
    torch.manual_seed(123)
    resumed = _trainer(seed=42)
    assert resumed.load(latest_checkpoint(tmp_path / "ckpt")) == (2, {"sampler": 2})
    assert resumed.updates == 2
    for _ in range(2):
        _train_step(resumed)
    for key, value in resumed.model.state_dict().items():
        assert torch.equal(value, straight.model.state_dict()[key]), key


def test_tied_weights_and_tokenizer(tmp_path: Path) -> None:
    class Tokenizer:
        def save_pretrained(self, folder: Path) -> None:
            (Path(folder) / "tokenizer.json").write_text("{}")

    trainer = _trainer(seed=1, tie=True)
    _train_step(trainer)
    folder = trainer.save(tmp_path / "a", step=1, tokenizer=Tokenizer())
    assert (folder / "model" / "tokenizer.json").is_file()
    assert (folder / "model" / "config.json").is_file()
    fresh = _trainer(seed=2, tie=True)
    fresh.load(folder)
    assert torch.equal(fresh.model.lm_head.weight, trainer.model.lm_head.weight)
    assert fresh.model.lm_head.weight is fresh.model.model.embed_tokens.weight


def test_latest_ignores_a_folder_without_its_marker(tmp_path: Path) -> None:
    model = build_model(seed=3)
    one = save_training_state(tmp_path / "step_1", model, None, None, 1, {})
    two = save_training_state(tmp_path / "step_2", model, None, None, 2, {})
    assert (tmp_path / LATEST).read_text().strip() == "step_2"
    assert latest_checkpoint(tmp_path) == two and list_checkpoints(tmp_path) == [one, two]
    (two / MARKER).unlink()  # as if the save had died before finishing
    assert latest_checkpoint(tmp_path) == one
    assert list_checkpoints(tmp_path) == [one]
    with pytest.raises(CheckpointError, match=MARKER):
        load_training_state(two, model, None, None)


def test_a_failed_save_leaves_the_previous_checkpoint_latest(tmp_path: Path) -> None:
    trainer = _trainer(seed=4)
    good = trainer.save(tmp_path / "step_1", step=1)

    class Broken:
        def state_dict(self) -> dict:
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_training_state(tmp_path / "step_2", trainer.model, trainer.optimizer, Broken(), 2, {})
    assert latest_checkpoint(tmp_path) == good
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, "step_1"]  # no half folder left
    with pytest.raises(ValueError, match="JSON"):
        trainer.save(tmp_path / "step_3", step=3, extra={"bad": object()})
    assert latest_checkpoint(tmp_path) == good


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    model = build_model(seed=6)
    save_training_state(tmp_path / "step_1", model, None, None, 1, {"v": 1})
    save_training_state(tmp_path / "step_1", model, None, None, 1, {"v": 2})
    assert load_training_state(tmp_path / "step_1", model, None, None) == (1, {"v": 2})
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_corrupt_or_missing_files_name_the_file(tmp_path: Path) -> None:
    trainer = _trainer(seed=7)
    _train_step(trainer)
    folder = trainer.save(tmp_path / "step_1", step=1)
    fresh = _trainer(seed=8)

    with pytest.raises(CheckpointError, match="nowhere"):
        fresh.load(tmp_path / "nowhere")

    optimizer_file = folder / "optimizer.pt"
    data = optimizer_file.read_bytes()
    optimizer_file.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(CheckpointError, match="optimizer.pt"):
        fresh.load(folder)
    optimizer_file.write_bytes(b"\0" * len(data))  # same size, garbage
    with pytest.raises(CheckpointError, match="optimizer.pt"):
        fresh.load(folder)
    optimizer_file.write_bytes(data)

    weights = folder / "model" / "model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(b"\xff" * len(original))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        fresh.load(folder)
    weights.write_bytes(original)

    (folder / "rng.pt").unlink()
    with pytest.raises(CheckpointError, match="rng.pt"):
        fresh.load(folder)


def test_prune_keeps_the_newest_and_removes_leftovers(tmp_path: Path) -> None:
    model = build_model(seed=9)
    for step in (1, 2, 3, 4):
        save_training_state(tmp_path / f"step_{step}", model, None, None, step, {})
    leftover = tmp_path / ".tmp-step_5-999999999-abcd"  # a save that died in another process
    leftover.mkdir()
    stranger = tmp_path / "notes"  # not a checkpoint: never touched
    stranger.mkdir()
    removed = prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == [".tmp-step_5-999999999-abcd", "step_1", "step_2"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_3", "step_4"]
    assert stranger.is_dir() and latest_checkpoint(tmp_path).name == "step_4"

    (tmp_path / LATEST).write_text("step_3\n")  # e.g. after a rollback
    assert prune_checkpoints(tmp_path, keep=1) == []
    assert json.loads((tmp_path / "step_3" / MARKER).read_text())["step"] == 3
    assert os.path.isdir(tmp_path / "step_4")
