"""The terminal-task folder layout (Terminal-Bench/Harbor style) read into `Task` objects.

    my-task/
      instruction.md      the prompt (required)
      task.toml           every other Task field (required; may be empty)
      tests/              acceptance tests (required, at least one file): pytest modules and/or test.sh
      solution/solve.sh   the reference, a shell script run in the workspace (optional)
      files/              the starting workspace (optional)

`task.toml` holds Task fields at the top level (`id`, `domain`, `max_steps`, `tools`, `limits`,
`image`, `split`, `verifier`, `metadata`), plus Harbor's `[agent] timeout_sec` (kept as
`metadata.agent_timeout_s`) and `[verifier] timeout_sec` (the acceptance run's `limits.timeout_s`).
Defaults: `id` = the folder's name, `domain` = agent, `verifier` = python_tests, `max_steps` = 30.
Tests keep their place under `tests/` in the workspace (so `tests/test_outputs.py`), and files
come from `files/` at the workspace root. Every file must be UTF-8 text.

`load_task_folder` raises `TaskFolderError` listing every problem of the folder at once, each as
`FOLDER/FILE: message`; `load_eval_tasks` reads task files and task folders together.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tomllib
from pydantic import ValidationError

from tidal.errors import TaskFolderError, TaskFormatError
from tidal.tasks.loader import load_tasks
from tidal.types import Task

MARKERS = ("task.toml", "instruction.md")
DEFAULT_MAX_STEPS = 30
MAX_FILE_BYTES = 4 << 20


def is_task_folder(path: Path) -> bool:
    return path.is_dir() and any((path / marker).is_file() for marker in MARKERS)


def _read_tree(root: Path, prefix: str, problems: list[str], where: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()):
        relative = path.relative_to(root).as_posix()
        label = f"{where}/{path.relative_to(where).as_posix()}"
        if path.is_symlink():
            problems.append(f"{label}: a symlink; task folders hold regular files only")
            continue
        data = path.read_bytes()
        if len(data) > MAX_FILE_BYTES:
            problems.append(f"{label}: larger than {MAX_FILE_BYTES >> 20} MiB")
            continue
        try:
            files[prefix + relative] = data.decode("utf-8")
        except UnicodeDecodeError as error:
            problems.append(f"{label}: not UTF-8 text (byte {error.start}); tasks hold text files only")
    return files


def load_task_folder(folder: str | Path) -> Task:
    """One task from a terminal-task folder; TaskFolderError names every missing or bad file."""
    folder = Path(folder)
    problems: list[str] = []
    if not folder.is_dir():
        raise TaskFolderError([f"{folder}: not a folder"])
    instruction = folder / "instruction.md"
    prompt = ""
    if not instruction.is_file():
        problems.append(f"{folder}/instruction.md: missing; it holds the task's prompt")
    else:
        try:
            prompt = instruction.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            problems.append(f"{folder}/instruction.md: not UTF-8 text")
        if instruction.is_file() and not prompt.strip():
            problems.append(f"{folder}/instruction.md: empty")
    settings: dict[str, Any] = {}
    toml_path = folder / "task.toml"
    if not toml_path.is_file():
        problems.append(f"{folder}/task.toml: missing; it holds the task's settings (may be empty)")
    else:
        try:
            settings = tomllib.loads(toml_path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            problems.append(f"{folder}/task.toml: not valid TOML: {error}")
    tests_dir = folder / "tests"
    tests = _read_tree(tests_dir, "tests/", problems, folder) if tests_dir.is_dir() else {}
    if not tests and not any(p.startswith(f"{folder}/tests") for p in problems):
        problems.append(f"{folder}/tests/: missing or empty; put the acceptance tests (test_*.py or test.sh) there")
    files = _read_tree(folder / "files", "", problems, folder) if (folder / "files").is_dir() else {}
    solve = folder / "solution" / "solve.sh"
    reference = None
    if solve.is_file():
        try:
            reference = solve.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            problems.append(f"{folder}/solution/solve.sh: not UTF-8 text")
    if problems:
        raise TaskFolderError(problems)
    data = _task_fields(folder, settings)
    data.update(prompt=prompt, tests=tests, files=files, reference=reference)
    try:
        return Task.model_validate(data)
    except ValidationError as error:
        lines = [f"{folder}/task.toml {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()]
        raise TaskFolderError(lines) from None


def _task_fields(folder: Path, settings: dict[str, Any]) -> dict[str, Any]:
    data = dict(settings)
    metadata = dict(data.pop("metadata", {}) or {})
    agent = data.pop("agent", None)
    if isinstance(agent, dict) and "timeout_sec" in agent:
        metadata["agent_timeout_s"] = agent["timeout_sec"]
    verifier = data.get("verifier")
    if isinstance(verifier, dict) and "name" not in verifier:
        data.pop("verifier")
        if "timeout_sec" in verifier:
            limits = dict(data.get("limits") or {})
            limits.setdefault("timeout_s", verifier["timeout_sec"])
            data["limits"] = limits
    data.setdefault("id", folder.name)
    data.setdefault("domain", "agent")
    data.setdefault("verifier", {"name": "python_tests"})
    data.setdefault("max_steps", DEFAULT_MAX_STEPS)
    metadata.setdefault("source", str(folder))
    data["metadata"] = metadata
    return data


def load_eval_tasks(paths: Iterable[str | Path]) -> list[Task]:
    """Tasks from task files (.jsonl/.yaml), task folders, and folders holding either, in order.

    Every problem in every source is reported at once (TaskFormatError)."""
    problems: list[str] = []
    tasks: list[Task] = []
    for raw in paths:
        path = Path(raw)
        folders = [path] if is_task_folder(path) else (
            sorted({p.parent for marker in MARKERS for p in path.rglob(marker) if not any(
                part.startswith(".") for part in p.relative_to(path).parts)}) if path.is_dir() else [])
        for folder in folders:
            try:
                tasks.append(load_task_folder(folder))
            except TaskFormatError as error:
                problems += error.problems
        if path.is_dir() and path not in folders:
            inside = [p for p in path.rglob("*") if p.suffix in (".jsonl", ".yaml", ".yml")
                      and not any(f in p.parents for f in folders)]
            if inside:
                try:
                    tasks += load_tasks(sorted(inside))
                except TaskFormatError as error:
                    problems += error.problems
            elif not folders:
                problems.append(f"{path}: holds no task files and no task folders")
        elif not path.is_dir():
            try:
                tasks += load_tasks([path])
            except TaskFormatError as error:
                problems += error.problems
    seen: dict[str, int] = {}
    for task in tasks:
        seen[task.id] = seen.get(task.id, 0) + 1
    problems += [f"[{task_id}] id: defined {count} times" for task_id, count in seen.items() if count > 1]
    if problems:
        raise TaskFormatError(problems)
    return tasks
