"""The local backend: the rollout and scoring work runs in the calling process, on the async
loop's sampler and scorer threads.

Each rollout worker samples from its own copy of the policy (another copy of the model in memory,
so `pipeline.rollout_workers: N` holds N + 1 copies), which it replaces by each publication it is
handed, verified (`weights.load_verified`). Workers generate on their sampler threads at once;
torch releases the GIL in its kernels, but on a CPU they share its cores.
Scoring uses the run's `Scorer` (its sandbox pool scores a batch's answers in parallel); with
`pipeline.scorer_workers > 1`, that many scorers, each with its own pool, share each batch.
"""

from __future__ import annotations

import copy
import dataclasses
from concurrent.futures import ThreadPoolExecutor

from tidal.pipeline.backends import Workers, split_by_task
from tidal.pipeline.loop import LoopParts, sample_episodes
from tidal.pipeline.weights import UNLOADED, Publication, check_canary, load_verified
from tidal.reward.scorer import Scorer
from tidal.rollout.engine import Cancel, EmbeddedEngine
from tidal.types import Episode, Score, Task


def rollout_engine(parts: LoopParts) -> EmbeddedEngine:
    """A second engine on a frozen copy of the trainer's model, holding no verified version yet."""
    model = copy.deepcopy(parts.engine.model).eval().requires_grad_(False)
    engine = EmbeddedEngine(model, parts.engine.tokenizer, parts.engine.device, parts.engine.max_batch_rows)
    engine.weight_version = UNLOADED
    return engine


class LocalRollout:
    """Generates on the sampler thread with its own engine; loads each new publication between
    batches, so it never generates while its weights change."""

    def __init__(self, parts: LoopParts, index: int = 0) -> None:
        self.index = index  # its slot among the run's rollout workers
        self.parts = dataclasses.replace(parts, engine=rollout_engine(parts))
        self.tolerance = parts.config.pipeline.canary_tolerance
        self.loaded: Publication | None = None  # the header of the publication the engine holds

    def sample(
        self, tasks: list[Task], step: int, publication: Publication, indices: list[int] | None = None,
        cancel: Cancel | None = None,
    ) -> list[Episode]:
        if self.parts.engine.weight_version != publication.version:
            load_verified(self.parts.engine, publication, self.tolerance)
            self.loaded = publication.header()
        return sample_episodes(self.parts, tasks, step, indices, cancel)

    def check(self) -> None:
        if self.loaded is not None and self.parts.engine.weight_version == self.loaded.version:
            check_canary(self.parts.engine, self.loaded, self.tolerance)


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

    def start(self, parts: LoopParts) -> Workers:
        pipeline = parts.config.pipeline
        rollouts = [LocalRollout(parts, i) for i in range(pipeline.rollout_workers)]
        replaced = {"rollout": 0}

        def replace(index: int) -> LocalRollout:  # a fresh copy of the policy; it loads the next publication
            rollouts[index] = LocalRollout(parts, index)
            replaced["rollout"] += 1
            return rollouts[index]

        if pipeline.scorer_workers == 1:  # the run's scorer: it closes it itself
            return Workers(rollouts, parts.scorer, restarts=lambda: dict(replaced), replace=replace)
        pool = ScorerPool([Scorer(parts.config.reward) for _ in range(pipeline.scorer_workers)])
        return Workers(rollouts, pool, close=pool.close, restarts=lambda: dict(replaced), replace=replace)


BACKEND = LocalBackend()
