"""The evaluation harness: every (task, epoch) of a suite, results as they finish.

Every kind of task runs here. An agent task (tools, or more than one step: `is_multi_turn`) is an
episode in a sandbox judged by its acceptance tests (agent/runner.py); a single-turn task (math,
knowledge, reasoning, general, code with tests) is one answer judged by its verifier, as a train
run's held-out evaluation judges it (answers.py). Both end in one outcome taxonomy
(`AgentOutcome`).

    out/
      eval.json        what this eval is: model, task ids, epochs (a resume must match it)
      quarantine.json  the tasks this run skipped (`--quarantine`), with the audit's reasons
      results.jsonl    one record per finished (task, epoch), appended, flushed and fsynced
      traces/          one JSON per finished (task, epoch): messages and per-step records
      summary.json     metrics (metrics.py), rewritten at the end
      report.html      plots and the selection checklist (eval_report.py)

A rerun with the same `out` skips every (task, epoch) with a record whose outcome is not
`infra_error`; a torn last line is ignored. Infra errors are retried with backoff, reported apart
and never counted as failures; `EndpointAuthError` and `EndpointConfigError` stop the eval at once,
keeping every result written. A local model's single-turn answers (every task x epoch) go through
its engine as one continuously batched stream (stream.py), whatever `concurrency` is. Episodes
(and every answer of another policy) run `concurrency` at a time in threads, since they mostly
wait on sandboxes or HTTP; a local model batches their waiting turns (agent/local.py).
`evaluate` picks the concurrency for the model when it is not given (`default_concurrency`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.agent.policy import Policy
from tidal.agent.records import AgentOutcome, AgentResult
from tidal.agent.runner import run_episode
from tidal.errors import EndpointAuthError, EndpointConfigError, EvalError
from tidal.eval.answers import Answer, ScoreMany, answer_task, context_window
from tidal.eval.index import compute_index, read_task_set, write_task_set
from tidal.eval.layers import agent_config
from tidal.eval.prices import cost_of, resolve_price
from tidal.eval.results import (
    QUARANTINE,
    RESULTS,
    SPEC,
    TRACES,
    latest_records,
    read_results,
)
from tidal.eval.settings import EvalSettings
from tidal.eval.speed import speed_fields, step_fields
from tidal.eval.stream import stream_answers, streams
from tidal.sandbox.base import SandboxBackend
from tidal.sandbox.session import SessionStore
from tidal.storage.run import dumps, fsync_path
from tidal.types import Task, is_multi_turn

logger = logging.getLogger(__name__)
@dataclass
class EvalRun:
    """What `run_eval` did: every record of the folder, and how many were run now."""

    out: Path
    records: list[dict[str, Any]]
    ran: int
    skipped: int


def _trace_name(task_id: str, epoch: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", task_id)[:80]
    digest = hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:8]
    return f"{safe}-{digest}-e{epoch}.json"


def _common(task: Task, epoch: int, model: str, settings: EvalSettings, outcome: AgentOutcome,
            totals: dict[str, float]) -> dict[str, Any]:
    """The fields every record has, whatever the kind of task."""
    price = resolve_price(model, settings)  # None: unknown, and the cost is None rather than 0
    cost = cost_of(price, totals["tokens_in"], totals["tokens_out"], totals["cpu_s"])
    return {
        "task_id": task.id, "epoch": epoch, "model": model, "domain": task.domain,
        "group": str(task.metadata.get("group") or task.id), "difficulty": task.difficulty,
        "outcome": outcome.value, "passed": outcome is AgentOutcome.PASS, **totals, "cost": cost,
        "price_source": price.source if price else "unknown",
    }


def episode_record(task: Task, epoch: int, result: AgentResult, model: str, settings: EvalSettings,
                   attempts: int, retried: list[str], trace: str) -> dict[str, Any]:
    """The flat record of one finished (task, epoch) of an agent task, as results.jsonl holds it."""
    return {
        **_common(task, epoch, model, settings, result.outcome, result.totals()), **step_fields(result.steps),
        "kind": "episode",
        "max_steps": settings.budgets.max_steps or task.max_steps,
        "termination": result.termination.value, "detail": result.detail[:2000],
        "reward": result.reward, "tests": result.score.info.get("total") if result.score else None,
        "latency_s": result.wall_s, "acceptance_s": result.acceptance_s,
        "attempts": attempts, "retried_infra_errors": retried, "trace": trace, "finished_at": time.time(),
    }


def answer_record(task: Task, epoch: int, answer: Answer, model: str, settings: EvalSettings,
                  attempts: int, retried: list[str], trace: str) -> dict[str, Any]:
    """The flat record of one finished (task, epoch) of a single-turn task: one step, no calls."""
    totals = {"steps": 1, "tokens_in": answer.tokens_in, "tokens_out": answer.tokens_out,
              "generation_s": answer.generation_s, "tool_s": 0.0,
              "overhead_s": max(0.0, answer.wall_s - answer.generation_s), "cpu_s": answer.cpu_s,
              "calls_valid": 0, "calls_invalid": 0, "failures_followed": 0, "recoveries": 0}
    return {
        **_common(task, epoch, model, settings, answer.outcome, totals), "kind": "answer", "max_steps": 1,
        **speed_fields([[answer.tokens_out, answer.generation_s, answer.first_token_s]] if answer.tokens_out else []),
        "max_context_tokens": answer.tokens_in, "tool_calls": 0, "tool_calls_failed": 0,
        "tool_failures_recovered": 0,
        "termination": answer.finish_reason or "not_generated", "detail": answer.detail[:2000],
        "reward": answer.reward, "tests": answer.score.info.get("total") if answer.score else None,
        "verdict": answer.score.outcome.value if answer.score else None,
        "latency_s": answer.wall_s, "acceptance_s": 0.0,
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


def _write_quarantine(out: Path, tasks: Sequence[Task], quarantine: Mapping[str, list[str]]) -> None:
    """The tasks of this suite that this run skips, with their reasons (view_of leaves them out)."""
    skipped = [{"task_id": t.id, "domain": t.domain, "reasons": list(quarantine[t.id])}
               for t in tasks if t.id in quarantine]
    tmp = (out / QUARANTINE).with_suffix(".tmp")
    tmp.write_text(dumps({"quarantined": skipped}, indent=2), encoding="utf-8")
    os.replace(tmp, out / QUARANTINE)


def run_eval(policy: Policy, tasks: Sequence[Task], out: str | Path, backend: SandboxBackend,
             settings: EvalSettings | None = None, *, epochs: int = 1, concurrency: int = 1,
             model: str | None = None, on_result: Callable[[dict[str, Any]], None] | None = None,
             sleep: Callable[[float], None] = time.sleep, score_many: ScoreMany | None = None,
             quarantine: Mapping[str, list[str]] | None = None) -> EvalRun:
    """Run every unfinished (task, epoch) and append its record; see the module docstring.
    Single-turn answers are scored by `score_many` (default: a `Scorer` on `backend`); tasks in
    `quarantine` (id -> reasons, audit/quarantine.py) are skipped and listed in quarantine.json."""
    settings = settings or EvalSettings()
    if epochs < 1 or concurrency < 1:
        raise EvalError(f"--epochs ({epochs}) and --concurrency ({concurrency}) must be >= 1")
    out = Path(out)
    model = model or policy.name
    _check_spec(out, {"model": model, "epochs": epochs, "tasks": [t.id for t in tasks],
                      "settings": settings.model_dump(mode="json")})
    (out / TRACES).mkdir(exist_ok=True)
    _write_quarantine(out, tasks, quarantine or {})
    tasks = [t for t in tasks if t.id not in (quarantine or {})]
    write_task_set(out, tasks)  # what an index may be compared on (index.py)
    done = {(r["task_id"], int(r["epoch"])) for r in latest_records(read_results(out / RESULTS))
            if r.get("outcome") != AgentOutcome.INFRA_ERROR.value}
    work = [(task, epoch) for epoch in range(epochs) for task in tasks if (task.id, epoch) not in done]
    writer = _Writer(out / RESULTS)
    config = agent_config(settings, policy)  # prompt layers, compression, the context window (layers.py)
    window = context_window(policy)
    store = SessionStore()
    stop = threading.Event()
    scorer = None
    if score_many is None and any(not is_multi_turn(task) for task, _ in work):
        from tidal.config.schema import RewardConfig
        from tidal.reward.scorer import Scorer

        scorer = Scorer(RewardConfig(), backend=backend)
        score_many = scorer.score_many

    def attempt(task: Task, epoch: int) -> tuple[AgentOutcome, str, Callable[[int, list[str], str], dict[str, Any]],
                                                 dict[str, Any]]:
        """One try: its outcome, detail, the record it makes, and its trace."""
        if is_multi_turn(task):
            result = run_episode(task, policy, backend, config, seed=epoch, store=store)
            return (result.outcome, result.detail,
                    lambda tries, retried, trace: episode_record(task, epoch, result, model, settings, tries, retried, trace),
                    result.to_record())
        assert score_many is not None
        answer = answer_task(policy, task, score_many, seed=epoch, max_new_tokens=settings.budgets.max_new_tokens,
                             window=window)
        return (answer.outcome, answer.detail,
                lambda tries, retried, trace: answer_record(task, epoch, answer, model, settings, tries, retried, trace),
                _answer_trace(answer))

    def write(task: Task, epoch: int, make_record: Callable[[int, list[str], str], dict[str, Any]],
              trace_record: dict[str, Any], tries: int, retried: list[str]) -> dict[str, Any]:
        trace = f"{TRACES}/{_trace_name(task.id, epoch)}"
        (out / trace).write_text(dumps({"task_id": task.id, "epoch": epoch, "prompt": task.messages(), **trace_record}),
                                 encoding="utf-8")
        record = make_record(tries, retried, trace)
        writer.append(record)
        if on_result is not None:
            on_result(record)
        return record

    def finish_answer(task: Task, epoch: int, answer: Answer, tries: int, retried: list[str]) -> None:
        write(task, epoch, lambda t, r, trace: answer_record(task, epoch, answer, model, settings, t, r, trace),
              _answer_trace(answer), tries, retried)

    def one(task: Task, epoch: int) -> dict[str, Any]:
        retried: list[str] = []
        for tries in range(1, settings.retries.attempts + 1):
            outcome, detail, make_record, trace_record = attempt(task, epoch)
            if outcome is not AgentOutcome.INFRA_ERROR or tries == settings.retries.attempts or stop.is_set():
                break
            retried.append(detail[:500])
            sleep(min(settings.retries.backoff_max_s, settings.retries.backoff_s * 2 ** (tries - 1)))
        return write(task, epoch, make_record, trace_record, tries, retried)

    # A local model's single-turn answers go through its engine as one batched stream (stream.py).
    streamed = [(t, e) for t, e in work if not is_multi_turn(t)] if streams(policy) else []
    ran = 0
    try:
        if streamed:
            assert score_many is not None
            ran += stream_answers(policy, streamed, score_many, finish_answer, window=window, retries=settings.retries,
                                  max_new_tokens=settings.budgets.max_new_tokens, sleep=sleep)
            work = [(t, e) for t, e in work if is_multi_turn(t)]
        ran += _run_all(work, one, concurrency, stop)
    finally:
        store.close()
        if scorer is not None:
            scorer.close()
    return EvalRun(out, latest_records(read_results(out / RESULTS)), ran, len(done))


def _answer_trace(answer: Answer) -> dict[str, Any]:
    return {"kind": "answer", "outcome": answer.outcome.value, "answer": answer.text, "detail": answer.detail,
            "score": answer.score.to_dict() if answer.score else None, "finish_reason": answer.finish_reason}


def _run_all(work: list[tuple[Task, int]], one: Callable[[Task, int], dict[str, Any]], concurrency: int,
             stop: threading.Event) -> int:
    """Run `one` on every (task, epoch), `concurrency` at a time; how many finished. An auth or
    config error of the endpoint sets `stop`, cancels what waits, and propagates."""
    ran = 0
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
    return ran


def view_of(folder: Path, settings: EvalSettings, baseline: list[dict[str, Any]] | None = None) -> Any:
    """An eval folder's records, summary and checklist, for the report."""
    from tidal.eval.checklist import evaluate_checklist
    from tidal.eval.eval_report import EvalView
    from tidal.eval.metrics import summarize

    spec = json.loads((folder / SPEC).read_text(encoding="utf-8")) if (folder / SPEC).is_file() else {}
    quarantined = (json.loads((folder / QUARANTINE).read_text(encoding="utf-8"))["quarantined"]
                   if (folder / QUARANTINE).is_file() else [])
    skipped = {entry["task_id"] for entry in quarantined}
    records = latest_records(read_results(folder / RESULTS))
    if not records and not spec:
        raise EvalError(f"{folder}: no {RESULTS}; is it an eval folder (tidal eval --out)?")
    records = [r for r in records if r["task_id"] not in skipped]  # run before the task was quarantined
    epochs = int(spec.get("epochs", 1))
    temperature = spec.get("settings", {}).get("temperature", settings.temperature)
    summary = summarize(records, epochs, temperature)
    summary.update(model=spec.get("model", folder.name), epochs=epochs, tasks=len(spec.get("tasks", [])),
                   quarantined=quarantined, temperature=temperature,
                   interval_note=interval_note(summary, epochs, temperature))
    checklist = evaluate_checklist(summary, records, settings.checklist, epochs, baseline)
    summary["index"] = compute_index(records, settings.index, read_task_set(folder)["hash"])
    return EvalView(str(summary["model"]), folder, summary, records, checklist, summary["index"])


