"""The RL loop, one for every mode: take batch `step` -> update -> record the ids trained ->
publish the weights -> metrics -> step hooks -> checkpoint.

Batches come from a `BatchSource` (pipeline/sources.py): made in this thread, on-policy
(`pipeline.mode: sync`), or ahead of the trainer within `algorithm.max_staleness` (`async`).
Every batch is in the trajectory store before the update uses it, the ids it trained on go to the
store's ledger right after (exactly once), and a checkpoint (model, optimizer, schedule, RNG,
mixer, watch, domains) is written every `checkpoint_every` steps, so a crash loses at most the
steps since the last one, redone with the same tasks and ids on resume. A step hook may hold the
rollouts (the held-out evaluation) or ask for a rollback to a checkpoint, which the loop does as
an in-process resume: the ledger voids the rolled-back steps, which are then redone; or for a
pause, which stops the run cleanly at its latest checkpoint (`RunPaused`; `tidal train RUN_FOLDER`
resumes it). A hook may also prepare each step (`before_step`: fault injection) and re-apply its
own decisions after a rollback (`after_restore`: the guard's quarantines and learning rate).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tidal.errors import CheckpointError, RunPaused
from tidal.pipeline.sources import BatchSource, open_source
from tidal.pipeline.stages import LoopParts, ScoredBatch, run_state, step_metrics
from tidal.storage.store import TrajectoryStore, open_run_store
from tidal.trainer.checkpoint import latest_checkpoint, prune_checkpoints
from tidal.trainer.logprobs import collate
from tidal.types import Episode

logger = logging.getLogger(__name__)


class StalenessError(RuntimeError):
    """A sample older than `algorithm.max_staleness` reached the trainer (a bug in admission control)."""


@dataclass
class Rollback:
    """A step hook's request: go back to the RL checkpoint at `to_step` (None: the latest one)."""

    reason: str
    to_step: int | None = None


@dataclass
class Pause:
    """A step hook's request: stop the run cleanly; the latest checkpoint is where it resumes."""

    reason: str


@dataclass
class StepContext:
    """What a step hook sees after step `step` (updates done): its metrics row, as written, and
    the parts; `hold` keeps new rollout work from starting while the hook uses the engine."""

    step: int
    metrics: dict[str, Any]
    parts: LoopParts
    source: BatchSource
    batch: ScoredBatch | None = None  # the step's batch, as trained

    def hold(self, priority: int, name: str) -> Any:
        return self.source.hold(priority, name)


class StepHook(Protocol):
    def after_step(self, context: StepContext) -> Rollback | Pause | None:
        """Called after each step's metrics row, before its checkpoint (which holds what the hook
        changed in the parts); a `Rollback` rewinds the run instead, and the step is not saved; a
        `Pause` stops the run, the step not saved either.

        Optional: `before_step(parts, step)`, called before batch `step` is made, and
        `after_restore(parts, step)`, called once a rollback restored the checkpoint at `step`."""
        ...


def run_rl(parts: LoopParts, start_step: int = 0, hooks: Sequence[StepHook] = ()) -> int:
    """Train from `start_step` to `trainer.steps`. Returns the number of updates made now
    (rolled-back ones included)."""
    cfg = parts.config
    store_lock = threading.Lock()
    taken, step = 0, start_step
    while step < cfg.trainer.steps:
        # A new attempt of the store each time through (a rolled-back step's ids are written again);
        # an unwritable URL fails here, at once.
        store = open_run_store(parts.run, cfg.run.trajectory_store)
        rewind(parts, store, step)
        source = open_source(parts, store, store_lock, step)
        request: Rollback | Pause | None = None
        try:
            while step < cfg.trainer.steps and request is None:
                for hook in hooks:
                    if hasattr(hook, "before_step"):
                        hook.before_step(parts, step)
                metrics, state, batch = train_step(parts, source, store, store_lock, step)
                taken, step = taken + 1, step + 1
                request = run_hooks(hooks, StepContext(step, metrics, parts, source, batch))
                if request is None and (step % cfg.trainer.checkpoint_every == 0 or step == cfg.trainer.steps):
                    save_rl_checkpoint(parts, step, state)
        finally:
            source.close()
        if isinstance(request, Pause):
            logger.warning("paused at step %d: %s", step, request.reason)
            parts.run.append_jsonl("pauses.jsonl", {"step": step, "reason": request.reason})
            raise RunPaused(step, request.reason)
        if request is not None:
            step = roll_back(parts, request, step)
            for hook in hooks:
                if hasattr(hook, "after_restore"):
                    hook.after_restore(parts, step)
    return taken


