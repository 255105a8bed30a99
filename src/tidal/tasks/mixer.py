"""The domain mixer: which train tasks each RL step uses.

Domain weights decide how many of a step's tasks each domain contributes. Fractions carry over
between steps as credit (a domain with weight 0.1 of 16 tasks gets 1 task most steps and 2 every
few), so the long-run share matches the weights exactly. Each domain walks a seeded permutation of
its tasks, reshuffled per epoch. The whole state is a small JSON dict saved in checkpoints, so a
resumed run continues with exactly the tasks the uninterrupted run would have used.

Tasks quarantined during the run (the continuous audit, `exclude`) are skipped from then on; the
excluded ids are part of the state.

A domain with a difficulty curriculum (`curricula[domain]`, set by the loop) admits only the tasks
whose estimated pass rate is in the curriculum's band at this step: the walk passes over the
others. When a whole pass over the domain admits nothing, the task closest to the band is taken,
so a domain is never starved by its curriculum.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from tidal.types import Task

if TYPE_CHECKING:
    from tidal.domains.curriculum import Curriculum


class TaskMixer:
    def __init__(self, tasks_by_domain: dict[str, list[Task]], weights: dict[str, float], seed: int) -> None:
        unknown = set(weights) - set(tasks_by_domain)
        if unknown:
            raise ValueError(f"weights for domains without tasks: {sorted(unknown)}")
        self.tasks = {d: ts for d, ts in sorted(tasks_by_domain.items()) if ts and weights.get(d, 0) > 0}
        if not self.tasks:
            raise ValueError("no domain has both tasks and a positive weight")
        total = sum(weights[d] for d in self.tasks)
        self.weights = {d: weights[d] / total for d in self.tasks}
        self.seed = seed
        self.credit = {d: 0.0 for d in self.tasks}
        self.epoch = {d: 0 for d in self.tasks}
        self.cursor = {d: 0 for d in self.tasks}
        self._orders: dict[str, tuple[int, list[int]]] = {}
        self.excluded: set[str] = set()
        self.curricula: dict[str, Curriculum] = {}

    def set_weights(self, weights: dict[str, float]) -> None:
        """New domain weights (adaptive domain weights); the same domains, normalised here."""
        if set(weights) != set(self.weights):
            raise ValueError(f"weights for {sorted(weights)}, the mixer has {sorted(self.weights)}")
        total = sum(weights.values())
        if total <= 0:
            raise ValueError("domain weights must not all be 0")
        self.weights = {d: weights[d] / total for d in self.tasks}

    def exclude(self, task_id: str) -> None:
        """Never sample this task again (it was quarantined)."""
        self.excluded.add(task_id)

    def _order(self, domain: str) -> list[int]:
        epoch = self.epoch[domain]
        cached = self._orders.get(domain)
        if cached is None or cached[0] != epoch:
            order = list(range(len(self.tasks[domain])))
            random.Random(f"{self.seed}:{domain}:{epoch}").shuffle(order)
            self._orders[domain] = (epoch, order)
        return self._orders[domain][1]

    def allocate(self, n: int) -> dict[str, int]:
        """How many of `n` tasks each domain gets this step (largest credit first on ties)."""
        for domain, weight in self.weights.items():
            self.credit[domain] += weight * n
        counts = {d: int(c) for d, c in self.credit.items()}
        leftover = n - sum(counts.values())
        by_remainder = sorted(self.credit, key=lambda d: (self.credit[d] - counts[d], d), reverse=True)
        for domain in by_remainder[:leftover]:
            counts[domain] += 1
        for domain, count in counts.items():
            self.credit[domain] -= count
        return counts

    def sample(self, n: int, step: int = 0) -> list[Task]:
        """The next `n` tasks, grouped by domain in a stable order. Excluded tasks are passed over;
        a domain whose every task is excluded contributes none. `step` places a curriculum's band."""
        chosen: list[Task] = []
        for domain, count in self.allocate(n).items():
            for _ in range(count):
                task = self._next(domain, step)
                if task is not None:
                    chosen.append(task)
        return chosen

    def _advance(self, domain: str) -> Task:
        tasks = self.tasks[domain]
        task = tasks[self._order(domain)[self.cursor[domain]]]
        self.cursor[domain] += 1
        if self.cursor[domain] >= len(tasks):
            self.cursor[domain] = 0
            self.epoch[domain] += 1
        return task

    def _next(self, domain: str, step: int) -> Task | None:
        """The next admitted task of `domain`: not excluded and, under a curriculum, in its band;
        after a full pass without one, the closest to the band seen (None if none is eligible)."""
        curriculum = self.curricula.get(domain)
        best: tuple[float, Task] | None = None
        for _ in range(len(self.tasks[domain])):
            task = self._advance(domain)
            if task.id in self.excluded:
                continue
            if curriculum is None or curriculum.admits(task.id, step):
                return task
            distance = curriculum.distance_to_band(task.id, step)
            if distance != float("inf") and (best is None or distance < best[0]):
                best = (distance, task)
        return None if best is None else best[1]

    def state_dict(self) -> dict[str, Any]:
        return {"credit": dict(self.credit), "epoch": dict(self.epoch), "cursor": dict(self.cursor),
                "excluded": sorted(self.excluded)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("credit", "epoch", "cursor"):
            saved = state.get(key, {})
            if set(saved) != set(self.tasks):
                raise ValueError(f"mixer state is for domains {sorted(saved)}, this run has {sorted(self.tasks)}")
        self.credit = {d: float(v) for d, v in state["credit"].items()}
        self.epoch = {d: int(v) for d, v in state["epoch"].items()}
        self.cursor = {d: int(v) for d, v in state["cursor"].items()}
        self.excluded = {str(task_id) for task_id in state.get("excluded", [])}
