"""On a CPU the asynchronous loop splits torch's threads between its trainer and its rollout
workers (`pipeline.rollout_threads`): the split itself, and what the threads of a real async run
(local backend, smoke config) ran with, read inside the workers' sampling and the trainer's updates."""

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


def test_the_split_gives_each_party_its_share_and_at_least_one_thread() -> None:
    assert cpu_thread_split(2, 1, None) == (1, 1)
    assert cpu_thread_split(16, 1, None) == (8, 8)
    assert cpu_thread_split(16, 3, None) == (4, 4)
    assert cpu_thread_split(7, 2, None) == (3, 2)  # the trainer gets what the division leaves
    assert cpu_thread_split(1, 1, None) == (1, 1)  # one thread each, even on one
    assert cpu_thread_split(8, 2, 3) == (2, 3)
    assert cpu_thread_split(4, 2, 3) == (1, 3)
    assert cpu_thread_split(8, 2, 0) is None  # no split: torch's settings as they are


@pytest.fixture
def four_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


def _seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[tuple[str, int]]]:
    """Records (thread name, torch threads) inside every worker's sampling and trainer update."""
    seen: dict[str, set[tuple[str, int]]] = {"sample": set(), "train": set()}
    sample, rl_step = local.sample_episodes, Trainer.rl_step

    def sample_episodes(*args: Any, **kwargs: Any) -> Any:
        seen["sample"].add((threading.current_thread().name, torch.get_num_threads()))
        return sample(*args, **kwargs)

    def train(self: Trainer, *args: Any, **kwargs: Any) -> dict[str, float]:
        seen["train"].add((threading.current_thread().name, torch.get_num_threads()))
        return rl_step(self, *args, **kwargs)

    monkeypatch.setattr(local, "sample_episodes", sample_episodes)
    monkeypatch.setattr(Trainer, "rl_step", train)
    return seen


@pytest.mark.parametrize(
    ("setting", "trainer", "worker"), [(None, 2, 2), (1, 3, 1), (0, 4, 4)], ids=["even", "one-each", "no-split"]
)
def test_an_async_run_on_a_cpu_runs_its_threads_with_their_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_threads: None, setting: int | None, trainer: int, worker: int
) -> None:
    seen = _seen(monkeypatch)
    overrides = ["trainer.steps=2", *KEEP_ALL, "pipeline.mode=async", "algorithm.max_staleness=1"]
    if setting is not None:
        overrides.append(f"pipeline.rollout_threads={setting}")
    qs.run_quickstart(qs.find_config("smoke"), overrides, tmp_path, "run")
    main = threading.main_thread().name
    assert seen["train"] == {(main, trainer)}
    assert {threads for name, threads in seen["sample"] if name != main} == {worker}
    assert torch.get_num_threads() == 4  # the trainer's thread has its count back after the loop