def run_hooks(hooks: Sequence[StepHook], context: StepContext) -> Rollback | Pause | None:
    """Every hook, in order; the first pause any of them asks for, else the first rollback."""
    requests = [hook.after_step(context) for hook in hooks]
    pause = next((request for request in requests if isinstance(request, Pause)), None)
    return pause or next((request for request in requests if request is not None), None)


def train_step(
    parts: LoopParts, source: BatchSource, store: TrajectoryStore, store_lock: threading.Lock, step: int
) -> tuple[dict[str, Any], dict[str, Any] | None, ScoredBatch]:
    """One step: batch `step` from the source, the update, the ledger, the publication and the
    metrics row. Returns the row, the run state a checkpoint after it holds (`ScoredBatch.state`)
    and the batch."""
    began = time.perf_counter()
    batch = source.next_batch(step)
    kept = batch.kept
    check_staleness(kept, step, source.max_staleness)
    mark = time.perf_counter()
    train_metrics: dict[str, float] = {}
    if kept:
        replay = parts.domains.replay_batch(parts.pad_id)
        train_metrics = parts.trainer.rl_step(collate(kept, parts.pad_id, parts.trainer.device), replay=replay)
        with store_lock:
            store.mark_trained([e.id for e in kept], step)
    timings = {"train_s": time.perf_counter() - mark}
    mark = time.perf_counter()
    source.publish(step + 1)
    timings["publish_s"] = time.perf_counter() - mark
    timings["step_s"] = time.perf_counter() - began
    return record_step(parts, source, batch, {**train_metrics, **timings}, step), batch.state, batch


def record_step(parts: LoopParts, source: BatchSource, batch: ScoredBatch, update: dict[str, Any], step: int) -> dict[str, Any]:
    """Step `step`'s row of metrics.jsonl: the batch's rewards, drops and timings, the update's
    metrics, the gate's and the source's. Returns it."""
    kept = batch.kept
    metrics = {"step": step + 1, "phase": "rl", **step_metrics(batch.groups, batch.drops), **batch.timings, **update}
    metrics["tokens_per_s"] = metrics["completion_tokens"] / max(metrics["generate_s"], 1e-9)
    metrics["trained_samples"] = len(kept)
    metrics["rollout_worker"] = batch.worker
    metrics.update(staleness_metrics(kept, step))
    metrics.update(batch.metrics)
    metrics.update(source.report(step, metrics))
    parts.run.append_metrics(metrics)
    return metrics


def check_staleness(kept: list[Episode], step: int, bound: int) -> None:
    """Raise `StalenessError` when a trained token was sampled under weights more than `bound`
    updates old: per token, since with in-flight weight updates one completion spans versions."""
    stale = [e.id for e in kept if step - min([e.completion.weight_version, *e.completion.versions()]) > bound]
    if stale:
        raise StalenessError(f"step {step}: {len(stale)} sample(s) with tokens older than algorithm.max_staleness={bound}, "
                             f"e.g. {stale[0]}")


