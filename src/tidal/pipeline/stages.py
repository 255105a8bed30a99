"""The stages of one RL step before the update: sample -> score -> gate (with the watch, the
curricula, dynamic sampling, normalisation and advantages). Both ways of producing batches
(pipeline/sources.py: in the trainer's thread, or ahead of it on threads and workers) call these
same functions, so a batch is the same wherever it was made. A step's batch travels as typed
`Group`s (the task, its completions, their rewards) from sampling to the update.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidal.algos import assign_advantages
from tidal.audit.continuous import TaskWatch
from tidal.config.schema import TidalConfig
from tidal.errors import PreemptedError
from tidal.gate import gate_episodes
from tidal.gate.judge_hack import MODEL_VERIFIERS
from tidal.models.io import render_prompt
from tidal.pipeline.agent_rollout import sample_agent_groups
from tidal.pipeline.domains import DomainRuntime
from tidal.pipeline.weights import publish_to_engine
from tidal.reward.agreement import agreement_metrics
from tidal.reward.protocol import ScoringWorker
from tidal.rollout.engine import Cancel, SamplingParams
from tidal.rollout.protocol import RolloutEngine
from tidal.storage.run import RunFolder
from tidal.storage.store import TrajectoryStore
from tidal.tasks.mixer import TaskMixer
from tidal.trainer.parallel.trainer import ParallelTrainer
from tidal.trainer.trainer import Trainer
from tidal.types import (
    Completion,
    Episode,
    Group,
    Outcome,
    Task,
    flatten,
    is_multi_turn,
)


@dataclass
class LoopParts:
    """What the loop runs on, built by `pipeline/run.py`; every part is always there (the
    continuous audit's `watch` does nothing when `audit.watch.enabled` is off)."""

    config: TidalConfig
    run: RunFolder
    engine: RolloutEngine  # the trainer-shared engine: held-out evaluation, and sampling in-thread
    trainer: Trainer | ParallelTrainer  # one process, or rank 0 of the trainer ranks
    scorer: ScoringWorker
    mixer: TaskMixer
    domains: DomainRuntime  # per-domain composition, normalisation, curriculum, replay
    watch: TaskWatch  # the continuous audit: quarantines tasks from the gate's signals
    pad_id: int
    # Whether `engine` holds its own copy of the policy (an HTTP server) rather than sampling with
    # the trainer's model: then each version is published to it and verified (`sync_engine`).
    engine_holds_copy: bool = False

    def sync_engine(self, version: int) -> None:
        """Bring `engine` to the trainer's weights after `version` updates: a version bump when it
        samples with the trainer's model; else a publication loaded into it and verified
        (checksum where it was loaded, canary logprobs from the engine), `WeightVerificationError`
        when it does not hold what the trainer has."""
        if not self.engine_holds_copy:
            self.engine.update_weights(None, version=version)
            return
        publish_to_engine(self.engine, self.trainer.model, version, self.config.pipeline.canary_tolerance)

    def draw_tasks(self, step: int) -> list[Task]:
        """Batch `step`'s tasks from the mixer (more than `tasks_per_step` under dynamic sampling)."""
        return self.mixer.sample(self.domains.tasks_to_draw(), step)


@dataclass
class ScoredBatch:
    """One step's scored and gated groups, as the update takes them. `state` is what a checkpoint
    right after this step's update holds of the mixer, watch and domains (None: their current
    state, when nothing ran ahead of the trainer)."""

    step: int
    groups: list[Group]
    drops: dict[str, int]
    timings: dict[str, float]
    metrics: dict[str, Any] = field(default_factory=dict)  # the watch's and the domains' after the gate
    state: dict[str, Any] | None = None
    worker: int = 0  # the rollout worker that generated it

    @property
    def kept(self) -> list[Episode]:
        return [e for group in self.groups for e in group.kept]


def plan_chunks(tasks: list[Task], batch_prompts: int, priority: Callable[[Task], int] | None = None) -> list[list[int]]:
    """How one step's tasks are generated: positions in `tasks`, one list per engine batch. The
    single-turn tasks go `batch_prompts` at a time (highest `priority` first, else in order), the
    multi-turn (agent) tasks all in one last chunk (their episodes share engine calls). A chunk is
    what one rollout worker generates by itself; its result does not depend on the other chunks."""
    single = [i for i, task in enumerate(tasks) if not is_multi_turn(task)]
    if priority is not None:
        single.sort(key=lambda i: -priority(tasks[i]))  # stable: in order within one priority
    chunks = [single[start : start + batch_prompts] for start in range(0, len(single), batch_prompts)]
    multi = [i for i, task in enumerate(tasks) if is_multi_turn(task)]
    return chunks + ([multi] if multi else [])


def domain_priority(config: TidalConfig) -> Callable[[Task], int]:
    """A task's scheduling priority: its domain's `priority` in `tasks.domains` (0 if not named there)."""
    priorities = {name: d.priority for name, d in config.tasks.domains.items()}
    return lambda task: priorities.get(task.domain, 0)


@dataclass
class Sampler:
    """Generates a step's groups with one engine: what a rollout worker, local or remote, runs."""

    config: TidalConfig
    run_name: str
    engine: RolloutEngine

    def group_id(self, step: int, position: int) -> str:
        return f"{self.run_name}/step-{step:06d}/g{position:03d}"

    def sample(
        self, tasks: list[Task], step: int, positions: list[int] | None = None, cancel: Cancel | None = None,
        kept: dict[tuple[str, ...], Any] | None = None,
    ) -> list[Group]:
        """`group_size` completions for each task, one `Group` per task in task order, in the
        chunks of `plan_chunks` (one engine call per chunk of single-turn tasks, each prompt
        prefilled once per group; agent tasks: pipeline/agent_rollout.py). `positions` are the
        tasks' places in the step's batch (default 0, 1, ...): a worker given one chunk of a batch
        makes exactly the groups the whole batch would have for those tasks. Once `cancel` is set,
        generation stops at its next decode step (an agent episode: its next turn) and
        `PreemptedError` is raised. `kept` (a dict the caller keeps across tries of the same tasks)
        then holds what was done: the engine calls that finished, and the preempted one's requests
        (`PreemptedError.handles`: finished groups, and unfinished samples with their tokens), which
        the next try resumes rather than restarts (`EmbeddedEngine.resume`: with the same weights it
        gives the same completions). Agent episodes are redone."""
        cfg = self.config
        positions = list(range(len(tasks))) if positions is None else list(positions)
        if len(positions) != len(tasks):
            raise ValueError(f"Sampler.sample: {len(tasks)} tasks but {len(positions)} positions")
        params = SamplingParams(
            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, max_new_tokens=cfg.rollout.max_new_tokens,
            stop=list(cfg.rollout.stop), seed=cfg.run.seed * 1_000_003 + step,
        )
        by_index: dict[int, list[Episode]] = {}
        for chunk in plan_chunks(tasks, cfg.rollout.batch_prompts, domain_priority(cfg)):
            if is_multi_turn(tasks[chunk[0]]):  # the agent chunk: every multi-turn task, nothing else
                ids = [self.group_id(step, positions[i]) for i in chunk]
                episodes = sample_agent_groups(self.engine, cfg, [tasks[i] for i in chunk], ids, step, cancel)
                by_index.update(zip(chunk, episodes))
                continue
            prompts = [render_prompt(self.engine.tokenizer, tasks[i].messages()) for i in chunk]
            for i, completions in zip(chunk, self._generate(prompts, params, cancel, kept,
                                                            tuple(self.group_id(step, positions[i]) for i in chunk))):
                group_id = self.group_id(step, positions[i])
                by_index[i] = [
                    Episode(id=f"{group_id}/s{k:02d}", task_id=tasks[i].id, domain=tasks[i].domain, group_id=group_id,
                            completion=completion)
                    for k, completion in enumerate(completions)
                ]
        groups = [Group(task, position, by_index[i]) for i, (position, task) in enumerate(zip(positions, tasks))]
        for group in groups:
            for episode in group.episodes:
                episode.difficulty = _difficulty(group.task)
        return groups


    def _generate(self, prompts: list[list[int]], params: SamplingParams, cancel: Cancel | None,
                  kept: dict[tuple[str, ...], Any] | None, key: tuple[str, ...]) -> list[list[Completion]]:
        """One engine call's groups: as a previous try left them in `kept[key]` (done, or resumed
        from its preempted requests), else generated; what it did goes into `kept` (see
        `sample`)."""
        n = self.config.rollout.group_size
        state, saved = kept.get(key, (None, None)) if kept is not None else (None, None)
        if state == "done":
            return saved
        try:
            if state == "preempted":
                results = self.engine.generate(prompts, n, params, cancel=cancel, resume=saved)  # type: ignore[call-arg]
            else:
                results = self.engine.generate(prompts, n, params, cancel=cancel)
        except PreemptedError as error:
            handles = getattr(error, "handles", None)  # an embedded engine's; other engines keep nothing
            if kept is not None and handles is not None:
                kept[key] = ("preempted", handles)
            raise
        if kept is not None:
            kept[key] = ("done", results)
        return results


def _difficulty(task: Task) -> float | None:
    value = task.metadata.get("difficulty")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def score_groups(scorer: ScoringWorker, domains: DomainRuntime, groups: list[Group], timings: dict[str, float]) -> None:
    """Score the groups' answers (seconds in `timings["score_s"]`) and compose the domains'
    sub-rewards. It touches no state shared between batches: batches may be scored at once."""
    mark = time.perf_counter()
    unscored = [(group.task, e) for group in groups for e in group.episodes if e.score is None]  # agent episodes come scored
    scores = scorer.score_many([(task, e.completion.text) for task, e in unscored])
    for (_, episode), score in zip(unscored, scores):
        episode.score = score
    domains.compose(scorer, groups)
    timings["score_s"] = time.perf_counter() - mark


def gate_groups(parts: LoopParts, groups: list[Group], step: int, exclude: Callable[[str], None] | None = None) -> dict[str, int]:
    """Gate the scored groups, let the watch quarantine tasks (`exclude`, default the mixer's),
    update the curricula, trim surplus groups (dynamic sampling), normalise the rewards and
    assign advantages. It reads and updates the run's state: batches go through it one at a
    time, in step order. Returns the drop counts by reason."""
    cfg = parts.config
    drops = gate_episodes(groups, cfg.gate, cfg.rollout.max_new_tokens)
    quarantined = {q.task_id for q in parts.watch.observe(groups, step + 1)}
    for task_id in quarantined:
        (exclude or parts.mixer.exclude)(task_id)
    # The samples that tripped the watch do not train either.
    tripped = [e for group in groups if group.task.id in quarantined for e in group.kept]
    for episode in tripped:
        episode.keep, episode.drop_reason = False, "audit_quarantine"
    if parts.watch.config.enabled:
        drops["audit_quarantine"] = len(tripped)
    parts.domains.observe(groups, step)
    drops["surplus"] = parts.domains.trim(groups)
    episodes = flatten(groups)
    parts.domains.normalise(episodes)
    assign_advantages(groups, cfg.algorithm.advantage)
    parts.domains.remember(episodes)
    return drops


def gate_metrics(parts: LoopParts, step: int) -> dict[str, Any]:
    """The watch's and the domains' metrics right after batch `step` was gated."""
    return {**parts.watch.metrics(), **parts.domains.metrics(step + 1)}


def run_state(parts: LoopParts) -> dict[str, Any]:
    """What a checkpoint holds of the run besides the trainer: the mixer's, watch's and domains'
    states."""
    return {
        "mixer": parts.mixer.state_dict(),
        "watch": parts.watch.state_dict(),
        "domains": parts.domains.state_dict(),
    }


def store_groups(store: TrajectoryStore, step: int, groups: list[Group], timings: dict[str, float]) -> None:
    """Batch `step` into the trajectory store, with each task's prompt and the step's timings."""
    store.write_episodes(step, flatten(groups), {group.task.id: group.task for group in groups}, timings)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def distribution_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Completion length and task difficulty of the sampled vs the trained (kept) samples, so a
    bias of the gate or of admission toward short or easy tasks shows."""
    out: dict[str, float] = {}
    for name, members in (("sampled", episodes), ("trained", [e for e in episodes if e.keep])):
        if not members:
            continue
        lengths = [float(len(e.completion.token_ids)) for e in members]
        out[f"{name}/length_mean"] = sum(lengths) / len(lengths)
        out[f"{name}/length_p90"] = _quantile(lengths, 0.9)
        levels = [e.difficulty for e in members if e.difficulty is not None]
        if levels:
            out[f"{name}/difficulty_mean"] = sum(levels) / len(levels)
    return out


def step_metrics(groups: list[Group], drops: dict[str, int]) -> dict[str, Any]:
    """Reward per domain, pass rate, kept fraction, lengths, drop reasons, the tamper and
    infra-error rates, and the length and difficulty distributions of sampled vs trained samples."""
    episodes = flatten(groups)
    by_domain: dict[str, list[float]] = defaultdict(list)
    for episode in episodes:
        if episode.score is not None and episode.score.outcome is not Outcome.INFRA_ERROR:
            by_domain[episode.domain].append(episode.score.value)
    all_rewards = [r for rs in by_domain.values() for r in rs]
    metrics: dict[str, Any] = {f"reward/{d}": sum(rs) / len(rs) for d, rs in sorted(by_domain.items())}
    # The tasks behind each domain's reward: the guard judges a domain's reward against their binomial noise.
    scored_tasks: dict[str, int] = defaultdict(int)
    for group in groups:
        scored = [e for e in group.episodes if e.score is not None and e.score.outcome is not Outcome.INFRA_ERROR]
        if scored:
            scored_tasks[scored[0].domain] += 1
    metrics.update({f"tasks/{d}": n for d, n in sorted(scored_tasks.items())})
    metrics["reward/mean"] = sum(all_rewards) / max(len(all_rewards), 1)
    total = max(len(episodes), 1)
    metrics["pass_rate"] = sum(e.score is not None and e.score.outcome is Outcome.PASSED for e in episodes) / total
    metrics["kept_fraction"] = sum(e.keep for e in episodes) / total
    metrics["completion_tokens"] = sum(len(e.completion.token_ids) for e in episodes)
    metrics["mean_completion_length"] = metrics["completion_tokens"] / total
    # The guard's entropy signal: the sampler's entropy per generated token, estimated by the mean
    # -log p of every sampled token of every sample (trained or not, tool tokens left out), which
    # neither the gate's choice of groups nor the trained length moves as the trainer's `entropy` does.
    generated = [-lp for e in episodes for lp, m in zip(e.completion.logprobs, e.completion.loss_mask or
                                                       [1] * len(e.completion.logprobs)) if m]
    if generated:
        metrics["sampled_entropy"] = sum(generated) / len(generated)
    for reason, count in drops.items():
        metrics[f"drop/{reason}"] = count
    # The shares the guard watches (tamper and sandbox infra-error rates), of every sample made.
    metrics["samples"] = len(episodes)
    for outcome in (Outcome.TAMPERED, Outcome.INFRA_ERROR):
        metrics[f"rate/{outcome.value}"] = sum(e.score is not None and e.score.outcome is outcome for e in episodes) / total
    metrics.update(distribution_metrics(episodes))
    # How a domain's model-scored sub-rewards (llm_judge, reward_model) agree with its rule reward.
    scored = [e.score.components for e in episodes if e.score is not None and e.score.outcome is not Outcome.INFRA_ERROR]
    metrics.update(agreement_metrics(scored, MODEL_VERIFIERS))
    return metrics
