"""Task records for the audit, read leniently and one at a time.

`tidal tasks validate` (and `load_tasks`) raise one error listing every problem, which is right
before training but wrong for an audit: one bad record must not hide the verdicts of the others.
So the audit walks the same files with the loader's own readers and validation (same messages,
`FILE:LINE [task-id] field: message`), and yields every record with its problems, the good ones
as `Task`s. Files are read one at a time and records yielded as they are parsed, so the memory an
audit holds does not grow with the size of a task file's records already audited.

Terminal-task folders (instruction.md, task.toml, tests/, solution/, files/; tasks/terminal.py)
are input too: a path that is one, or a folder holding such folders (found at any depth, hidden
folders skipped) and task files outside them. A folder that does not load is one record with
every problem of `load_task_folder`, named by the folder. `input_problems` checks the paths
before anything runs: a path that does not exist or cannot be read, or a folder with no task
file and no task folder, is an `AuditInputError` from `audit_tasks`, never an audit of 0 tasks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# The loader's readers are private to the tasks layer; the audit reuses them rather than keeping
# a second copy of the file formats and their error messages.
from tidal.errors import TaskFormatError
from tidal.tasks.loader import TASK_SUFFIXES, _read_objects, _task_files, _validate
from tidal.tasks.terminal import MARKERS, is_task_folder, load_task_folder
from tidal.types import Task


@dataclass
class Record:
    """One task record: where it is, its id when it has one, the task when it is valid."""

    where: str  # FILE:LINE, or FILE for a problem with the whole file
    task_id: str
    task: Task | None
    problems: list[str] = field(default_factory=list)


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def task_folders(path: Path) -> list[Path]:
    """The terminal-task folders `path` is or holds, in name order."""
    if is_task_folder(path):
        return [path]
    if not path.is_dir():
        return []
    return sorted({p.parent for marker in MARKERS for p in path.rglob(marker)
                   if p.is_file() and not _hidden(p, path) and is_task_folder(p.parent)})


def _split(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """(task folders, paths for the task-file reader with the task folders' files left out)."""
    folders: list[Path] = []
    plain: list[Path] = []
    for path in paths:
        found = task_folders(path)
        folders += [f for f in found if f not in folders]
        if path.is_dir() and found:
            plain += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TASK_SUFFIXES
                            and not _hidden(p, path) and not any(f == p or f in p.parents for f in found))
        elif not found:
            plain.append(path)
    return folders, plain


def input_problems(paths: Iterable[str | Path]) -> list[str]:
    """Why the input holds nothing to audit, per path: missing, unreadable, or a folder with no
    task file and no task folder. Empty when every path can be audited."""
    problems: list[str] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            problems.append(f"{path}: no such file or folder")
        elif not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
            problems.append(f"{path}: cannot be read (permission denied)")
        elif path.is_dir() and not task_folders(path) and not any(
                p.is_file() and p.suffix in TASK_SUFFIXES and not _hidden(p, path) for p in path.rglob("*")):
            problems.append(f"{path}: holds no task files (.jsonl, .yaml, .yml) and no task folders "
                            f"({' or '.join(MARKERS)} with tests/)")
        elif path.is_file() and path.suffix not in TASK_SUFFIXES:
            problems.append(f"{path}: not a task file; task files end in .jsonl, .yaml or .yml, and a task "
                            "folder is named by its folder")
    return problems


def stream_records(paths: Iterable[str | Path], known_verifiers: set[str] | None = None) -> Iterator[Record]:
    """Every record under `paths`: task folders first (in name order), then the records of every
    task file in the loader's order, never raising for a bad record, file or folder: an
    unreadable file or a path that does not exist is one `Record` with the problem and no task."""
    first_defined: dict[str, str] = {}
    folders, plain = _split([Path(p) for p in paths])
    for folder in folders:
        try:
            task = load_task_folder(folder, known_verifiers)
        except TaskFormatError as error:
            yield Record(str(folder), folder.name, None, list(error.problems))
            continue
        clash = [f"{folder} [{task.id}] id: duplicate id, first defined at {first_defined[task.id]}"] \
            if task.id in first_defined else []
        first_defined.setdefault(task.id, str(folder))
        yield Record(str(folder), task.id, None if clash else task, clash)
    file_problems: list[str] = []
    files = _task_files(plain, file_problems)
    for problem in file_problems:
        where = problem.split(": ", 1)[0]
        yield Record(where, where, None, [problem])
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
