"""The RL loop: sample -> score -> gate -> advantages -> update, one step at a time.

It reads top to bottom and is built from library parts; no part it wires knows about it.
Every step's trajectories are written to the trajectory store *before* the update uses them, the
ids it trained on are recorded in the store's ledger right after it (exactly once), and a
checkpoint (model, optimizer, schedule, RNG, mixer cursor) is written every `checkpoint_every`
steps, so a crash loses at most the steps since the last checkpoint, and those are redone with
the same tasks on resume.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidal.algos import assign_advantages
from tidal.audit.continuous import TaskWatch
from tidal.config.schema import TidalConfig
from tidal.gate import gate_episodes
from tidal.models.io import render_prompt
from tidal.pipeline.agent_rollout import is_multi_turn, sample_agent_episodes
from tidal.pipeline.domains import DomainRuntime
from tidal.reward.scorer import Scorer
from tidal.rollout.engine import Cancel, EmbeddedEngine, SamplingParams
from tidal.storage.run import RunFolder
from tidal.storage.store import open_run_store
from tidal.tasks.mixer import TaskMixer
from tidal.trainer.checkpoint import latest_checkpoint, prune_checkpoints
from tidal.trainer.logprobs import collate
from tidal.trainer.trainer import Trainer
from tidal.types import Episode, Outcome, Task

StepCallback = Callable[[int, dict[str, Any]], None]


@dataclass
class LoopParts:
    """What the loop needs, built by the caller (quickstart/train)."""

    config: TidalConfig
    run: RunFolder
    engine: EmbeddedEngine
    trainer: Trainer
    scorer: Scorer
    mixer: TaskMixer
    pad_id: int
    watch: TaskWatch | None = None  # the continuous audit: quarantines tasks from the gate's signals
    domains: DomainRuntime | None = None  # per-domain composition, normalisation, curriculum, replay
    auditor: Callable[[str], str] | None = None  # task id -> "broken" | "hard", for curriculum suspects
    scheduler: Any = None  # the async loop's rollout `Scheduler` while it runs (evaluation holds it)


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


def sample_episodes(
    parts: LoopParts, tasks: list[Task], step: int, indices: list[int] | None = None, cancel: Cancel | None = None
) -> list[Episode]:
    """Generate a group of `group_size` completions for each task, with the current weights, in
    the chunks of `plan_chunks` (one engine call per chunk of single-turn tasks, each prompt
    prefilled once per group; multi-turn episodes for agent tasks: pipeline/agent_rollout.py).
    Episodes come in task order. `indices` are the tasks' positions in the step's batch (their
    group ids); by default 0, 1, ... A rollout worker given one chunk of a batch, with its
    positions, makes exactly the episodes the whole batch would have for those tasks. Once `cancel`
    is set (the scheduler preempts the chunk), generation stops at its next decode step (an agent
    episode: at its next turn) and `PreemptedError` is raised; nothing is kept."""
    cfg = parts.config
    positions = list(range(len(tasks))) if indices is None else list(indices)
    if len(positions) != len(tasks):
        raise ValueError(f"sample_episodes: {len(tasks)} tasks but {len(positions)} indices")
    params = SamplingParams(
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=cfg.rollout.max_new_tokens,
        stop=list(cfg.rollout.stop),
        seed=cfg.run.seed * 1_000_003 + step,
    )
    by_index: dict[int, list[Episode]] = {}
    for chunk in plan_chunks(tasks, cfg.rollout.batch_prompts, domain_priority(cfg)):
        multi = [(positions[i], tasks[i]) for i in chunk if is_multi_turn(tasks[i])]
        if multi:
            for episode in sample_agent_episodes(parts, multi, step, cancel):
                by_index.setdefault(int(episode.group_id.rsplit("/g", 1)[1]), []).append(episode)
            continue
        prompts = [render_prompt(parts.engine.tokenizer, tasks[i].messages()) for i in chunk]
        groups = parts.engine.generate(prompts, cfg.rollout.group_size, params, cancel=cancel)
        for i, group in zip(chunk, groups):
            group_id = f"{parts.run.name}/step-{step:06d}/g{positions[i]:03d}"
            by_index[positions[i]] = [
                Episode(id=f"{group_id}/s{k:02d}", task_id=tasks[i].id, domain=tasks[i].domain, group_id=group_id,
                        completion=completion)
                for k, completion in enumerate(group)
            ]
    episodes: list[Episode] = []
    for position, task in zip(positions, tasks):
        for episode in by_index.get(position, []):
            episode.difficulty = _difficulty(task)
            episodes.append(episode)
    return episodes


def _difficulty(task: Task) -> float | None:
    value = task.metadata.get("difficulty")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def distribution_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Completion length and task difficulty of the sampled vs the trained (kept) samples, so a
    bias of the gate or of admission toward short or easy tasks shows (issue 4)."""
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