def repeat_warning(epochs: int, temperature: float) -> str | None:
    """What to tell a user who repeats greedy episodes: they add nothing but cost."""
    if epochs <= 1 or temperature > 0:
        return None
    return (f"--epochs {epochs} at temperature 0: the repeats of a task are identical (greedy decoding), so "
            "pass@k = pass^k = pass@1 and they add no information; the interval is over tasks, as if each "
            "had run once. Set temperature > 0 in the eval config to measure consistency across repeats.")


def interval_note(summary: dict[str, Any], epochs: int, temperature: float) -> str:
    """What the headline interval means, in a sentence for the report."""
    interval = summary.get("interval") or {}
    clusters, samples = interval.get("clusters", 0), interval.get("samples", 0)
    if samples <= clusters:
        return (f"95% Wilson interval over {clusters} tasks, one scored episode each: the tasks are the "
                "independent samples, and the interval says how the rate would move on another draw of tasks.")
    text = (f"95% interval clustered by task over {clusters} tasks and {samples} scored episodes (design "
            f"effect {interval.get('design_effect', 1.0):.2f}: episodes of one task are not independent draws, "
            "so the interval is about another draw of tasks, not only of episodes)")
    if epochs > 1 and temperature == 0:
        text += "; at temperature 0 the repeats are identical, so it is the interval over tasks"
    return text + "."


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


