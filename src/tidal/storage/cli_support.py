"""What `tidal trajectories ...` does, kept out of cli.py so the CLI imports pyarrow, DuckDB and
rich only when one of these commands runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from tidal.errors import StoreError, StoreUnavailableError
from tidal.storage.run import MARKER, RunFolder, dumps
from tidal.storage.segments import SegmentFiles
from tidal.storage.store import (
    MANIFEST,
    TrajectoryStore,
    configured_store_url,
    existing_run_store,
)
from tidal.storage.trajectories import TrajectoryWriter


def resolve_store(target: str, *, strict: bool = True) -> TrajectoryStore:
    """The store named by `target`: a run folder (its `run.trajectory_store` from config.yaml, else
    `<run>/trajectories`) or a store URL/folder. A run of the JSONL era is pointed at `migrate`; a
    run whose store is gone says so, a memory:// one that it ended with the training process."""
    path = Path(target)
    if "://" in target or not (path / MARKER).is_file():
        try:
            return TrajectoryStore.open(target, strict=strict)
        except StoreUnavailableError:
            if _in_process(target):
                raise _ended_with_its_process(target, "") from None
            raise
    run = RunFolder(path)
    store = existing_run_store(run, strict=strict)
    if store is not None:
        return store
    url = configured_store_url(run)
    if _in_process(url):
        raise _ended_with_its_process(url, f"{path}: the run's ")
    if TrajectoryWriter(run).jsonl_steps():
        raise StoreError(
            f"{path}: this run's trajectories are JSONL step files (written before the store); "
            f"convert them with `tidal trajectories migrate {target}`",
            str(run.trajectories_dir),
        )
    if any(row.get("phase") == "rl" for row in run.read_metrics()):
        raise StoreUnavailableError(
            f"{path}: the run trained RL steps, but its trajectory store {url} is not there (no {MANIFEST}): "
            "it was moved or deleted, or this machine sees another filesystem under that URL",
            url,
        )
    raise StoreError(f"{path}: this run has no trajectory store yet at {url} (it has not reached RL)", url)


def _ended_with_its_process(url: str, whose: str) -> StoreUnavailableError:
    return StoreUnavailableError(
        f"{whose or 'the '}trajectory store {url} lived in the training process; nothing to read (a memory:// store "
        "ends with the process that wrote it; set run.trajectory_store to a folder or an object-store URL to keep it)",
        url,
    )


def _in_process(url: str) -> bool:
    """Whether the store at `url` lives only inside the process that made it: fsspec's memory://,
    a dict of that process, which any other process sees empty."""
    from fsspec.implementations.memory import MemoryFileSystem

    try:
        return isinstance(SegmentFiles(url).fs, MemoryFileSystem)
    except StoreUnavailableError:  # an unknown protocol: said where the store was opened
        return False


def print_table(rows: list[dict[str, Any]], columns: list[str], console: Console, max_width: int = 60) -> None:
    """Rows as a rich table; long cells are cut to `max_width` characters."""
    table = Table(show_lines=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(row.get(c), max_width) for c in columns))
    console.print(table)
    console.print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})", style="dim")


def _cell(value: Any, max_width: int) -> str:
    if value is None:
        return "∅"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = value if isinstance(value, str) else dumps(value)
    return text if len(text) <= max_width else text[: max_width - 1] + "…"


