"""An eval folder's files and how its results file is read back (a torn last line is skipped)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RESULTS = "results.jsonl"
SPEC = "eval.json"
QUARANTINE = "quarantine.json"
TRACES = "traces"


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
