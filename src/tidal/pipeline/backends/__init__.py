"""Where the async source's rollout and scoring work runs: `local` (this process) or `ray` (Ray
actors, on a local Ray or a cluster).

The loop's own threads (sampler, scorer, trainer) stay in the calling process either way: they
hold the mixer, the watch, the domains' state, the store and the checkpoints, so exactly-once and
resume work the same on every backend. A backend supplies only the two kinds of work that can
run elsewhere, behind two one-method protocols:

- a `RolloutWorker` generates a batch with the weights of a given `Publication`, loading and
  verifying them first when it holds another version (`pipeline.rollout_workers` of them, each
  with its own copy of the policy, driven by one sampler thread each);
- a `ScoringWorker` scores (task, answer) pairs, like `Scorer.score_many`.

`get_backend(name)` returns the backend; an unknown name raises `UnknownNameError` with the known
ones. The Ray backend is imported only when asked for, so Ray stays optional.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tidal.errors import (  # noqa: F401 (re-exported)
    BackendUnavailableError,
    UnknownNameError,
    WorkerLostError,
)
from tidal.reward.protocol import ScoringWorker
from tidal.types import Group, Task

if TYPE_CHECKING:  # torch and transformers: a process that only scores (a Ray scorer actor) never loads them
    import torch

    from tidal.pipeline.stages import LoopParts
    from tidal.pipeline.weights import Publication
    from tidal.rollout.engine import Cancel


class RolloutWorker(Protocol):
    def sample(
        self, tasks: list[Task], step: int, publication: Publication, indices: list[int] | None = None,
        cancel: Cancel | None = None, kept: dict[tuple[str, ...], Any] | None = None,
    ) -> list[Group]:
        """Batch `step`'s groups for `tasks` (as `stages.Sampler.sample` makes them; `indices`:
        the tasks' positions in the batch when they are one chunk of it), generated with
        `publication`'s weights, loaded and verified first if the worker holds another version.
        Once `cancel` is set (the scheduler preempts the chunk), generation stops at its next
        decode step, wherever it runs, and `PreemptedError` is raised; `kept` (the chunk's, across
        its tries) then holds what it did, for the next try to go on from (`Sampler.sample`; a
        worker in another process keeps nothing)."""
        ...

    def check(self) -> None:
        """A health check: returns if the worker answers (within `pipeline.health_timeout_s`) and
        its model still computes the canary logprobs of the weights it holds; raises otherwise."""
        ...

    def run_metrics(self) -> dict[str, float]:
        """Its engine's own counters since the engine started (`ReportsMetrics.run_metrics`:
        `engine/...`, `spec/...`); {} when the engine keeps none or has not started yet."""
        ...


@dataclass
class Workers:
    """What a backend started for one run: `pipeline.rollout_workers` rollout workers and one
    scoring worker (which may share each batch among several scorers). `restarts()` counts worker
    restarts so far (by kind); `close()` stops what `start` started. `replace(i)` starts a new
    rollout worker for slot `i` (the scheduler's answer to a failed health check), stopping the
    old one, and returns it. `trainer_threads`: torch CPU threads of the loop's trainer thread while
    the workers run (None: `pipeline.trainer_threads`, or torch's count)."""

    rollouts: list[RolloutWorker]
    scorer: ScoringWorker
    close: Callable[[], None] = lambda: None
    restarts: Callable[[], dict[str, int]] = field(default=dict)
    replace: Callable[[int], RolloutWorker] | None = None
    trainer_threads: int | None = None


class Backend(Protocol):
    def start(self, parts: LoopParts, newest: Callable[[], Publication | None] | None = None) -> Workers:
        """Start the rollout and scoring workers for the run `parts` describes. `newest()` is the
        newest publication, which a worker loads while it generates with
        `pipeline.inflight_updates` (the local backend; None: between chunks only)."""
        ...


# name -> module defining `BACKEND`; imported on first use (`ray` imports Ray).
BACKENDS = {"local": "tidal.pipeline.backends.local", "ray": "tidal.pipeline.backends.ray"}


def get_backend(name: str) -> Backend:
    """The backend called `name` (`pipeline.backend`)."""
    if name not in BACKENDS:
        raise UnknownNameError("pipeline backend", name, list(BACKENDS))
    return importlib.import_module(BACKENDS[name]).BACKEND


def split_by_task(items: list[tuple[Task, str | bytes]], parts: int) -> list[list[int]]:
    """Item indices in up to `parts` shares of about equal size, all answers to one task in one
    share (a batch verifier scores them together). Shares keep the items' order."""
    by_task: dict[str, list[int]] = {}
    for index, (task, _) in enumerate(items):
        by_task.setdefault(task.id, []).append(index)
    shares: list[list[int]] = [[] for _ in range(max(1, min(parts, len(by_task))))]
    for indices in sorted(by_task.values(), key=len, reverse=True):  # largest first, to the lightest share
        min(shares, key=len).extend(indices)
    return [sorted(share) for share in shares if share]


def policy_copy(parts: LoopParts) -> torch.nn.Module:
    """A rollout worker's own copy of the run's policy (the engine's model): a plain copy, or for a
    LoRA-adapted policy the model its publications fit, `trainer.lora.publish` deciding
    (trainer/lora.py, `rollout_copy`: a plain model for merged weights, the adapted one for an adapter)."""
    import copy

    from tidal.trainer.lora import has_adapter, rollout_copy

    model = parts.engine.model
    if has_adapter(model):
        return rollout_copy(model, parts.config.trainer.lora.publish)
    return copy.deepcopy(model)
