"""The evaluation harness: every (task, epoch) of a suite as an agent episode, results as they finish.

    out/
      eval.json        what this eval is: model, task ids, epochs (a resume must match it)
      results.jsonl    one record per finished (task, epoch), appended, flushed and fsynced
      traces/          one JSON per finished (task, epoch): messages and per-step records
      summary.json     metrics (metrics.py), rewritten at the end
      report.html      plots and the selection checklist (eval_report.py)

A rerun with the same `out` skips every (task, epoch) with a record whose outcome is not
`infra_error`; a torn last line is ignored. Infra errors are retried with backoff, reported apart
and never counted as failures; `EndpointAuthError` and `EndpointConfigError` stop the eval at once,
keeping every result written. Episodes run `concurrency` at a time in threads, since they mostly
wait on sandboxes or HTTP; a local model batches their waiting turns (agent/local.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.agent.context import ContextPolicy
from tidal.agent.policy import Policy
from tidal.agent.records import AgentOutcome, AgentResult
from tidal.agent.runner import AgentConfig, run_episode
from tidal.errors import EndpointAuthError, EndpointConfigError, EvalError
from tidal.eval.settings import EvalSettings
from tidal.sandbox.base import SandboxBackend
from tidal.sandbox.session import SessionStore
from tidal.storage.run import dumps, fsync_path
from tidal.types import Task

logger = logging.getLogger(__name__)
RESULTS = "results.jsonl"
SPEC = "eval.json"
TRACES = "traces"


@dataclass
class EvalRun:
    """What `run_eval` did: every record of the folder, and how many were run now."""

    out: Path
    records: list[dict[str, Any]]
    ran: int
    skipped: int


def read_results(path: Path) -> list[dict[str, Any]]:
    """The records of a results file; a torn or garbled line (a kill mid-write) is skipped."""
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(path.read_bytes().split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            logger.warning("%s:%d: unreadable line skipped (a write cut short)", path, number)
            continue
        if isinstance(record, dict) and "task_id" in record and "epoch" in record:
            records.append(record)
    return records


def latest_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (task, epoch): the last one written (a retried infra error is replaced)."""
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for record in records:
        last[(record["task_id"], int(record["epoch"]))] = record
    return list(last.values())


def _trace_name(task_id: str, epoch: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", task_id)[:80]
    digest = hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:8]
    return f"{safe}-{digest}-e{epoch}.json"


def episode_record(task: Task, epoch: int, result: AgentResult, model: str, settings: EvalSettings,
                   attempts: int, retried: list[str], trace: str) -> dict[str, Any]:
    """The flat record of one finished (task, epoch), as results.jsonl holds it."""
    totals = result.totals()
    price = settings.price(model)
    cost = (totals["tokens_in"] * price.input_per_mtok + totals["tokens_out"] * price.output_per_mtok) / 1e6 \
        + totals["cpu_s"] / 3600 * price.cpu_hour
    return {
        "task_id": task.id, "epoch": epoch, "model": model, "domain": task.domain,
        "group": str(task.metadata.get("group") or task.id), "difficulty": task.difficulty,
        "max_steps": settings.budgets.max_steps or task.max_steps,
        "outcome": result.outcome.value, "passed": result.outcome is AgentOutcome.PASS,
        "termination": result.termination.value, "detail": result.detail[:2000],
        "reward": result.reward, "tests": result.score.info.get("total") if result.score else None,
        **{k: v for k, v in totals.items()},
        "latency_s": result.wall_s, "acceptance_s": result.acceptance_s, "cost": cost,
        "attempts": attempts, "retried_infra_errors": retried, "trace": trace, "finished_at": time.time(),
    }


