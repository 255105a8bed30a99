"""The local backend: the rollout and scoring work runs in the calling process, on the
scheduler's worker threads (`tidal-rollout-<i>`) and the async source's scorer thread.

Each rollout worker samples from its own copy of the policy (another copy of the model in memory,
so `pipeline.rollout_workers: N` holds N + 1 copies), which it replaces by each publication it is
handed, verified (`weights.load_verified`). Workers generate on their own threads at once;
torch releases the GIL in its kernels, but on a CPU they share its cores with the trainer. So on a
CPU the backend splits torch's threads (`cpu_thread_split`, `pipeline.rollout_threads` and
`pipeline.trainer_threads`): each worker sets its own thread's count and the trainer's thread
runs with the rest, instead of every thread starting as many as there are cores
(docs/design/loop.md, "Threads on a CPU").
Scoring uses the run's `Scorer` (its sandbox pool scores a batch's answers in parallel); with
`pipeline.scorer_workers > 1`, that many scorers, each with its own pool, share each batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from tidal.errors import PreemptedError
from tidal.pipeline.backends import Workers, policy_copy, split_by_task
from tidal.pipeline.stages import LoopParts, Sampler
from tidal.pipeline.weights import UNLOADED, Publication, check_canary, load_verified
from tidal.reward.scorer import Scorer
from tidal.rollout.engine import Cancel, EmbeddedEngine
from tidal.rollout.protocol import ReportsMetrics, RolloutEngine
from tidal.types import Group, Score, Task


def cpu_thread_split(total: int, workers: int, rollout_threads: int | None, trainer_threads: int | None) -> tuple[int, int]:
    """(the trainer's, each rollout worker's) torch CPU threads when `total` (torch's count) are
    shared by the trainer and `workers` rollout workers on this machine's cores.

    `rollout_threads` and `trainer_threads` are the config's: None takes the share (each worker
    `total // (workers + 1)`, the trainer what the workers leave), 0 takes `total`, k takes k.
    Everyone gets at least one thread, so with fewer threads than parties they outnumber `total`."""
    if rollout_threads is None:
        each = max(1, total // (workers + 1))
    else:
        each = rollout_threads or total
    if trainer_threads is None:
        trainer = max(1, total - each * workers)
    else:
        trainer = trainer_threads or total
    return trainer, each


def rollout_engine(parts: LoopParts) -> RolloutEngine:
    """A second engine on a frozen copy of the trainer's model, holding no verified version yet;
    with `rollout.engine: http`, the run's HTTP engine itself: the server holds the copy, which
    the worker reloads with each publication it is handed (a reload waits for the generations
    in flight, rollout/http_engine.py), and the trainer's publications for evaluation go there too."""
    if parts.engine_holds_copy:
        return parts.engine
    if not isinstance(parts.engine, EmbeddedEngine):
        raise TypeError(f"the local backend copies an EmbeddedEngine's model; got {type(parts.engine).__name__}")
    model = policy_copy(parts).eval().requires_grad_(False)
    engine = EmbeddedEngine(model, parts.engine.tokenizer, parts.engine.device, parts.engine.max_batch_rows,
                            **parts.engine.options)  # type: ignore[arg-type]
    engine.weight_version = UNLOADED
    return engine


