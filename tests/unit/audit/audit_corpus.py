"""The broken-task corpus of examples/broken_tasks, for the audit tests."""

from __future__ import annotations

from pathlib import Path

import yaml

from tidal.types import Task

CORPUS = Path(__file__).resolve().parents[3] / "examples" / "broken_tasks"


def corpus_tasks() -> dict[str, Task]:
    """Every task of the corpus YAML files, by id (invalid.jsonl is read by the audit only)."""
    tasks: dict[str, Task] = {}
    for path in sorted(CORPUS.glob("*.yaml")):
        for record in yaml.safe_load(path.read_text()):
            tasks[record["id"]] = Task.model_validate(record)
    return tasks


def expected(task_metadata: dict) -> set[str]:
    """The checks `metadata.expect` says must flag the task (empty for ok)."""
    value = task_metadata.get("expect", "ok")
    names = value if isinstance(value, list) else [value]
    return {name for name in names if name != "ok"}
