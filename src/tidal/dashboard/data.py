"""What the dashboard reads: run folders (metrics.jsonl, guard.jsonl, the trajectory store, the
held-out evals under eval/) and eval folders (results.jsonl, read through tidal.eval). Nothing
here writes; every read goes to the files as they are now, so a live run shows its latest rows."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.errors import TidalError
from tidal.storage.run import MARKER, RunFolder, read_jsonl

GUARD_LOG = "guard.jsonl"  # pipeline/guard_hook.py writes it; read here without importing the pipeline
EVAL_RESULTS = "results.jsonl"
SEARCH_LIMIT = 200


class DashboardError(TidalError):
    """A folder given to the dashboard is neither a run folder nor an eval folder."""


@dataclass(frozen=True)
class Source:
    """One folder the dashboard shows: a training run or an eval."""

    kind: str  # "run" | "eval"
    path: Path

    @property
    def name(self) -> str:
        return self.path.name


def discover(paths: list[Path]) -> list[Source]:
    """The run and eval folders named by `paths`: each one itself, or the folders right under it."""
    found: list[Source] = []
    for path in paths:
        if not path.is_dir():
            raise DashboardError(f"{path}: no such folder")
        own = _kind(path)
        children = [] if own else [Source(k, c) for c in sorted(path.iterdir()) if c.is_dir() and (k := _kind(c))]
        if not own and not children:
            raise DashboardError(f"{path}: neither a run folder ({MARKER}) nor an eval folder ({EVAL_RESULTS}), "
                                 "and no such folder right under it")
        found.extend([Source(own, path)] if own else children)
    return found


def _kind(path: Path) -> str:
    if (path / MARKER).is_file():
        return "run"
    if (path / EVAL_RESULTS).is_file():
        return "eval"
    return ""


def rl_rows(path: Path) -> list[dict[str, Any]]:
    """The RL rows of metrics.jsonl, in file order."""
    return [row for row in RunFolder(path).read_metrics() if row.get("phase") == "rl"]


def guard_events(path: Path) -> list[dict[str, Any]]:
    """guard.jsonl's rows (detections, actions, injected faults); none when the run has no guard log."""
    log = path / GUARD_LOG
    return list(read_jsonl(log)) if log.is_file() else []


def run_state(path: Path) -> str:
    """"finished" once the run wrote summary.json, else "live" (training, or stopped before the end)."""
    return "finished" if (path / "summary.json").is_file() else "live"


def audit_counts(rows: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The audit and quarantine numbers of a run: tasks quarantined by the continuous audit (its
    latest count), the highest tamper rate seen, samples dropped as quarantined, and tasks the
    guard quarantined."""
    last = rows[-1] if rows else {}
    guard_tasks = sorted({t for e in events for t in e.get("tasks") or []})
    return {
        "audit quarantined tasks": last.get("audit/quarantined", 0),
        "highest tamper rate": last.get("audit/max_tamper_rate", 0.0),
        "samples dropped as quarantined": sum(int(r.get("drop/audit_quarantine", 0) or 0) for r in rows),
        "tasks quarantined by the guard": len(guard_tasks),
        "guard detections": sum(e.get("event") == "detected" for e in events),
        "rollbacks": sum("rollback" in (e.get("actions") or []) for e in events),
    }


def heldout_tags(path: Path) -> list[str]:
    """The run's held-out evaluations (eval/<tag>.jsonl), oldest first."""
    folder = path / "eval"
    files = sorted(folder.glob("*.jsonl"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    return [f.stem for f in files]


def search_trajectories(path: Path, text: str = "", domain: str = "", limit: int = SEARCH_LIMIT) -> list[dict[str, Any]]:
    """Trajectories of the run's store (latest version of each id) whose id, task, completion or
    agent turn log contains `text` (case-insensitive), in `domain` when given: DuckDB over the
    store's Parquet segments (storage/query.py), the text passed as a bound parameter."""
    from tidal.storage.cli_support import resolve_store
    from tidal.storage.query import connect, rows_of

    store = resolve_store(str(path), strict=False)
    con = connect(store)
    try:
        table = con.execute(
            "SELECT id, step, domain, task_id, reward, outcome, keep, drop_reason, left(text, 160) AS preview "
            "FROM trajectories WHERE ($text = '' OR contains(lower(id || ' ' || task_id || ' ' || coalesce(text, '') "
            "|| ' ' || coalesce(score_info, '')), lower($text))) AND ($domain = '' OR domain = $domain) "
            "ORDER BY step, id LIMIT $limit",
            {"text": text, "domain": domain, "limit": limit},
        ).to_arrow_table()
    finally:
        con.close()
    return rows_of(table)


def trajectory(path: Path, id: str) -> tuple[dict[str, Any] | None, int | None]:
    """(record, the update that trained it) of trajectory `id` in the run's store."""
    from tidal.storage.cli_support import resolve_store

    store = resolve_store(str(path), strict=False)
    return store.get(id), store.trained().get(id)


def eval_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / EVAL_RESULTS).read_text(encoding="utf-8").splitlines() if line.strip()]
