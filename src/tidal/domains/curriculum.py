"""A difficulty curriculum: which train tasks are worth sampling at this point of the run.

Each task's pass rate has a Beta posterior, updated live from every scored group (`observe`); a
rollout is a success when its reward reaches `success_threshold`. Counting outcomes rather than
adding fractional reward keeps "never solved" and "always solved" exact, which the suspect and
retirement rules need. A task is admitted when its posterior mean lies in the target band, which
moves linearly from `band_start` to `band_end` over `schedule_steps` (easier tasks first). Apart
from the band: unknown tasks are admitted until measured; a task never solved in `suspect_after`
rollouts is a suspect (maybe broken) for the auditor until `clear_suspect` records "broken"
(excluded) or "hard" (retried with `hard_retry_prob` while outside the band); an always-solved
task retires. `set_prior` turns an external difficulty estimate into the prior.

The mixer uses `admits` as a filter and, when a whole pass admits nothing, takes the task with the
smallest finite `distance_to_band`. The only randomness is a hash of (seed, task id, draw
counter), so the whole state is plain JSON. docs/design/domains.md, "The curriculum", has the rules.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

Rate = Annotated[float, Field(ge=0, le=1)]
Verdict = Literal["broken", "hard"]
# active -> suspect (never solved) -> broken | hard (the auditor's verdict); active | hard -> retired
Status = Literal["active", "suspect", "hard", "broken", "retired"]
STATUSES: tuple[Status, ...] = get_args(Status)
STATE_VERSION = 1


class CurriculumConfig(BaseModel):
    """The curriculum's prior, target band schedule and suspect/retirement rules."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    alpha0: float = Field(1.0, gt=0, le=1e6, description="Beta prior pseudo-successes of every task")
    beta0: float = Field(1.0, gt=0, le=1e6, description="Beta prior pseudo-failures of every task")
    success_threshold: float = Field(
        1.0, gt=0, le=1, description="a rollout whose reward is at least this counts as a success"
    )
    band_start: tuple[Rate, Rate] = Field(
        (0.3, 0.9), description="[low, high] pass-rate band admitted at step 0 (easier first)"
    )
    band_end: tuple[Rate, Rate] = Field(
        (0.1, 0.7), description="[low, high] pass-rate band admitted from step `schedule_steps` on"
    )
    schedule_steps: int = Field(
        1000, ge=0, le=100_000_000, description="steps over which the band moves from band_start to band_end"
    )
    min_observations: int = Field(
        8, ge=0, le=1_000_000, description="rollouts below which a task is always admitted (exploration)"
    )
    suspect_after: int = Field(
        32, ge=1, le=1_000_000, description="rollouts with no success after which a task is a suspect for the auditor"
    )
    retire_after: int = Field(
        32, ge=1, le=1_000_000, description="rollouts, all successes, after which a task retires"
    )
    retire_above: float = Field(
        1.0, gt=0, le=1, description="posterior mean at which an observed task retires (1.0: never by the mean)"
    )
    hard_retry_prob: float = Field(
        0.05, ge=0, le=1, description="chance per draw that a task judged 'hard' is admitted outside the band"
    )

    @model_validator(mode="after")
    def _bands_ordered(self) -> CurriculumConfig:
        problems = [f"{name}: low {band[0]} is above high {band[1]}; write [low, high]"
                    for name, band in (("band_start", self.band_start), ("band_end", self.band_end))
                    if band[0] > band[1]]
        if problems:
            raise ValueError("; ".join(problems))
        return self


@dataclass(frozen=True)
class SuspectTask:
    """A task that was never solved in `rollouts` tries: for the auditor to call broken or hard."""

    task_id: str
    rollouts: int
    estimate: float  # posterior mean pass rate


@dataclass
class _TaskRecord:
    """One task's prior, observed counts and status."""

    prior_alpha: float
    prior_beta: float
    rollouts: int = 0
    successes: int = 0
    status: Status = "active"

    def mean(self) -> float:
        alpha = self.prior_alpha + self.successes
        beta = self.prior_beta + self.rollouts - self.successes
        return alpha / (alpha + beta)


