"""Task records for the audit, read leniently and one at a time.

`tidal tasks validate` (and `load_tasks`) raise one error listing every problem, which is right
before training but wrong for an audit: one bad record must not hide the verdicts of the others.
So the audit walks the same files with the loader's own readers and validation (same messages,
`FILE:LINE [task-id] field: message`), and yields every record with its problems, the good ones
as `Task`s. Files are read one at a time and records yielded as they are parsed, so the memory an
audit holds does not grow with the size of a task file's records already audited.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# The loader's readers are private to the tasks layer; the audit reuses them rather than keeping
# a second copy of the file formats and their error messages.
from tidal.tasks.loader import _read_objects, _task_files, _validate
from tidal.types import Task


@dataclass
class Record:
    """One task record: where it is, its id when it has one, the task when it is valid."""

    where: str  # FILE:LINE, or FILE for a problem with the whole file
    task_id: str
    task: Task | None
    problems: list[str] = field(default_factory=list)


def stream_records(paths: Iterable[str | Path], known_verifiers: set[str] | None = None) -> Iterator[Record]:
    """Every record of every task file under `paths`, in the loader's order, never raising for a
    bad record or file: an unreadable file or a path that does not exist is one `Record` with the
    problem and no task."""
    file_problems: list[str] = []
    files = _task_files(list(paths), file_problems)
    for problem in file_problems:
        where = problem.split(": ", 1)[0]
        yield Record(where, where, None, [problem])
    first_defined: dict[str, str] = {}
    for file in files:
        problems: list[str] = []
        for where, data in _read_objects(file, problems):
            # Problems of the file itself (bad bytes, bad JSON lines) come before the next record.
            yield from _file_problems(problems)
            raw_id = data.get("id") if isinstance(data, dict) else None
            task_id = str(raw_id) if isinstance(raw_id, (str, int)) and str(raw_id) else where
            label = f"{where} [{task_id}]" if task_id != where else where
            record_problems: list[str] = []
            task = _validate(label, data, known_verifiers, record_problems)
            if task_id != where:
                if task_id in first_defined:
                    record_problems.append(f"{label} id: duplicate id, first defined at {first_defined[task_id]}")
                else:
                    first_defined[task_id] = where
            yield Record(where, task_id, task if not record_problems else None, record_problems)
        yield from _file_problems(problems)


def _file_problems(problems: list[str]) -> Iterator[Record]:
    while problems:
        problem = problems.pop(0)
        where = problem.split(": ", 1)[0]
        yield Record(where, where, None, [problem])
