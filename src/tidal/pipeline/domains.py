"""What the RL loop keeps per domain across steps: reward composition, normalisation,
the difficulty curriculum, dynamic sampling, replay against forgetting, and the regression alarm.

The loop calls, each step, in order:
1. `tasks_to_draw()`: how many tasks to draw (more than `tasks_per_step` under dynamic sampling);
   the mixer consults the curricula (`admits`) while drawing them;
2. `compose(...)` after the task verifiers scored: the domains' extra sub-rewards
   (`domains.<d>.verifiers`) are scored and summed with their weights into `episode.reward`,
   and the soft overlong penalty (`reward.overlong_buffer`) is taken off long answers;
3. the gate (zero variance is judged on the composed reward);
4. `observe(...)`: curriculum posteriors, suspects handed to the auditor, the zero-variance rate;
5. `trim(...)`: under dynamic sampling, train on at most `tasks_per_step` groups with signal;
6. `normalise(...)`: each domain's normaliser rewrites `episode.reward` before the advantages;
7. `replay_batch(...)`: supervised sequences mixed into the update (`algorithm.replay_weight`).
All of its state is plain JSON (`state_dict`), saved in every RL checkpoint, so a resumed run
continues with the same normaliser statistics, posteriors, rate and replay buffer.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

from tidal.algos.advantages import has_valid_reward
from tidal.config.schema import TidalConfig
from tidal.domains import (
    AdaptiveDomainWeights,
    Curriculum,
    RewardNormaliser,
    WeightChange,
    oversample_factor,
)
from tidal.errors import CheckpointError
from tidal.pipeline.warmstart import pad_batch
from tidal.reward.protocol import ScoringWorker
from tidal.tasks.mixer import TaskMixer
from tidal.trainer.trainer import ReplayBatch
from tidal.types import Episode, Group, Outcome, Task, VerifierSpec, flatten

logger = logging.getLogger(__name__)

STATE_VERSION = 1
ZERO_VARIANCE_MOMENTUM = 0.7  # weight of the running no-signal rate's past in each update
SUB_REWARD_PREFIX = "reward/"  # score.components keys of the composed sub-rewards

Example = tuple[list[int], list[int]]  # (prompt ids, answer ids): one supervised sequence


def pad_examples(examples: list[Example], pad_id: int) -> ReplayBatch:
    """Right-padded supervised sequences; the loss covers the answer tokens only."""
    input_ids, attention_mask, loss_mask = pad_batch(examples, pad_id, prompt_weight=0.0)
    return ReplayBatch(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)


class DomainRuntime:
    """Per-domain training state of one run. `base_examples` are the supervised sequences of
    `replay.source: base` (the warm start's references, or the train tasks' references)."""

    def __init__(
        self, cfg: TidalConfig, mixer: TaskMixer, base_examples: list[Example] | None = None,
        auditor: Callable[[str], str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.mixer = mixer
        self.auditor = auditor  # task id -> "broken" | "hard": judges the curricula's suspects
        domains = cfg.tasks.domains
        self.normaliser = RewardNormaliser({name: d.normaliser for name, d in domains.items()})
        self.curricula = {
            name: Curriculum(d.curriculum, seed=cfg.run.seed) for name, d in domains.items() if d.curriculum is not None
        }
        mixer.curricula = self.curricula
        # Config domains have free names; a task's own `domain` is one of a fixed few. The mixer
        # knows which config domain each train task came from.
        self.domain_of = {task.id: name for name, tasks in mixer.tasks.items() for task in tasks}
        # Held while the curricula, the replay buffer or the draw count change; the async loop
        # replaces it with its mixer lock, since the mixer reads the curricula while it samples.
        self.lock = threading.Lock()
        self.zero_variance_rate = 0.0
        self.suspects_audited: dict[str, str] = {}  # task id -> verdict
        self.replay = cfg.replay
        self.base_examples = list(base_examples or [])
        self.buffer: deque[Example] = deque(maxlen=cfg.replay.buffer_size)
        self._replay_draws = 0  # each draw seeds its own RNG with (run seed, draw): the state is this count
        self.adaptive = AdaptiveDomainWeights(dict(mixer.weights), cfg.tasks.adaptive_weights)
        self.alarms: list[dict[str, Any]] = []
        if self.replay.source == "base" and not self.base_examples:
            raise ValueError("replay.source is 'base' but there are no base examples (train tasks with a reference)")

    def domain(self, episode: Episode) -> str:
        """The config domain an episode's task was drawn from."""
        return self.domain_of.get(episode.task_id, episode.domain)

    # ------------------------------------------------------------------------------- sampling

    def tasks_to_draw(self) -> int:
        """Tasks to draw this step: tasks_per_step, times the dynamic-sampling factor."""
        per_step = self.cfg.tasks.tasks_per_step
        if self.cfg.tasks.oversample <= 1:
            return per_step
        return math.ceil(per_step * oversample_factor(self.zero_variance_rate, self.cfg.tasks.oversample))

    # ------------------------------------------------------------------------------- rewards

    def compose(self, scorer: ScoringWorker, groups: list[Group]) -> None:
        """Score the extra sub-rewards of domains that declare `verifiers` and set `episode.reward`
        to their weighted sum (the task verifier's value under the name `task`). The sub-rewards
        are kept in `score.components` as `reward/<name>`. An extra verifier's infra error leaves
        the episode without a valid reward: it is marked so and dropped by the gate's rule."""
        jobs: list[tuple[int, str]] = []
        items: list[tuple[Task, str | bytes]] = []
        episodes = flatten(groups)
        tasks = [group.task for group in groups for _ in group.episodes]
        for index, (episode, task) in enumerate(zip(episodes, tasks)):
            domain = self.domain(episode)
            verifiers = self.cfg.tasks.domains[domain].verifiers if domain in self.cfg.tasks.domains else []
            if not verifiers or episode.score is None or not has_valid_reward(episode):
                continue
            for spec in verifiers:
                if spec.name == "task":
                    continue
                variant = task.model_copy(update={"verifier": VerifierSpec(name=spec.name, **spec.args)})
                jobs.append((index, spec.name))
                items.append((variant, episode.completion.text))
        extra: dict[int, dict[str, Any]] = defaultdict(dict)
        for (index, name), score in zip(jobs, scorer.score_many(items) if items else []):
            extra[index][name] = score
        self._compose_extra(episodes, extra)
        self._penalise_overlong(episodes)

    def _compose_extra(self, episodes: list[Episode], extra: dict[int, dict[str, Any]]) -> None:
        for index, scores in extra.items():
            episode = episodes[index]
            assert episode.score is not None
            weights = {v.name: v.weight for v in self.cfg.tasks.domains[self.domain(episode)].verifiers}
            values = {"task": float(episode.score.value)}
            for name, score in scores.items():
                if score.outcome is Outcome.INFRA_ERROR:
                    episode.reward = math.nan
                    episode.score.info["sub_reward_error"] = f"{name}: {score.detail}"[:500]
                    break
                values[name] = float(score.value)
            else:
                episode.reward = sum(weights[name] * value for name, value in values.items())
            for name, value in values.items():
                episode.score.components[f"{SUB_REWARD_PREFIX}{name}"] = value

    def _penalise_overlong(self, episodes: list[Episode]) -> None:
        """DAPO's soft overlong punishment (`reward.overlong_buffer`): a single-turn answer longer
        than max_new_tokens - buffer loses reward linearly with its excess length, up to
        `overlong_penalty` at the cap; kept in `score.components` as `reward/overlong`."""
        buffer, cap = self.cfg.reward.overlong_buffer, self.cfg.rollout.max_new_tokens
        if buffer <= 0:
            return
        for episode in episodes:
            completion = episode.completion
            if episode.score is None or not has_valid_reward(episode) or completion.loss_mask is not None:
                continue
            excess = len(completion.token_ids) - (cap - buffer)
            if excess <= 0:
                continue
            penalty = -self.cfg.reward.overlong_penalty * min(1.0, excess / buffer)
            base = episode.reward if episode.reward is not None else float(episode.score.value)
            episode.reward = base + penalty
            episode.score.components[f"{SUB_REWARD_PREFIX}overlong"] = penalty

    def normalise(self, episodes: list[Episode]) -> None:
        """Rewrite `episode.reward` with each domain's normaliser (statistics over every episode
        with a valid reward, kept or not). A NaN result leaves the episode without a reward."""
        by_domain: dict[str, list[Episode]] = defaultdict(list)
        for episode in episodes:
            if has_valid_reward(episode) and self.domain(episode) in self.cfg.tasks.domains:
                by_domain[self.domain(episode)].append(episode)
        for domain, members in by_domain.items():
            config = self.cfg.tasks.domains[domain]
            rewards = [float(e.reward) if e.reward is not None else float(e.score.value) for e in members]  # type: ignore[union-attr]
            components = weights = None
            if config.normaliser.kind == "per_reward":
                weights = {v.name: v.weight for v in config.verifiers}
                components = [
                    {k[len(SUB_REWARD_PREFIX):]: v for k, v in e.score.components.items() if k.startswith(SUB_REWARD_PREFIX)}  # type: ignore[union-attr]
                    for e in members
                ]
            if config.normaliser.kind == "none":
                continue
            for episode, value in zip(members, self.normaliser.normalise(domain, rewards, components, weights)):
                episode.reward = value

    # ------------------------------------------------------------------------------- curriculum

    def observe(self, groups: list[Group], step: int) -> list[tuple[str, str]]:
        """Update the curricula with each group's task-verifier values and the zero-variance rate;
        hand new suspects (never solved) to the runtime's `auditor(task_id) -> "broken" | "hard"`
        (no auditor: "hard"). Returns the (task id, verdict) pairs decided now; a broken task is
        excluded from sampling."""
        groups = [group for group in groups if group.episodes]
        # Groups the gate left nothing to train on (zero variance, or every sample dropped).
        zero = sum(not group.kept for group in groups)
        if groups:
            rate = zero / len(groups)
            self.zero_variance_rate = ZERO_VARIANCE_MOMENTUM * self.zero_variance_rate + (1 - ZERO_VARIANCE_MOMENTUM) * rate
        with self.lock:
            return self._observe_groups(groups, step)

    def _observe_groups(self, groups: list[Group], step: int) -> list[tuple[str, str]]:
        decided: list[tuple[str, str]] = []
        for group in groups:
            curriculum = self.curricula.get(self.domain(group.episodes[0]))
            if curriculum is None:
                continue
            values = [float(e.score.value) for e in group.episodes if has_valid_reward(e)]  # type: ignore[union-attr]
            if values:
                curriculum.observe(group.task.id, values)
        for domain, curriculum in self.curricula.items():
            for suspect in curriculum.suspects():
                verdict = self.auditor(suspect.task_id) if self.auditor is not None else "hard"
                curriculum.clear_suspect(suspect.task_id, verdict)
                self.suspects_audited[suspect.task_id] = verdict
                decided.append((suspect.task_id, verdict))
                if verdict == "broken":
                    self.mixer.exclude(suspect.task_id)
                logger.info("curriculum: task %s (%s) never solved in %d rollouts; auditor verdict: %s",
                            suspect.task_id, domain, suspect.rollouts, verdict)
        return decided

    def trim(self, groups: list[Group]) -> int:
        """Dynamic sampling: keep the first `tasks_per_step` groups that still have kept samples;
        the samples of later groups are dropped as `surplus`. Returns the number dropped."""
        if self.cfg.tasks.oversample <= 1:
            return 0
        with_signal = 0
        dropped = 0
        for group in groups:
            kept = group.kept
            if not kept:
                continue
            with_signal += 1
            if with_signal > self.cfg.tasks.tasks_per_step:
                for episode in kept:
                    episode.keep, episode.drop_reason = False, "surplus"
                dropped += len(kept)
        return dropped

    # ------------------------------------------------------------------------------- replay

    def remember(self, episodes: list[Episode]) -> None:
        """Keep the kept high-reward trajectories for `replay.source: trajectories`."""
        if self.replay.source != "trajectories":
            return
        with self.lock:
            self._remember(episodes)

    def _remember(self, episodes: list[Episode]) -> None:
        for episode in episodes:
            score = episode.score
            if score is None or not has_valid_reward(episode) or score.value < self.replay.min_reward:
                continue
            if episode.completion.finish_reason != "stop":
                continue
            self.buffer.append((list(episode.completion.prompt_ids), list(episode.completion.token_ids)))

    def replay_batch(self, pad_id: int) -> ReplayBatch | None:
        """`replay.batch_size` supervised sequences drawn from the replay source, or None."""
        if self.replay.source == "none" or self.cfg.algorithm.replay_weight <= 0:
            return None
        with self.lock:
            pool = self.base_examples if self.replay.source == "base" else list(self.buffer)
            if not pool:
                return None
            rng = random.Random(f"replay:{self.cfg.run.seed}:{self._replay_draws}")
            self._replay_draws += 1
            chosen = [pool[rng.randrange(len(pool))] for _ in range(self.replay.batch_size)]
        return pad_examples(chosen, pad_id)

    # ------------------------------------------------------------------------------- held-out

    def heldout(self, step: int, rates: dict[str, float], before: dict[str, float]) -> tuple[list[dict[str, Any]], list[WeightChange]]:
        """After a per-domain held-out evaluation at `step`: the regression alarms (a domain more
        than `eval.regression_alarm` below its pre-RL pass rate) and, when adaptive weights are
        on, the weight changes, which the mixer takes at once. Returns (alarms, changes)."""
        alarms = []
        for domain, rate in sorted(rates.items()):
            if domain in before and before[domain] - rate > self.cfg.eval.regression_alarm:
                alarm = {"step": step, "domain": domain, "before_rl": before[domain], "now": rate,
                         "drop": before[domain] - rate, "threshold": self.cfg.eval.regression_alarm}
                logger.warning("regression alarm at step %d: domain %s held-out %.3f, %.3f before RL (drop %.3f > %.3f)",
                               step, domain, rate, before[domain], alarm["drop"], alarm["threshold"])
                alarms.append(alarm)
        self.alarms += alarms
        changes: list[WeightChange] = []
        if self.cfg.tasks.adaptive_weights.enabled:
            changes = self.adaptive.update(step, {d: r for d, r in rates.items() if d in self.mixer.weights})
            if changes:
                self.mixer.set_weights(self.adaptive.weights)
        return alarms, changes

    # ------------------------------------------------------------------------------- state

    def metrics(self, step: int) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.cfg.tasks.oversample > 1:
            out["dynamic/zero_variance_rate"] = self.zero_variance_rate
        for domain, curriculum in self.curricula.items():
            out.update({f"{k.replace('curriculum/', f'curriculum/{domain}/')}": v for k, v in curriculum.metrics(step).items()})
        if any(d.normaliser.kind != "none" for d in self.cfg.tasks.domains.values()):
            out.update(self.normaliser.stats())
        if self.replay.source == "trajectories":
            out["replay/buffer"] = float(len(self.buffer))
        if self.cfg.tasks.adaptive_weights.enabled:
            out.update({f"weight/{d}": w for d, w in self.mixer.weights.items()})
        if self.suspects_audited:
            verdicts = list(self.suspects_audited.values())
            out["curriculum/suspects_broken"] = float(verdicts.count("broken"))
            out["curriculum/suspects_hard"] = float(verdicts.count("hard"))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "normaliser": self.normaliser.state_dict(),
            "curricula": {d: c.state_dict() for d, c in self.curricula.items()},
            "zero_variance_rate": self.zero_variance_rate,
            "suspects_audited": dict(self.suspects_audited),
            "buffer": [[p, a] for p, a in self.buffer],
            "replay_draws": self._replay_draws,
            "adaptive": self.adaptive.state_dict(),
            "weights": dict(self.mixer.weights),
            "alarms": list(self.alarms),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise CheckpointError(f"domain state version {state.get('version')!r}; this tidal writes {STATE_VERSION}")
        self.normaliser.load_state_dict(state["normaliser"])
        if set(state["curricula"]) != set(self.curricula):
            raise CheckpointError(f"checkpoint has curricula for {sorted(state['curricula'])}, the config for {sorted(self.curricula)}")
        for domain, saved in state["curricula"].items():
            self.curricula[domain].load_state_dict(saved)
        self.zero_variance_rate = float(state["zero_variance_rate"])
        self.suspects_audited = dict(state["suspects_audited"])
        self.buffer.clear()
        self.buffer.extend((list(p), list(a)) for p, a in state["buffer"])
        self._replay_draws = int(state["replay_draws"])
        self.adaptive.load_state_dict(state["adaptive"])
        self.mixer.set_weights(dict(state["weights"]))
        self.alarms = list(state["alarms"])


def make_suspect_auditor(cfg: TidalConfig, tasks: dict[str, Task]) -> Callable[[str], str]:
    """The auditor a curriculum hands its suspects (tasks never solved) to: the audit's schema,
    reference and limits checks in the run's sandbox. A task whose checks quarantine it (e.g. its
    reference fails its own tests) is "broken"; otherwise it is merely "hard"."""
    from tidal.audit.checks import select_checks
    from tidal.audit.context import AuditContext
    from tidal.audit.records import TaskAudit
    from tidal.audit.runner import run_checks

    checks = select_checks(["schema", "no_reference", "reference", "limits"])
    ctx = AuditContext(cfg.audit, backend=cfg.reward.sandbox.backend)

    def audit(task_id: str) -> str:
        task = tasks[task_id]
        result = run_checks(task, TaskAudit(task_id, "curriculum suspect", task.split, task.domain), checks, ctx)
        ctx.forget(task_id)
        verdict = "broken" if result.verdict == "quarantine" else "hard"
        if verdict == "broken":
            logger.warning("curriculum suspect %s is broken: %s", task_id, "; ".join(result.reasons()))
        return verdict

    return audit