class _Writer:
    """Appends records to results.jsonl, one write + flush + fsync each, under a lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        # A torn last line from a killed run must not glue itself to the next record.
        if path.is_file() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            with path.open("ab") as handle:
                handle.write(b"\n")

    def append(self, record: dict[str, Any]) -> None:
        line = (dumps(record) + "\n").encode("utf-8")
        with self.lock, self.path.open("ab") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


def _check_spec(out: Path, spec: dict[str, Any]) -> None:
    path = out / SPEC
    if path.is_file():
        old = json.loads(path.read_text(encoding="utf-8"))
        if old.get("model") != spec["model"]:
            raise EvalError(f"{out} holds an eval of {old.get('model')!r}, not {spec['model']!r}; "
                            "pick another --out to evaluate another model")
        return
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(dumps(spec, indent=2), encoding="utf-8")
    os.replace(tmp, path)
    fsync_path(out)


def agent_config(settings: EvalSettings) -> AgentConfig:
    budgets = settings.budgets
    return AgentConfig(max_steps=budgets.max_steps, max_tokens=budgets.max_tokens,
                       max_new_tokens=budgets.max_new_tokens, wall_time_s=budgets.wall_time_s,
                       context=ContextPolicy(max_observation_chars=budgets.max_observation_chars))


def run_eval(policy: Policy, tasks: Sequence[Task], out: str | Path, backend: SandboxBackend,
             settings: EvalSettings | None = None, *, epochs: int = 1, concurrency: int = 1,
             model: str | None = None, on_result: Callable[[dict[str, Any]], None] | None = None,
             sleep: Callable[[float], None] = time.sleep) -> EvalRun:
    """Run every unfinished (task, epoch) and append its record; see the module docstring."""
    settings = settings or EvalSettings()
    if epochs < 1 or concurrency < 1:
        raise EvalError(f"--epochs ({epochs}) and --concurrency ({concurrency}) must be >= 1")
    out = Path(out)
    model = model or policy.name
    _check_spec(out, {"model": model, "epochs": epochs, "tasks": [t.id for t in tasks],
                      "settings": settings.model_dump(mode="json")})
    (out / TRACES).mkdir(exist_ok=True)
    done = {(r["task_id"], int(r["epoch"])) for r in latest_records(read_results(out / RESULTS))
            if r.get("outcome") != AgentOutcome.INFRA_ERROR.value}
    work = [(task, epoch) for epoch in range(epochs) for task in tasks if (task.id, epoch) not in done]
    writer = _Writer(out / RESULTS)
    config = agent_config(settings)
    store = SessionStore()
    stop = threading.Event()

    def one(task: Task, epoch: int) -> dict[str, Any]:
        retried: list[str] = []
        for attempt in range(1, settings.retries.attempts + 1):
            result = run_episode(task, policy, backend, config, seed=epoch, store=store)
            if result.outcome is not AgentOutcome.INFRA_ERROR or attempt == settings.retries.attempts or stop.is_set():
                break
            retried.append(result.detail[:500])
            sleep(min(settings.retries.backoff_max_s, settings.retries.backoff_s * 2 ** (attempt - 1)))
        trace = f"{TRACES}/{_trace_name(task.id, epoch)}"
        trace_path = out / trace
        trace_path.write_text(dumps({"task_id": task.id, "epoch": epoch, "prompt": task.messages(),
                                     **result.to_record()}), encoding="utf-8")
        record = episode_record(task, epoch, result, model, settings, attempt, retried, trace)
        writer.append(record)
        if on_result is not None:
            on_result(record)
        return record

    ran = 0
    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="tidal-eval") as pool:
            pending: set[Future[dict[str, Any]]] = set()
            queue = list(work)
            while queue or pending:
                while queue and len(pending) < concurrency and not stop.is_set():
                    pending.add(pool.submit(one, *queue.pop(0)))
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    try:
                        future.result()
                        ran += 1
                    except (EndpointAuthError, EndpointConfigError):
                        stop.set()
                        queue.clear()
                        for other in pending:
                            other.cancel()
                        raise
    finally:
        store.close()
    return EvalRun(out, latest_records(read_results(out / RESULTS)), ran, len(done))


def view_of(folder: Path, settings: EvalSettings, baseline: list[dict[str, Any]] | None = None) -> Any:
    """An eval folder's records, summary and checklist, for the report."""
    from tidal.eval.checklist import evaluate_checklist
    from tidal.eval.eval_report import EvalView
    from tidal.eval.metrics import summarize

    spec = json.loads((folder / SPEC).read_text(encoding="utf-8")) if (folder / SPEC).is_file() else {}
    records = latest_records(read_results(folder / RESULTS))
    if not records and not spec:
        raise EvalError(f"{folder}: no {RESULTS}; is it an eval folder (tidal eval --out)?")
    epochs = int(spec.get("epochs", 1))
    summary = summarize(records, epochs)
    summary.update(model=spec.get("model", folder.name), epochs=epochs, tasks=len(spec.get("tasks", [])))
    checklist = evaluate_checklist(summary, records, settings.checklist, epochs, baseline)
    return EvalView(str(summary["model"]), folder, summary, records, checklist)


def finish_eval(out: Path, settings: EvalSettings, baselines: Sequence[Path] = ()) -> dict[str, Any]:
    """Write summary.json (with the checklist) and report.html for `out`, next to `baselines`."""
    from tidal.eval.eval_report import write_eval_report

    first = latest_records(read_results(Path(baselines[0]) / RESULTS)) if baselines else None
    view = view_of(out, settings, first)
    others = [view_of(Path(b), settings) for b in baselines]
    summary = {**view.summary, "checklist": view.checklist}
    with_path = out / "summary.json"
    tmp = with_path.with_suffix(".tmp")
    tmp.write_text(dumps(summary, indent=2), encoding="utf-8")
    os.replace(tmp, with_path)
    write_eval_report([view, *others], out / "report.html")
    return summary


def evaluate(model: str, task_paths: Sequence[str | Path], out: str | Path, *, epochs: int = 1,
             concurrency: int = 1, settings: EvalSettings | None = None, baselines: Sequence[Path] = (),
             on_result: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """`tidal eval`: load the tasks and the model, run what is unfinished, write summary and report."""
    from tidal.agent.policy import make_policy
    from tidal.sandbox import get_backend
    from tidal.tasks.terminal import load_eval_tasks

    settings = settings or EvalSettings()
    tasks = load_eval_tasks(task_paths)
    if not tasks:
        raise EvalError(f"no tasks in {', '.join(map(str, task_paths))}")
    options: dict[str, Any] = {"temperature": settings.temperature}
    if model.startswith("openai:"):
        options.update(api_key_env=settings.api_key_env, timeout_s=settings.request_timeout_s)
    policy = make_policy(model, **options) if model != "oracle" else make_policy(model)
    backend = get_backend(settings.backend)
    run = run_eval(policy, tasks, out, backend, settings, epochs=epochs, concurrency=concurrency, model=model,
                   on_result=on_result)
    summary = finish_eval(run.out, settings, baselines)
    summary.update(ran=run.ran, skipped=run.skipped)
    return summary
