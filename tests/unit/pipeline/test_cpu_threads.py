"""On a CPU the asynchronous loop splits the cores between generation and the update
(`pipeline.rollout_threads`, `pipeline.trainer_threads`): the split itself, what the threads of a
real async run (local backend, smoke config) ran with, read inside the workers' sampling and the
trainer's updates, and that the trainer's thread gets torch's count back after the loop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tidal.pipeline import quickstart as qs
from tidal.pipeline.backends import local
from tidal.pipeline.backends.local import cpu_thread_split
from tidal.trainer.trainer import Trainer

KEEP_ALL = ["gate.drop_zero_variance=false", "gate.drop_truncated=false", "gate.drop_empty=false",
            "gate.max_repetition=1.0", "audit.watch.enabled=false"]


def test_the_split_gives_each_its_share_unless_told_and_at_least_one_thread() -> None:
    assert cpu_thread_split(2, 1, None, None) == (1, 1)
    assert cpu_thread_split(16, 1, None, None) == (8, 8)
    assert cpu_thread_split(16, 3, None, None) == (4, 4)
    assert cpu_thread_split(7, 2, None, None) == (3, 2)  # the trainer gets what the workers leave
    assert cpu_thread_split(1, 1, None, None) == (1, 1)  # one thread each, even on one
    assert cpu_thread_split(8, 2, 3, None) == (2, 3)
    assert cpu_thread_split(4, 2, 3, None) == (1, 3)
    assert cpu_thread_split(8, 1, None, 6) == (6, 4)
    assert cpu_thread_split(8, 2, 0, 0) == (8, 8)  # 0: torch's count, as before any split


@pytest.fixture
def four_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


def _seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[tuple[str, int]]]:
    """Records (thread name, torch threads) inside every worker's sampling and trainer update."""
    seen: dict[str, set[tuple[str, int]]] = {"sample": set(), "train": set()}
    sample, rl_step = local.Sampler.sample, Trainer.rl_step

    def sample_groups(self: local.Sampler, *args: Any, **kwargs: Any) -> Any:
        seen["sample"].add((threading.current_thread().name, torch.get_num_threads()))
        return sample(self, *args, **kwargs)

    def train(self: Trainer, *args: Any, **kwargs: Any) -> dict[str, float]:
        seen["train"].add((threading.current_thread().name, torch.get_num_threads()))
        return rl_step(self, *args, **kwargs)

    monkeypatch.setattr(local.Sampler, "sample", sample_groups)
    monkeypatch.setattr(Trainer, "rl_step", train)
    return seen


@pytest.mark.parametrize(
    ("rollout", "trainer", "seen_rollout", "seen_trainer"),
    [(None, None, 2, 2), (1, None, 1, 3), (None, 1, 2, 1), (0, 0, 4, 4), (3, 3, 3, 3)],
    ids=["split", "rollout-set", "trainer-set", "torch's", "both-set"],
)
def test_an_async_run_on_a_cpu_runs_its_threads_with_the_configured_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_threads: None,
    rollout: int | None, trainer: int | None, seen_rollout: int, seen_trainer: int,
) -> None:
    seen = _seen(monkeypatch)
    overrides = ["trainer.steps=2", *KEEP_ALL, "pipeline.mode=async", "algorithm.max_staleness=1"]
    overrides += [f"pipeline.{name}_threads={n}" for name, n in (("rollout", rollout), ("trainer", trainer)) if n is not None]
    qs.run_quickstart(qs.find_config("smoke"), overrides, tmp_path, "run")
    main = threading.main_thread().name
    assert seen["train"] == {(main, seen_trainer)}
    assert {threads for name, threads in seen["sample"] if name != main} == {seen_rollout}
    assert torch.get_num_threads() == 4  # the trainer's thread has its count back after the loop