ENDPOINT_CONCURRENCY = 8  # requests at a time to an endpoint, and episodes at a time of the oracle


def default_concurrency(policy: Policy) -> int:
    """Episodes at a time when the user gives none: a local model takes as many as its turn batch
    holds (its single-turn answers are all in flight anyway, stream.py); an endpoint or the oracle
    a bounded number."""
    if streams(policy):
        return max(1, int(getattr(policy, "max_batch", ENDPOINT_CONCURRENCY)))
    return ENDPOINT_CONCURRENCY


def evaluate(model: str, task_paths: Sequence[str | Path], out: str | Path, *, epochs: int = 1,
             concurrency: int | None = None, settings: EvalSettings | None = None, baselines: Sequence[Path] = (),
             on_result: Callable[[dict[str, Any]], None] | None = None, quarantine: str | Path | None = None,
             warn: Callable[[str], None] = logger.warning, limit: int | None = None) -> dict[str, Any]:
    """`tidal eval`: load the tasks and the model, run what is unfinished, write summary and report.
    `quarantine`: an audit's quarantine file, read before anything runs (QuarantineError);
    `limit`: the first N tasks only; `concurrency` None: `default_concurrency`."""
    from tidal.agent.policy import make_policy
    from tidal.audit.quarantine import load_quarantine
    from tidal.sandbox import get_backend
    from tidal.tasks.terminal import load_eval_tasks

    settings = settings or EvalSettings()
    skip = load_quarantine(quarantine) if quarantine is not None else {}
    tasks = load_eval_tasks(task_paths)
    if not tasks:
        raise EvalError(f"no tasks in {', '.join(map(str, task_paths))}")
    if limit is not None:
        tasks = tasks[:limit]
    note = repeat_warning(epochs, settings.temperature)
    if note:
        warn(note)
    options: dict[str, Any] = {"temperature": settings.temperature}
    if model.startswith("openai:"):
        options.update(api_key_env=settings.api_key_env, timeout_s=settings.request_timeout_s, stream=settings.stream)
    else:
        options.update(stop=list(settings.stop))
    policy = make_policy(model, **options) if model != "oracle" else make_policy(model)
    backend = get_backend(settings.backend)
    concurrency = concurrency if concurrency is not None else default_concurrency(policy)
    run = run_eval(policy, tasks, out, backend, settings, epochs=epochs, concurrency=concurrency, model=model,
                   on_result=on_result, quarantine=skip)
    summary = finish_eval(run.out, settings, baselines)
    summary.update(ran=run.ran, skipped=run.skipped)
    return summary