def step_metrics(episodes: list[Episode], drops: dict[str, int]) -> dict[str, Any]:
    """Reward per domain, pass rate, kept fraction, lengths, drop reasons, and the length and
    difficulty distributions of sampled vs trained samples."""
    by_domain: dict[str, list[float]] = defaultdict(list)
    for episode in episodes:
        if episode.score is not None and episode.score.outcome is not Outcome.INFRA_ERROR:
            by_domain[episode.domain].append(episode.score.value)
    all_rewards = [r for rs in by_domain.values() for r in rs]
    metrics: dict[str, Any] = {f"reward/{d}": sum(rs) / len(rs) for d, rs in sorted(by_domain.items())}
    metrics["reward/mean"] = sum(all_rewards) / max(len(all_rewards), 1)
    metrics["pass_rate"] = sum(e.score is not None and e.score.outcome is Outcome.PASSED for e in episodes) / len(episodes)
    metrics["kept_fraction"] = sum(e.keep for e in episodes) / len(episodes)
    metrics["completion_tokens"] = sum(len(e.completion.token_ids) for e in episodes)
    metrics["mean_completion_length"] = metrics["completion_tokens"] / len(episodes)
    for reason, count in drops.items():
        metrics[f"drop/{reason}"] = count
    metrics.update(distribution_metrics(episodes))
    return metrics


def score_and_gate(
    parts: LoopParts, episodes: list[Episode], tasks_by_id: dict[str, Task], step: int, timings: dict[str, float]
) -> dict[str, int]:
    """Score the episodes (time in `timings["score_s"]`), compose the domains' sub-rewards, gate
    them, let the watch quarantine tasks, update the curricula, trim surplus groups (dynamic
    sampling), normalise the rewards and assign advantages. Returns the drop counts by reason."""
    score_episodes(parts, episodes, tasks_by_id, timings)
    return gate_scored(parts, episodes, tasks_by_id, step)


def score_episodes(
    parts: LoopParts, episodes: list[Episode], tasks_by_id: dict[str, Task], timings: dict[str, float]
) -> None:
    """The scoring half of `score_and_gate`: scores and the domains' sub-rewards, which touch no
    state shared between batches (the async loop scores two batches at once with it)."""
    mark = time.perf_counter()
    unscored = [e for e in episodes if e.score is None]  # agent episodes come with their acceptance verdict
    scores = parts.scorer.score_many([(tasks_by_id[e.task_id], e.completion.text) for e in unscored])
    for episode, score in zip(unscored, scores):
        episode.score = score
    if parts.domains is not None:
        parts.domains.compose(parts.scorer, episodes, tasks_by_id)
    timings["score_s"] = time.perf_counter() - mark


def gate_scored(parts: LoopParts, episodes: list[Episode], tasks_by_id: dict[str, Task], step: int) -> dict[str, int]:
    """The rest of `score_and_gate`, which reads and updates the run's state (watch, curricula,
    mixer): batches go through it one at a time, in step order."""
    cfg = parts.config
    drops = gate_episodes(episodes, cfg.gate, cfg.rollout.max_new_tokens)
    if parts.watch is not None:
        quarantined = {q.task_id for q in parts.watch.observe(episodes, tasks_by_id, step + 1)}
        for task_id in quarantined:
            parts.mixer.exclude(task_id)
        # The samples that tripped the watch do not train either.
        drops["audit_quarantine"] = sum(e.keep and e.task_id in quarantined for e in episodes)
        for episode in episodes:
            if episode.keep and episode.task_id in quarantined:
                episode.keep, episode.drop_reason = False, "audit_quarantine"
    if parts.domains is not None:
        parts.domains.observe(episodes, step, parts.auditor)
        drops["surplus"] = parts.domains.trim(episodes)
        parts.domains.normalise(episodes)
    assign_advantages(episodes, cfg.algorithm.advantage)
    if parts.domains is not None:
        parts.domains.remember(episodes)
    return drops


