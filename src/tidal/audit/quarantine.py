"""The quarantine file: which tasks the audit (or the continuous watch) took out, and why, plus
per-task annotations for the curriculum (`difficulty_estimate`).

    {"version": 1, "created": "...", "quarantined": [{"task_id": "...", "reasons": ["..."]}],
     "annotations": {"task-id": {"verdict": "warn", "difficulty_estimate": 0.75}}}

`tidal train` never samples a quarantined task (config `tasks.quarantine`), and evaluation
reports quarantined eval tasks apart. A plain JSON list of ids is accepted too, for hand-written
lists.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tidal.errors import QuarantineError


def load_quarantine(path: str | Path) -> dict[str, list[str]]:
    """Task id -> reasons, from a quarantine file. Raises `QuarantineError` saying what is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise QuarantineError(f"{path}: cannot read the quarantine list ({error.strerror}); "
                         "write one with `tidal audit TASKS --quarantine PATH`") from error
    except ValueError as error:
        raise QuarantineError(f"{path}: the quarantine list is not valid JSON ({error})") from error
    entries = data.get("quarantined") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise QuarantineError(f"{path}: expected a list of task ids or an object with a 'quarantined' list")
    out: dict[str, list[str]] = {}
    for index, entry in enumerate(entries):
        if isinstance(entry, str):
            out[entry] = []
        elif isinstance(entry, dict) and isinstance(entry.get("task_id"), str):
            reasons = entry.get("reasons", [])
            if not isinstance(reasons, list):
                raise QuarantineError(f"{path}: quarantined[{index}] ({entry['task_id']}): reasons must be a list "
                                      f"of strings, not {type(reasons).__name__}")
            out[entry["task_id"]] = [str(r) for r in reasons]
        else:
            raise QuarantineError(f"{path}: quarantined[{index}]: expected a task id or {{task_id, reasons}}")
    return out


def write_quarantine(path: str | Path, quarantined: Iterable[tuple[str, list[str]]],
                     annotations: dict[str, dict[str, Any]] | None = None, sources: list[str] | None = None) -> None:
    """Write the quarantine file atomically."""
    path = Path(path)
    record = {
        "version": 1,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sources": sources or [],
        "quarantined": [{"task_id": task_id, "reasons": reasons} for task_id, reasons in quarantined],
        "annotations": annotations or {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path)