class LocalRollout:
    """Generates on the scheduler's thread for its slot, with its own engine; loads each new
    publication before a chunk that needs it. With `pipeline.inflight_updates` (and `newest`, the
    newest publication) it also loads a newer one between two decode steps of the chunk it is
    generating, under the engine's lock (`EmbeddedEngine.between_steps`), and never goes back to
    an older one: a newer version is within every batch's staleness bound."""

    def __init__(self, parts: LoopParts, index: int = 0, threads: int | None = None,
                 newest: Callable[[], Publication | None] | None = None) -> None:
        self.index = index  # its slot among the run's rollout workers
        engine = rollout_engine(parts)
        self.sampler = Sampler(parts.config, parts.run.name, engine)
        self.tolerance = parts.config.pipeline.canary_tolerance
        self.loaded: Publication | None = None  # the header of the publication the engine holds
        self.threads = threads  # torch CPU threads of the thread it samples on; None: leave them
        self._thread = threading.local()  # what it set on the current thread
        self.newest = newest if parts.config.pipeline.inflight_updates else None
        self.inflight_loads = 0  # publications loaded while a chunk was generating
        if self.newest is not None and isinstance(engine, EmbeddedEngine):
            engine.between_steps = self._catch_up

    def _catch_up(self) -> None:
        """Load the newest publication if it is newer than the engine's (between two steps)."""
        assert self.newest is not None
        latest, engine = self.newest(), self.sampler.engine
        if latest is not None and latest.state is not None and latest.version > engine.weight_version:
            load_verified(engine, latest, self.tolerance)
            self.loaded = latest.header()
            self.inflight_loads += 1

    def sample(
        self, tasks: list[Task], step: int, publication: Publication, indices: list[int] | None = None,
        cancel: Cancel | None = None, kept: dict[tuple[str, ...], Any] | None = None,
    ) -> list[Group]:
        if self.threads is not None and getattr(self._thread, "threads", None) != self.threads:
            # Set on each thread it samples on, once: this thread's OpenMP and MKL counts (a thread's
            # own reading of torch's count can agree while MKL, never told, still uses another).
            torch.set_num_threads(self.threads)
            self._thread.threads = self.threads
        engine = self.sampler.engine
        held = engine.weight_version
        if held != publication.version and not (self.newest is not None and held > publication.version):
            load_verified(engine, publication, self.tolerance)
            self.loaded = publication.header()
        try:
            return self.sampler.sample(tasks, step, indices, cancel, kept)
        except PreemptedError:
            raise
        except BaseException:
            if kept is not None:
                kept.clear()  # a failed try's work (aborted requests, maybe bad weights): the retry starts afresh
            raise

    def check(self) -> None:
        if self.loaded is not None and self.sampler.engine.weight_version == self.loaded.version:
            check_canary(self.sampler.engine, self.loaded, self.tolerance)

    def run_metrics(self) -> dict[str, float]:
        engine = self.sampler.engine
        metrics = engine.run_metrics() if isinstance(engine, ReportsMetrics) else {}
        if self.newest is not None:
            metrics["engine/inflight_loads"] = self.inflight_loads
        return metrics


class ScorerPool:
    """`score_many` over several scorers at once, each scoring whole tasks' answers."""

    def __init__(self, scorers: list[Scorer]) -> None:
        self.scorers = scorers

    def score_many(self, items: list[tuple[Task, str | bytes]]) -> list[Score]:
        shares = split_by_task(items, len(self.scorers))
        scores: list[Score | None] = [None] * len(items)
        with ThreadPoolExecutor(max_workers=len(shares), thread_name_prefix="tidal-scorers") as pool:
            done = pool.map(lambda pair: pair[0].score_many([items[i] for i in pair[1]]), zip(self.scorers, shares))
            for share, share_scores in zip(shares, done):
                for index, score in zip(share, share_scores):
                    scores[index] = score
        return scores  # type: ignore[return-value]

    def close(self) -> None:
        for scorer in self.scorers:
            scorer.close()


class LocalBackend:
    """Threads of this process (`pipeline.backend: local`)."""

    def start(self, parts: LoopParts, newest: Callable[[], Publication | None] | None = None) -> Workers:
        pipeline = parts.config.pipeline
        trainer_threads = threads = None
        if parts.trainer.device.type == "cpu" and not parts.engine_holds_copy:  # a server's workers compute elsewhere
            # set even when torch's: a new thread takes the last count set anywhere
            trainer_threads, threads = cpu_thread_split(
                torch.get_num_threads(), pipeline.rollout_workers, pipeline.rollout_threads, pipeline.trainer_threads
            )
        rollouts = [LocalRollout(parts, i, threads, newest) for i in range(pipeline.rollout_workers)]
        replaced = {"rollout": 0}

        def replace(index: int) -> LocalRollout:  # a fresh copy of the policy; it loads the next publication
            rollouts[index] = LocalRollout(parts, index, threads, newest)
            replaced["rollout"] += 1
            return rollouts[index]

        common = {"restarts": lambda: dict(replaced), "replace": replace, "trainer_threads": trainer_threads}
        if pipeline.scorer_workers == 1:  # the run's scorer: it closes it itself
            return Workers(rollouts, parts.scorer, **common)
        pool = ScorerPool([Scorer(parts.config.reward) for _ in range(pipeline.scorer_workers)])
        return Workers(rollouts, pool, close=pool.close, **common)


BACKEND = LocalBackend()