def staleness_metrics(kept: list[Episode], step: int) -> dict[str, float]:
    """`staleness/<k>`: trained samples made `k` updates before this one (by their first token's
    weights); `staleness_max`. Where weights changed while a sample was generated (in-flight
    updates), also the staleness per generated token, `staleness_token_mean`, and the samples that
    span several versions, `staleness_mixed_samples`."""
    counts = Counter(step - e.completion.weight_version for e in kept)
    metrics: dict[str, float] = {f"staleness/{k}": n for k, n in sorted(counts.items())}
    metrics["staleness_max"] = max(counts, default=0)
    mixed = [e for e in kept if e.completion.token_versions is not None]
    if mixed:
        tokens = [step - version for e in kept for version in e.completion.versions()]
        metrics["staleness_token_mean"] = sum(tokens) / max(len(tokens), 1)
        metrics["staleness_mixed_samples"] = len(mixed)
    return metrics


def rewind(parts: LoopParts, store: TrajectoryStore, step: int) -> None:
    """Before training from `step`: what updates `step` and later trained (lost with a crash, or
    rolled back) is void in the ledger, and their metrics rows go (they are redone)."""
    store.rollback(step)
    for phase in ("rl", "eval"):  # a held-out evaluation after a redone step is redone too
        parts.run.drop_metrics_after(phase, step)
    for name in ("alarms.jsonl", "domain_weights.jsonl"):  # written by that evaluation
        parts.run.drop_rows_after(name, step)


def save_rl_checkpoint(parts: LoopParts, step: int, state: dict[str, Any] | None = None) -> None:
    """Checkpoint after `step` updates. `state`: the mixer's, watch's and domains' as of `step`
    (an async source is ahead of the trainer); None: their current state."""
    root = parts.run.checkpoints_dir / "rl"
    state = state if state is not None else run_state(parts)
    parts.trainer.save(root / f"step-{step:06d}", step, extra={**state, "weight_version": step},
                       tokenizer=parts.engine.tokenizer)
    prune_checkpoints(root, retained_checkpoints(parts.config))


def retained_checkpoints(cfg: Any) -> int:
    """RL checkpoints kept: `trainer.keep_checkpoints`, or more (`guard.keep_checkpoints`) when
    the guard may roll back to one from before the step it blames."""
    keep = cfg.trainer.keep_checkpoints
    return max(keep, cfg.guard.keep_checkpoints) if cfg.guard.rolls_back() else keep


def resume_rl(parts: LoopParts, checkpoint: Path | None = None) -> int:
    """Restore an RL checkpoint of the run (default the latest), if any. Returns its step."""
    checkpoint = checkpoint or latest_checkpoint(parts.run.checkpoints_dir / "rl")
    if checkpoint is None:
        return 0
    step, extra = parts.trainer.load(checkpoint)
    parts.mixer.load_state_dict(extra["mixer"])
    if extra.get("watch"):  # None in a checkpoint of a run without the watch
        parts.watch.load_state_dict(extra["watch"])
    if extra.get("domains"):
        parts.domains.load_state_dict(extra["domains"])
    parts.sync_engine(int(extra.get("weight_version", step)))
    return step


def roll_back(parts: LoopParts, request: Rollback, step: int) -> int:
    """Restore the checkpoint `request` names (at most `step`); returns the step to go on from."""
    root = parts.run.checkpoints_dir / "rl"
    if request.to_step is None:
        checkpoint = latest_checkpoint(root)
    else:
        checkpoint = root / f"step-{request.to_step:06d}"
        checkpoint = checkpoint if checkpoint.is_dir() else None
    if checkpoint is None:
        raise CheckpointError(f"rollback at step {step} ({request.reason}): no RL checkpoint "
                              f"{'at all' if request.to_step is None else f'at step {request.to_step}'} in {root}")
    restored = resume_rl(parts, checkpoint)
    if restored > step:
        raise CheckpointError(f"rollback at step {step} ({request.reason}): checkpoint {checkpoint} is ahead, at step {restored}")
    logger.warning("rollback at step %d to step %d: %s", step, restored, request.reason)
    parts.run.append_jsonl("rollbacks.jsonl", {"step": step, "to_step": restored, "reason": request.reason})
    return restored
