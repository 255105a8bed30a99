"""How a training run is put together: build the parts from the config, then run the phases
(tasks -> warm start -> evaluation before -> RL -> merge -> evaluation after -> report).

`state.json` in the run folder records which phases are done, so `tidal train RUN_FOLDER` resumes
a crashed or interrupted run where it stopped: finished phases are skipped, RL continues from its
latest checkpoint, and everything already written (trajectories, checkpoints, eval records) stays.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from tidal.audit.continuous import TaskWatch
from tidal.audit.quarantine import load_quarantine
from tidal.config import load_config, save_config
from tidal.config.schema import TidalConfig
from tidal.errors import CheckpointError
from tidal.eval.heldout import CONFIG_DOMAIN_KEY, compare, evaluate_policy, pass_rates
from tidal.eval.report import write_report
from tidal.models.io import (
    count_parameters,
    load_model,
    resolve_device,
    save_checkpoint,
)
from tidal.pipeline.domains import DomainRuntime, make_suspect_auditor
from tidal.pipeline.engines import build_engine, holds_copy
from tidal.pipeline.guard_hook import build_guard_hook
from tidal.pipeline.loop import (
    Rollback,
    StepContext,
    StepHook,
    resume_rl,
    run_rl,
    save_rl_checkpoint,
)
from tidal.pipeline.planning import check_plan
from tidal.pipeline.scheduler import EVAL_PRIORITY
from tidal.pipeline.stages import LoopParts
from tidal.pipeline.warmstart import sft_examples, split_for_warm_start, warm_start
from tidal.pipeline.weights import publish_to_engine
from tidal.reward import known_verifiers
from tidal.reward.scorer import Scorer
from tidal.rollout.protocol import RolloutEngine
from tidal.storage.run import RunFolder
from tidal.storage.trajectories import TrajectoryWriter
from tidal.tasks import generate_tasks, write_tasks
from tidal.tasks.importers import load_sources
from tidal.tasks.mixer import TaskMixer
from tidal.telemetry.progress import ProgressDisplay, rl_status
from tidal.telemetry.sinks import open_sinks
from tidal.trainer.checkpoint import latest_checkpoint
from tidal.trainer.lora import AdapterMerge, apply_lora, has_adapter, plain_copy
from tidal.trainer.merge import Merge
from tidal.trainer.parallel.trainer import ParallelTrainer
from tidal.trainer.trainer import Trainer
from tidal.types import Task


def build_tasks(cfg: TidalConfig) -> tuple[dict[str, list[Task]], list[Task]]:
    """Train tasks per domain (the mixer's keys) and all eval tasks, from families and files.
    Tasks in the quarantine list (`tasks.quarantine`) are left out of training."""
    quarantined = set(load_quarantine(cfg.tasks.quarantine)) if cfg.tasks.quarantine else set()
    train: dict[str, list[Task]] = {}
    evaluation: list[Task] = []
    verifiers = known_verifiers()
    for name, domain in cfg.tasks.domains.items():
        tasks: list[Task] = []
        if domain.family:
            args = (cfg.tasks.seed, domain.min_difficulty, domain.max_difficulty)
            tasks += generate_tasks(domain.family, domain.n_train, "train", *args) if domain.n_train else []
            tasks += generate_tasks(domain.family, domain.n_eval, "eval", *args) if domain.n_eval else []
        if domain.sources:
            tasks += load_sources([s if isinstance(s, str) else s.model_dump() for s in domain.sources],
                                  known_verifiers=verifiers)
        tasks = [with_domain_prompt(task, name, domain.system_prompt, domain.examples) for task in tasks]
        train[name] = [t for t in tasks if t.split == "train" and t.id not in quarantined]
        evaluation += [t for t in tasks if t.split == "eval"]
    return train, evaluation


def build_trainer(
    cfg: TidalConfig, model: torch.nn.Module, device: torch.device, reference: torch.nn.Module | None
) -> Trainer | ParallelTrainer:
    """The RL trainer: one process, or `trainer.parallel.world_size` ranks that this process
    starts and leads as rank 0 (trainer/parallel/)."""
    options: dict[str, Any] = {
        "total_steps": cfg.trainer.steps, "temperature": max(cfg.rollout.temperature, 1e-3),
        "ref_model": reference, "max_tokens": cfg.rollout.max_new_tokens,
    }
    if cfg.trainer.parallel.strategy == "none":
        return Trainer(model, cfg.trainer, cfg.algorithm, device, **options)
    on_ray = cfg.pipeline.mode == "async" and cfg.pipeline.backend == "ray"
    return ParallelTrainer(model, cfg.trainer, cfg.algorithm, device, model_cfg=cfg.model, on_ray=on_ray,
                           ray_address=cfg.pipeline.ray_address, **options)


def with_domain_prompt(
    task: Task, domain: str, system_prompt: str | None = None, examples: Sequence[tuple[str, str]] = ()
) -> Task:
    """`task` as the config domain `domain` poses it: tagged with that name (held-out results are
    reported per config domain, `eval/heldout.py`), and, when it is a single question (one user
    message, no system message of its own), led by the domain's system message and few-shot turns."""
    update: dict[str, Any] = {"metadata": {**task.metadata, CONFIG_DOMAIN_KEY: domain}}
    messages = task.messages()
    if (system_prompt or examples) and [m["role"] for m in messages] == ["user"]:
        lead = [{"role": "system", "content": system_prompt}] if system_prompt else []
        for question, answer in examples:
            lead += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        update["prompt"] = [*lead, *messages]
    return task.model_validate({**task.model_dump(), **update})


def build_parts(
    cfg: TidalConfig, run: RunFolder, engine: RolloutEngine, trainer: Trainer, scorer: Scorer,
    train_by_domain: dict[str, list[Task]], warm_tasks: list[Task],
) -> LoopParts:
    """The loop's parts: the mixer over the train tasks, the watch, the domains' runtime (with
    the auditor of curriculum suspects and replay's base data)."""
    weights = {name: d.weight for name, d in cfg.tasks.domains.items()}
    mixer = TaskMixer(train_by_domain, weights, cfg.run.seed)
    all_train = [t for ts in train_by_domain.values() for t in ts]
    # Replay's base data: what the warm start taught, else the train tasks' references.
    base = sft_examples(engine.tokenizer, warm_tasks or all_train) if cfg.replay.source == "base" else None
    auditor = None
    if any(d.curriculum is not None for d in cfg.tasks.domains.values()):
        auditor = make_suspect_auditor(cfg, {t.id: t for t in all_train})
    domains = DomainRuntime(cfg, mixer, base, auditor)
    return LoopParts(cfg, run, engine, trainer, scorer, mixer, domains, TaskWatch(cfg.audit.watch),
                     engine.tokenizer.pad_token_id, engine_holds_copy=holds_copy(cfg))


class ProgressHook:
    """Shows each RL step on the progress display."""

    def __init__(self, progress: ProgressDisplay) -> None:
        self.progress = progress

    def after_step(self, context: StepContext) -> Rollback | None:
        self.progress.update("rl", context.step, rl_status(context.metrics))
        return None


class ElapsedHook:
    """Records the run's elapsed seconds (over every attempt) in state.json after each step, so
    a resumed run's summary counts the time of the attempts before it."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def after_step(self, context: StepContext) -> Rollback | None:
        self.job.mark("elapsed_s", self.job.elapsed())
        return None


class HeldoutHook:
    """The held-out evaluation every `eval.every` steps, with the rollouts held: the watch gets
    the pass rates, the domains their regression alarms and adaptive weights."""

    def __init__(self, job: Job, evaluate: Any, before: dict[str, float]) -> None:
        self.job, self.evaluate, self.before = job, evaluate, before

    def after_step(self, context: StepContext) -> Rollback | None:
        cfg, step, parts = self.job.cfg, context.step, context.parts
        if not cfg.eval.every or step % cfg.eval.every or step >= cfg.trainer.steps:
            return None
        with context.hold(EVAL_PRIORITY, f"held-out eval at step {step}"):
            records = self.evaluate(f"step-{step:06d}")
        rates = pass_rates(records)
        parts.watch.set_heldout({d: r["pass_rate"] for d, r in rates.items()})
        heldout = {d: r["pass_rate"] for d, r in rates.items() if r["pass_rate"] is not None}
        alarms, changes = parts.domains.heldout(step, heldout, self.before)
        for alarm in alarms:
            self.job.progress.log(f"regression alarm: {alarm['domain']} held-out {alarm['now']:.2f} "
                                  f"(before RL {alarm['before_rl']:.2f})")
            parts.run.append_jsonl("alarms.jsonl", alarm)
        for change in changes:
            parts.run.append_jsonl("domain_weights.jsonl", dataclasses.asdict(change))
        parts.run.append_metrics({"phase": "eval", "step": step, "alarms": len(alarms),
                                  **{f"eval/{d}": r["pass_rate"] for d, r in rates.items()}})
        return None


class Job:
    """One training run in one run folder, phase by phase."""

    def __init__(self, cfg: TidalConfig, run: RunFolder, hooks: Sequence[StepHook] = ()) -> None:
        self.cfg, self.run = cfg, run
        self.hooks = list(hooks)  # optional features (e.g. a stability guard), after the job's own
        self.state: dict[str, Any] = run.read_json("state.json") if (run.path / "state.json").exists() else {}
        self.started = time.perf_counter()
        self.earlier_s = float(self.state.get("elapsed_s", 0.0))  # attempts before this one (a resume)
        # Quarantined eval tasks are still evaluated, and reported apart.
        self.quarantined = frozenset(load_quarantine(cfg.tasks.quarantine)) if cfg.tasks.quarantine else frozenset()
        self.progress = ProgressDisplay(cfg.run.progress)

    def mark(self, phase: str, value: Any = True) -> None:
        self.state[phase] = value
        if phase != "elapsed_s":
            self.state["elapsed_s"] = self.elapsed()
        self.run.write_json("state.json", self.state)

    def elapsed(self) -> float:
        """Seconds of this run so far: this attempt's, plus those earlier attempts recorded."""
        return self.earlier_s + time.perf_counter() - self.started

    def execute(self) -> Path:
        """Run every phase, with the telemetry sinks of `telemetry:` open throughout (each metrics
        row goes to them once it is on disk); returns the report."""
        cfg, run = self.cfg, self.run
        sinks = open_sinks(cfg.telemetry, run.path, run.name, cfg.model_dump(mode="json"))
        prometheus = next((s for s in sinks.sinks if s.name == "prometheus"), None)
        if prometheus is not None:
            run.write_json("prometheus.json", {"host": cfg.telemetry.prometheus_host, "port": prometheus.port})  # type: ignore[attr-defined]
        run.listeners.append(sinks)
        try:
            return self._execute()
        finally:
            run.listeners.remove(sinks)
            sinks.close()

    def _execute(self) -> Path:
        cfg, run = self.cfg, self.run
        transformers.utils.logging.disable_progress_bar()  # our own progress display is enough
        torch.manual_seed(cfg.run.seed)
        device = resolve_device(cfg.model.device)
        train_by_domain, eval_tasks, warm_tasks = self._tasks()
        loaded = load_model(cfg.model, device)
        model, tokenizer = loaded.model, loaded.tokenizer
        scorer = Scorer(cfg.reward)
        lora = cfg.trainer.lora.enabled
        with self.progress:
            self.progress.log(f"run folder: {run.path}  model: {loaded.source} ({count_parameters(model) / 1e6:.2f}M params)")
            self._warm_start(model, tokenizer, warm_tasks, device)
            if lora:  # RL trains an adapter on the warm-started weights; they stay frozen
                apply_lora(model, cfg.trainer.lora, seed=cfg.run.seed)
                trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
                self.progress.log(f"LoRA r={cfg.trainer.lora.r}: {trainable / 1e6:.3f}M trainable parameters")
            # Built after the adapter is in: the engine picks its forward from the model's layers.
            engine = build_engine(cfg, model, tokenizer, device, run.path)
            if holds_copy(cfg):  # an HTTP server: it gets the (warm-started) policy before evaluating it
                publish_to_engine(engine, model, 0, cfg.pipeline.canary_tolerance)
            # With LoRA the reference is the base model, the adapter switched off (no copy).
            reference = copy.deepcopy(model).eval() if cfg.algorithm.kl_coef > 0 and not lora else None
            # The weights RL starts from, merged back into what is evaluated and exported; a copy of
            # the model, so only kept when merging (with LoRA, the adapter's update is scaled instead).
            merge: Merge | AdapterMerge | None = None
            if cfg.merge.weight < 1:
                merge = AdapterMerge(cfg.merge.weight) if lora else Merge(model, cfg.merge.weight)

            def evaluate(tag: str, force: bool = True) -> list[dict[str, Any]]:
                with merge.view(model) if merge is not None else contextlib.nullcontext():
                    return self._evaluate(tag, engine, scorer, eval_tasks, force=force)

            before = self._evaluate("before", engine, scorer, eval_tasks)
            trainer = build_trainer(cfg, model, device, reference)
            try:
                parts = build_parts(cfg, run, engine, trainer, scorer, train_by_domain, warm_tasks)
                rl_seconds = self._rl(parts, evaluate, before)
            finally:
                if isinstance(trainer, ParallelTrainer):
                    trainer.close()
            after = evaluate("after")
            close = getattr(engine, "close", None)  # the HTTP engine's request threads
            if close is not None:
                close()
            with merge.view(model) if merge is not None else contextlib.nullcontext():
                policy = self._export_policy(model, tokenizer, merge)
        summary = self._summary(loaded.source, count_parameters(model), before, after, rl_seconds)
        summary["run"]["policy"] = str(policy)
        summary["run"]["merge_weight"] = cfg.merge.weight
        summary["run"]["trainer"] = trainer.setup  # precision, log-prob path, checkpointing, micro-batches, ranks
        run.write_json("summary.json", summary)
        report = write_report(run.report_path, summary, run.read_metrics())
        self.mark("done")
        return report

    def _tasks(self) -> tuple[dict[str, list[Task]], list[Task], list[Task]]:
        """(train tasks per domain, eval tasks, warm-start tasks), written to the run folder once."""
        cfg = self.cfg
        train_by_domain, eval_tasks = build_tasks(cfg)
        warm_tasks: list[Task] = []
        if cfg.warm_start.enabled:
            for name, tasks in train_by_domain.items():
                warm, rest = split_for_warm_start(tasks, cfg.tasks.domains[name].warm_start_share or cfg.warm_start.share)
                warm_tasks += warm
                train_by_domain[name] = rest or tasks
        if "tasks" not in self.state:
            write_tasks([t for ts in train_by_domain.values() for t in ts], self.run.path / "tasks" / "train.jsonl")
            write_tasks(eval_tasks, self.run.path / "tasks" / "eval.jsonl")
            self.mark("tasks")
        return train_by_domain, eval_tasks, warm_tasks

    def _warm_start(self, model: torch.nn.Module, tokenizer: Any, tasks: list[Task], device: torch.device) -> None:
        """Supervised warm start on the warm tasks' references, or its saved weights on resume."""
        cfg, run = self.cfg, self.run
        if not cfg.warm_start.enabled:
            return
        folder = run.checkpoints_dir / "warm-start"
        if "warm_start" in self.state:
            self._load_weights(model, folder / "model" if (folder / "model").exists() else folder)
            return
        self.progress.phase("warm start", cfg.warm_start.steps)
        run.drop_metrics_after("warm_start", 0)  # the rows of an attempt that crashed before its end

        def on_sft(step: int, m: dict[str, float]) -> None:
            self.progress.update("warm start", step, f"loss {m['loss']:.3f}")
            if step % 25 == 0 or step == cfg.warm_start.steps:
                run.append_metrics({"phase": "warm_start", "step": step, **m})

        warm_start(model, tokenizer, tasks, cfg.warm_start, device, cfg.run.seed, on_sft)
        save_checkpoint(model, tokenizer, folder)
        self.mark("warm_start")

    def _rl(self, parts: LoopParts, evaluate: Any, before: list[dict[str, Any]]) -> float:
        """The RL phase, resumed from its latest checkpoint; returns its seconds."""
        cfg = self.cfg
        start = resume_rl(parts) if cfg.run.resume else 0
        self.progress.phase("rl", cfg.trainer.steps, start)
        began = time.perf_counter()
        before_rates = {d: r["pass_rate"] for d, r in pass_rates(before).items() if r["pass_rate"] is not None}
        guard = build_guard_hook(parts, before_rates)
        if start == 0 and cfg.guard.rolls_back():  # a rollback may go back to before the first update
            save_rl_checkpoint(parts, 0)
        own: list[StepHook] = [ProgressHook(self.progress), HeldoutHook(self, evaluate, before_rates), ElapsedHook(self)]
        try:
            run_rl(parts, start, [*own, *([guard] if guard is not None else []), *self.hooks])
        finally:
            if guard is not None:
                guard.close()
        self.mark("rl", cfg.trainer.steps)
        # Over every attempt: the steps' own seconds (a step redone after a crash counts once).
        rows = [m for m in self.run.read_metrics() if m.get("phase") == "rl" and "step_s" in m]
        return sum(m["step_s"] for m in rows) if start else time.perf_counter() - began

    def _export_policy(self, model: torch.nn.Module, tokenizer: Any, merge: Merge | AdapterMerge | None) -> Path:
        """The post-trained policy's folder: the last RL checkpoint's model, or, when merging, the
        merged weights (which `model` holds now) saved as their own Hugging Face folder; with LoRA
        always such a folder, the adapter merged into the base (a plain model, loadable without peft)."""
        if has_adapter(model):
            return save_checkpoint(plain_copy(model), tokenizer, self.run.checkpoints_dir / "policy")
        if merge is not None and merge.active:
            return save_checkpoint(model, tokenizer, self.run.checkpoints_dir / "policy")
        latest = latest_checkpoint(self.run.checkpoints_dir / "rl")
        return latest / "model" if latest is not None else self.run.checkpoints_dir / "warm-start"

    def _load_weights(self, model: torch.nn.Module, folder: Path) -> None:
        from safetensors.torch import load_file

        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{folder}: no *.safetensors to resume the warm start from")
        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(load_file(str(file)))
        model.load_state_dict(state, strict=False)

    def _evaluate(
        self, tag: str, engine: RolloutEngine, scorer: Scorer, tasks: list[Task], force: bool = False
    ) -> list[dict[str, Any]]:
        """Evaluate on the held-out tasks, or reuse the records of a finished earlier attempt."""
        if f"eval_{tag}" in self.state and not force:
            return TrajectoryWriter(self.run).read_eval(tag)
        cfg, progress = self.cfg, self.progress
        progress.phase(f"eval {tag}"[:12], len(tasks))
        records = evaluate_policy(
            engine, tasks, scorer.score_many,
            samples_per_task=cfg.eval.samples_per_task, temperature=cfg.eval.temperature,
            top_p=cfg.rollout.top_p, max_new_tokens=cfg.rollout.max_new_tokens, stop=list(cfg.rollout.stop),
            seed=cfg.run.seed + 7_777, batch_prompts=cfg.rollout.batch_prompts,
            on_progress=lambda done, total: progress.update(f"eval {tag}"[:12], done),
            quarantined=self.quarantined, agent_backend=cfg.reward.sandbox.backend,
            agent_concurrency=cfg.rollout.agent_concurrency, agent_max_tokens=cfg.rollout.agent_max_tokens,
        )
        TrajectoryWriter(self.run).write_eval(tag, records)
        self.mark(f"eval_{tag}")
        rates = pass_rates(records)
        progress.log(f"eval {tag}: " + "  ".join(f"{d} {r['pass_rate']:.2f}" for d, r in rates.items() if r["pass_rate"] is not None))
        return records

    def _summary(
        self, source: str, params: int, before: list[dict[str, Any]], after: list[dict[str, Any]], rl_seconds: float
    ) -> dict[str, Any]:
        cfg = self.cfg
        run = {
            "name": self.run.name, "model": source, "parameters": params, "steps": cfg.trainer.steps,
            "algorithm": cfg.algorithm.advantage, "eval_samples_per_task": cfg.eval.samples_per_task,
            "eval_temperature": cfg.eval.temperature, "duration_s": round(self.elapsed(), 1),
            "rl_seconds": round(rl_seconds, 1),
        }
        return {"run": run, "before": pass_rates(before), "after": pass_rates(after), **compare(before, after)}


def start_run(cfg: TidalConfig, parent: Path, name: str | None) -> RunFolder:
    run = RunFolder.create(parent, name or cfg.run.name)
    save_config(cfg, run.config_path)
    return run


def run_training(target: Path, overrides: list[str]) -> Path:
    """A config file starts a new run; a run folder resumes (with its saved config + overrides).
    A config whose predicted peak memory cannot fit is refused first (`check_plan`, `PlanError`)."""
    if target.is_dir():
        run = RunFolder.open(target)
        cfg = load_config(run.config_path, overrides)
        cfg = check_plan(cfg, build_tasks(cfg))
        save_config(cfg, run.config_path)
        return Job(cfg, run).execute()
    cfg = load_config(target, overrides)
    cfg = check_plan(cfg, build_tasks(cfg))  # before the run folder, the model or any rank exists
    return Job(cfg, start_run(cfg, Path(cfg.run.dir), cfg.run.name)).execute()
