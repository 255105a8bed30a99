"""What `tidal trajectories ...` does, kept out of cli.py so the CLI imports pyarrow, DuckDB and
rich only when one of these commands runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
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


def show_trajectory(store: TrajectoryStore, id: str, console: Console) -> None:
    """Print trajectory `id` step by step: prompt, completion, tokens, logprobs, reward, gate,
    training, timings. Raises StoreError when the store has no such id."""
    record = store.get(id)
    if record is None:
        raise StoreError(f"trajectory store {store.url!r} has no trajectory {id!r}; list ids with "
                         "`tidal trajectories query RUN \"SELECT id FROM trajectories\"`", store.url)
    trained_at = store.trained().get(id)
    head = (
        f"[bold]{record['id']}[/bold]\ntask {record['task_id']}  domain {record['domain']}  group {record['group_id']}\n"
        f"RL step {record['step']}  weight version {record['weight_version']}  attempt {record['attempt']}  "
        f"written {record['written_at']}"
    )
    console.print(Panel(head, title="trajectory", expand=False))

    console.rule("1. prompt")
    for message in record["prompt_messages"] or []:
        console.print(f"[cyan]{message['role']}[/cyan]: {message['content']}", markup=True, highlight=False)
    console.print(f"{len(record['prompt_ids'] or [])} prompt tokens", style="dim")

    console.rule("2. completion")
    console.print(record["text"], markup=False, highlight=False)
    logprobs = [x for x in record["logprobs"] or []]
    tokens = len(record["token_ids"] or [])
    console.print(f"{tokens} tokens, finish reason {record['finish_reason']}", style="dim")
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
        console.print(f"reward {score['reward']:.4g}  outcome [bold]{score['outcome']}[/bold]")
        if score["components"]:
            table = Table("component", "value", header_style="bold")
            for name, value in sorted(score["components"].items()):
                table.add_row(name, f"{value:.4g}")
            console.print(table)
        if score["detail"]:
            console.print(score["detail"], markup=False, highlight=False)

    console.rule("4. quality gate and training")
    gate = "kept" if record["keep"] else f"dropped: {record['drop_reason']}"
    trained = f"trained at update {trained_at}" if trained_at is not None else "not trained"
    console.print(f"{gate}  advantage {record['advantage']:.4g}  {trained}")

    console.rule("5. timings")
    timings = record["timings"] or {}
    console.print("  ".join(f"{k} {v:.3f}s" for k, v in sorted(timings.items())) or "none recorded")


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