def run_rl(parts: LoopParts, start_step: int = 0, on_step: StepCallback | None = None) -> int:
    """Train from `start_step` to `trainer.steps`. Returns the number of steps taken now."""
    from tidal.pipeline.scheduler import RetryingScorer, retry_policy

    cfg = parts.config
    store = open_run_store(parts.run, cfg.run.trajectory_store)  # an unwritable URL fails here, at once
    store.rollback(start_step)  # what the steps after the resumed checkpoint trained died with them
    scoring = RetryingScorer(parts.scorer, retry_policy(cfg.pipeline))  # infra errors are scored again
    parts = dataclasses.replace(parts, scorer=scoring)
    taken = 0
    for step in range(start_step, cfg.trainer.steps):
        timings: dict[str, float] = {}
        began = time.perf_counter()

        tasks = parts.mixer.sample(parts.domains.tasks_to_draw() if parts.domains else cfg.tasks.tasks_per_step, step)
        tasks_by_id = {task.id: task for task in tasks}
        episodes = sample_episodes(parts, tasks, step)
        timings["generate_s"] = time.perf_counter() - began

        drops = score_and_gate(parts, episodes, tasks_by_id, step, timings)
        kept = [e for e in episodes if e.keep]
        # Stored before the update may use them: a crash never loses a trajectory that was trained on.
        store.write_episodes(step, episodes, tasks_by_id, timings)

        mark = time.perf_counter()
        train_metrics: dict[str, float] = {}
        if kept:
            batch = collate(kept, parts.pad_id, parts.trainer.device)
            replay = parts.domains.replay_batch(parts.pad_id) if parts.domains is not None else None
            train_metrics = parts.trainer.rl_step(batch, replay=replay)
            store.mark_trained([e.id for e in kept], step)
        parts.engine.update_weights(None, version=step + 1)
        timings["train_s"] = time.perf_counter() - mark
        timings["step_s"] = time.perf_counter() - began

        metrics = {"step": step + 1, "phase": "rl", **step_metrics(episodes, drops), **train_metrics, **timings}
        metrics["tokens_per_s"] = metrics["completion_tokens"] / max(timings["generate_s"], 1e-9)
        metrics["trained_samples"] = len(kept)
        metrics.update(scoring.metrics())
        if parts.watch is not None:
            metrics.update(parts.watch.metrics())
        if parts.domains is not None:
            metrics.update(parts.domains.metrics(step + 1))
        parts.run.append_metrics(metrics)
        taken += 1

        if (step + 1) % cfg.trainer.checkpoint_every == 0 or step + 1 == cfg.trainer.steps:
            save_rl_checkpoint(parts, step + 1)
        if on_step:
            on_step(step + 1, metrics)
    return taken


def save_rl_checkpoint(
    parts: LoopParts, step: int, mixer_state: dict[str, Any] | None = None, watch_state: dict[str, Any] | None = None,
    domains_state: dict[str, Any] | None = None,
) -> None:
    """Checkpoint after `step` updates. The mixer's, watch's and domains' states are their current
    ones unless given (the async loop's sampler is ahead of the trainer and passes them as of `step`)."""
    root = parts.run.checkpoints_dir / "rl"
    if mixer_state is None:
        mixer_state = parts.mixer.state_dict()
    if watch_state is None and parts.watch is not None:
        watch_state = parts.watch.state_dict()
    if domains_state is None and parts.domains is not None:
        domains_state = parts.domains.state_dict()
    parts.trainer.save(
        root / f"step-{step:06d}",
        step,
        extra={"mixer": mixer_state, "weight_version": step, "watch": watch_state, "domains": domains_state},
        tokenizer=parts.engine.tokenizer,
    )
    prune_checkpoints(root, parts.config.trainer.keep_checkpoints)


def resume_rl(parts: LoopParts) -> int:
    """Restore the latest RL checkpoint of the run, if any. Returns the step to continue from."""
    latest = latest_checkpoint(parts.run.checkpoints_dir / "rl")
    if latest is None:
        return 0
    step, extra = parts.trainer.load(latest)
    parts.mixer.load_state_dict(extra["mixer"])
    if parts.watch is not None and extra.get("watch"):
        parts.watch.load_state_dict(extra["watch"])
    if parts.domains is not None and extra.get("domains"):
        parts.domains.load_state_dict(extra["domains"])
    parts.engine.update_weights(None, version=int(extra.get("weight_version", step)))
    return step