def agent_turns(record: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """An agent episode's turn log (pipeline/agent_rollout.py, under `score.info["agent"]`) as
    (how it ended, turns); each turn holds its step record (`step`: tokens, timings, validity, tool
    calls with arguments) and its messages (the model's turn, then the tool results it got). None
    for a single-turn trajectory."""
    log = ((record.get("score") or {}).get("info") or {}).get("agent")
    if not isinstance(log, dict):
        return None
    turns: list[dict[str, Any]] = []
    for message in log.get("messages") or []:
        if message.get("role") == "assistant" or not turns:
            turns.append({"messages": [], "step": None})
        turns[-1]["messages"].append(message)
    steps = list(log.get("steps") or [])
    while len(turns) < len(steps):
        turns.append({"messages": [], "step": None})
    for turn, step in zip(turns, steps):
        turn["step"] = step
    ending = {k: log.get(k) for k in ("termination", "outcome", "wall_s", "acceptance_s")}
    return ending, turns


def format_timings(timings: dict[str, float]) -> str:
    """Timings as `name value`: seconds (keys ending in `_s`) with a unit, counts (e.g. an agent
    episode's `agent_steps`) as plain numbers."""
    parts = []
    for key, value in sorted(timings.items()):
        if key.endswith("_s"):
            parts.append(f"{key} {value:.3f}s")
        else:
            parts.append(f"{key} {int(value) if float(value).is_integer() else f'{value:.4g}'}")
    return "  ".join(parts)


def show_trajectory(store: TrajectoryStore, id: str, console: Console) -> None:
    """Print trajectory `id` step by step: prompt, completion (an agent episode turn by turn: each
    turn's message, tool calls with arguments, tool results and timings), tokens, logprobs, reward
    by component, gate, training, timings. Raises StoreError when the store has no such id."""
    record = store.get(id)
    if record is None:
        raise StoreError(f"trajectory store {store.url!r} has no trajectory {id!r}; list ids with "
                         "`tidal trajectories query RUN \"SELECT id FROM trajectories\"`", store.url)
    trained_at = store.trained().get(id)
    head = (
        f"[bold]{escape(record['id'])}[/bold]\ntask {escape(record['task_id'])}  domain {escape(record['domain'])}  "
        f"group {escape(record['group_id'])}\nRL step {record['step']}  weight version {record['weight_version']}  "
        f"attempt {record['attempt']}  written {record['written_at']}"
    )
    console.print(Panel(head, title="trajectory", expand=False))

    console.rule("1. prompt")
    for message in record["prompt_messages"] or []:
        console.print(f"[cyan]{escape(message['role'])}[/cyan]: {escape(message['content'])}", highlight=False)
    console.print(f"{len(record['prompt_ids'] or [])} prompt tokens", style="dim")

    agent = agent_turns(record)
    console.rule("2. episode, turn by turn" if agent else "2. completion")
    if agent:
        _print_turns(*agent, console)
    else:
        console.print(record["text"], markup=False, highlight=False)
    logprobs = [x for x in record["logprobs"] or []]
    tokens = len(record["token_ids"] or [])
    loss_mask, tool_mask = record.get("loss_mask"), record.get("tool_mask")
    if loss_mask is not None and len(loss_mask) == len(logprobs):  # the summary is of the generated tokens
        logprobs = [x for x, m in zip(logprobs, loss_mask) if m]
    split = ""
    if loss_mask is not None and tool_mask is not None and (not all(loss_mask) or any(tool_mask)):
        split = f" ({sum(loss_mask)} generated and trained on, {sum(tool_mask)} from tools)"
    console.print(f"{tokens} tokens{split}, finish reason {record['finish_reason']}", style="dim")
    if logprobs:
        mean = sum(logprobs) / len(logprobs)
        console.print(
            f"logprobs: sum {sum(logprobs):.3f}  mean {mean:.3f}  min {min(logprobs):.3f}  max {max(logprobs):.3f}  "
            f"perplexity {math.exp(-mean):.3f}",
            style="dim",
        )

    console.rule("3. reward")
    score = record["score"]
    if score is None:
        console.print("not scored")
    else:
        console.print(f"reward {score['reward']:.4g}  outcome [bold]{escape(score['outcome'])}[/bold]")
        if score["components"]:
            table = Table("component", "value", header_style="bold")
            for name, value in sorted(score["components"].items()):
                table.add_row(escape(name), f"{value:.4g}")
            console.print(table)
        if score["detail"]:
            console.print(score["detail"], markup=False, highlight=False)

    console.rule("4. quality gate and training")
    gate = "kept" if record["keep"] else f"dropped: {record['drop_reason']}"
    trained = f"trained at update {trained_at}" if trained_at is not None else "not trained"
    console.print(f"{gate}  advantage {record['advantage']:.4g}  {trained}", markup=False)

    console.rule("5. timings")
    console.print(format_timings(record["timings"] or {}) or "none recorded")


def _print_turns(ending: dict[str, Any], turns: list[dict[str, Any]], console: Console) -> None:
    for number, turn in enumerate(turns, 1):
        step = turn["step"] or {}
        timing = (f"generation {step.get('generation_s', 0):.3f}s  tools {step.get('tool_s', 0):.3f}s  "
                  f"overhead {step.get('overhead_s', 0):.3f}s  tokens in {step.get('tokens_in', 0)} out "
                  f"{step.get('tokens_out', 0)}  {step.get('validity', '')}") if step else "no step record"
        console.print(f"[bold]turn {number}[/bold]  {escape(timing)}", highlight=False)
        if step.get("error"):
            console.print(f"  error: {step['error']}", markup=False, highlight=False, style="red")
        messages = turn["messages"]
        said = 1 if messages and messages[0].get("role") == "assistant" else 0
        for message in messages[:said]:  # the model's turn, then the calls it made, then what they returned
            _print_message(message, console)
        for call in step.get("calls") or []:
            state = "ok" if call.get("ok") else "failed"
            console.print(f"  call {call.get('name')}({call.get('arguments')}) {state} in {call.get('tool_s', 0):.3f}s, "
                          f"{call.get('output_chars', 0)} output chars" + (" (truncated)" if call.get("truncated") else ""),
                          markup=False, highlight=False)
        for message in messages[said:]:
            _print_message(message, console)
    console.print(f"{len(turns)} turns; ended by {ending.get('termination')}, outcome {ending.get('outcome')}, "
                  f"wall {float(ending.get('wall_s') or 0):.3f}s, acceptance {float(ending.get('acceptance_s') or 0):.3f}s",
                  markup=False, style="dim")


def _print_message(message: dict[str, Any], console: Console) -> None:
    console.print(f"  [cyan]{escape(message.get('role', ''))}[/cyan]: {escape(message.get('content', ''))}",
                  highlight=False)


def migrate_jsonl(run_path: Path) -> tuple[int, int]:
    """Copy a JSONL-era run's step files into a store in `<run>/trajectories` (the JSONL files are
    kept). Kept trajectories of steps whose RL metrics row exists are marked trained at their
    step, which is what the synchronous loop did. Returns (trajectories, trained)."""
    run = RunFolder.open(run_path)
    writer = TrajectoryWriter(run)
    store = TrajectoryStore.open(str(run.trajectories_dir), run=run.name, writable=True)
    if store.steps():
        raise StoreError(f"{run.trajectories_dir}: already holds a trajectory store; nothing to migrate", store.url)
    finished = {int(m["step"]) - 1 for m in run.read_metrics() if m.get("phase") == "rl"}
    stored = trained = 0
    for step in writer.jsonl_steps():
        rows = [_row_from_record(r, step) for r in writer.read_jsonl_step(step)]
        if not rows:
            continue
        store.append(rows)
        stored += len(rows)
        if step in finished:
            ids = [row["id"] for row in rows if row["keep"]]
            store.mark_trained(ids, step)
            trained += len(ids)
    return stored, trained


def _row_from_record(record: dict[str, Any], step: int) -> dict[str, Any]:
    score = record.get("score") or None
    return {
        "id": record["id"],
        "step": step,
        "task_id": record["task_id"],
        "domain": record["domain"],
        "group_id": record["group_id"],
        "prompt_messages": [],  # JSONL records held only the prompt's token ids
        "prompt_ids": record["prompt_ids"],
        "token_ids": record["token_ids"],
        "logprobs": record["logprobs"],
        "loss_mask": record.get("loss_mask"),  # absent in JSONL records of older runs: null
        "tool_mask": record.get("tool_mask"),
        "text": record["text"],
        "finish_reason": record["finish_reason"],
        "weight_version": record["weight_version"],
        "reward": score["reward"] if score else None,
        "outcome": score["outcome"] if score else None,
        "reward_components": score["components"] if score else {},
        "score_detail": score["detail"] if score else "",
        "score_info": dumps(score["info"]) if score else "{}",
        "keep": record["keep"],
        "drop_reason": record["drop_reason"],
        "advantage": record["advantage"],
        "timings": record.get("timings") or {},
    }