def oversample_factor(zero_variance_rate: float, max_factor: float) -> float:
    """How many groups to generate per group wanted under DAPO dynamic sampling.

    Groups whose rewards are all equal give no advantage and are dropped; if a share
    `zero_variance_rate` of groups is dropped, wanted / (1 - rate) groups leave `wanted` on
    average. The factor is capped at `max_factor` (a rate of 1 would need infinitely many).
    """
    if not 0.0 <= zero_variance_rate <= 1.0:
        raise ValueError(f"zero_variance_rate must be in [0, 1], got {zero_variance_rate}")
    if not max_factor >= 1.0:
        raise ValueError(f"max_factor must be at least 1, got {max_factor}")
    if zero_variance_rate >= 1.0:
        return max_factor
    return min(1.0 / (1.0 - zero_variance_rate), max_factor)


class Curriculum:
    """Per-task pass-rate posteriors and the admission rule built on them (see the module doc)."""

    def __init__(self, config: CurriculumConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = seed
        self._tasks: dict[str, _TaskRecord] = {}  # in the order tasks were first seen
        self._draws = 0  # the hard-retry random stream's position

    # -- observations -------------------------------------------------------------------------

    def _lookup(self, task_id: str) -> _TaskRecord:
        """The task's record, or a fresh one (not stored) for a task never seen."""
        return self._tasks.get(task_id) or _TaskRecord(self.config.alpha0, self.config.beta0)

    def _record(self, task_id: str) -> _TaskRecord:
        """The task's record, stored on first use."""
        return self._tasks.setdefault(task_id, self._lookup(task_id))

    def set_prior(self, task_id: str, pass_rate: float, strength: float) -> None:
        """Start `task_id` from an external pass-rate estimate worth `strength` rollouts (added to
        the config prior, so a pass rate of 0 or 1 is still a proper prior). Observed counts are
        kept; `min_observations` still counts real rollouts only."""
        if not 0.0 <= pass_rate <= 1.0:
            raise ValueError(f"task {task_id}: prior pass_rate must be in [0, 1], got {pass_rate}")
        if not 0.0 <= strength < math.inf:
            raise ValueError(f"task {task_id}: prior strength must be finite and >= 0, got {strength}")
        record = self._record(task_id)
        record.prior_alpha = self.config.alpha0 + pass_rate * strength
        record.prior_beta = self.config.beta0 + (1.0 - pass_rate) * strength

    def observe(self, task_id: str, rewards: Sequence[float]) -> None:
        """Add one scored group of `task_id` (rewards of valid rollouts only: an infra error is no
        evidence about the task) and apply the suspect and retirement rules."""
        bad = [r for r in rewards if not math.isfinite(r)]
        if bad:
            raise ValueError(f"task {task_id}: rewards must be finite numbers, got {bad}")
        if not rewards:
            return
        record = self._record(task_id)
        record.rollouts += len(rewards)
        record.successes += sum(r >= self.config.success_threshold for r in rewards)
        config = self.config
        if record.status == "active" and record.successes == 0 and record.rollouts >= config.suspect_after:
            record.status = "suspect"
        all_solved = record.successes == record.rollouts
        if record.status in ("active", "hard") and (
                (all_solved and record.rollouts >= config.retire_after)
                or (record.rollouts >= config.min_observations and record.mean() >= config.retire_above)):
            record.status = "retired"

    def clear_suspect(self, task_id: str, verdict: Verdict) -> None:
        """Record the auditor's verdict on a suspect: "broken" (excluded for good) or "hard"
        (back to the band rule, with the occasional retry while outside it)."""
        if verdict not in ("broken", "hard"):
            raise ValueError(f"task {task_id}: verdict must be 'broken' or 'hard', got {verdict!r}")
        record = self._lookup(task_id)
        if record.status != "suspect":
            raise ValueError(f"task {task_id} is not a suspect ({record.status}); "
                             "record a verdict only for a task `suspects()` returned")
        record.status = verdict

    # -- decisions ----------------------------------------------------------------------------

    def estimate(self, task_id: str) -> float:
        """Posterior mean pass rate (the prior mean for a task never observed)."""
        return self._lookup(task_id).mean()

    def rollouts(self, task_id: str) -> int:
        """Rollouts of `task_id` observed so far."""
        return self._lookup(task_id).rollouts

    def band(self, step: int) -> tuple[float, float]:
        """The [low, high] pass-rate band at `step`: linear from band_start to band_end."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        config = self.config
        progress = 1.0 if config.schedule_steps == 0 else min(step / config.schedule_steps, 1.0)
        (low0, high0), (low1, high1) = config.band_start, config.band_end
        return low0 + progress * (low1 - low0), high0 + progress * (high1 - high0)

    def _with_status(self, status: Status) -> list[str]:
        return [t for t, r in self._tasks.items() if r.status == status]

    def distance_to_band(self, task_id: str, step: int) -> float:
        """How far the task's estimate lies outside the band at `step`: 0 inside it or while the
        task is still explored, infinity for a task never to be sampled (broken, retired, suspect).
        The mixer's fallback takes the task with the smallest finite distance."""
        low, high = self.band(step)
        record = self._lookup(task_id)
        if record.status in ("suspect", "broken", "retired"):
            return math.inf
        if record.rollouts < self.config.min_observations:
            return 0.0
        if record.status == "active" and record.successes == 0 and record.rollouts < self.config.suspect_after:
            return 0.0  # measured until it is solved or becomes a suspect
        mean = record.mean()
        return max(low - mean, mean - high, 0.0)

    def _in_band(self, task_id: str, step: int) -> bool:
        return self.distance_to_band(task_id, step) == 0.0

    def _uniform(self, task_id: str) -> float:
        """The next number in [0, 1) of the retry stream, from (seed, task, draw counter)."""
        digest = hashlib.blake2b(f"{self.seed}:{task_id}:{self._draws}".encode(), digest_size=8).digest()
        self._draws += 1
        return int.from_bytes(digest, "big") / 2.0**64

    def admits(self, task_id: str, step: int) -> bool:
        """Whether `task_id` may be sampled at `step`. A 'hard' task outside the band consumes one
        draw of the seeded retry stream, so call this in a deterministic order."""
        if self._in_band(task_id, step):
            return True
        if self._lookup(task_id).status == "hard":
            return self._uniform(task_id) < self.config.hard_retry_prob
        return False

    def suspects(self) -> list[SuspectTask]:
        """Tasks never solved in `suspect_after` rollouts, awaiting the auditor's verdict."""
        return [SuspectTask(t, self.rollouts(t), self.estimate(t)) for t in self._with_status("suspect")]

    def retired(self) -> list[str]:
        """Tasks retired as solved."""
        return self._with_status("retired")

    def broken(self) -> list[str]:
        """Suspects the auditor judged broken, excluded for good (the caller may also quarantine)."""
        return self._with_status("broken")

    def metrics(self, step: int) -> dict[str, float]:
        """The band and task counts at `step`, for the run's metrics. Consumes no random draws:
        `admitted_share` counts hard tasks outside the band as not admitted."""
        low, high = self.band(step)
        observed = [t for t, r in self._tasks.items() if r.rollouts > 0]
        admitted = sum(self._in_band(t, step) for t in observed)
        exploring = sum(self._tasks[t].rollouts < self.config.min_observations
                        and self._tasks[t].status in ("active", "hard") for t in observed)
        counts = {status: 0 for status in ("suspect", "hard", "broken", "retired")}
        for record in self._tasks.values():
            if record.status in counts:
                counts[record.status] += 1
        return {
            "curriculum/band_low": low,
            "curriculum/band_high": high,
            "curriculum/observed": float(len(observed)),
            "curriculum/admitted_share": admitted / len(observed) if observed else 1.0,
            "curriculum/exploring": float(exploring),
            "curriculum/suspects": float(counts["suspect"]),
            "curriculum/hard": float(counts["hard"]),
            "curriculum/broken": float(counts["broken"]),
            "curriculum/retired": float(counts["retired"]),
        }

    # -- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The whole state as plain JSON (for checkpoints)."""
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "draws": self._draws,
            "tasks": {t: {"prior_alpha": r.prior_alpha, "prior_beta": r.prior_beta,
                          "rollouts": r.rollouts, "successes": r.successes, "status": r.status}
                      for t, r in self._tasks.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`. The config may differ (e.g. a longer schedule); the seed may not,
        since the retry stream would then diverge from the saved run."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"curriculum state version {state.get('version')!r}; this tidal reads {STATE_VERSION}")
        if int(state["seed"]) != self.seed:
            raise ValueError(f"curriculum state was saved with seed {state['seed']}, this run has seed "
                             f"{self.seed}; resume with the run's original seed")
        tasks: dict[str, _TaskRecord] = {}
        for task_id, saved in state["tasks"].items():
            if saved["status"] not in STATUSES:
                raise ValueError(f"curriculum state: task {task_id} has unknown status {saved['status']!r}; "
                                 f"known: {', '.join(STATUSES)}")
            tasks[str(task_id)] = _TaskRecord(float(saved["prior_alpha"]), float(saved["prior_beta"]),
                                              int(saved["rollouts"]), int(saved["successes"]), saved["status"])
        self._tasks = tasks
        self._draws = int(state["draws"])
