"""The terminal-task folder layout (Terminal-Bench/Harbor style) read into `Task` objects.

    my-task/
      instruction.md      the prompt (required)
      task.toml           every other Task field (required; may be empty)
      tests/              acceptance tests (required, at least one file): pytest modules and/or test.sh
      solution/solve.sh   the reference, a shell script run in the workspace (optional)
      files/              the starting workspace (optional)

`task.toml` holds Task fields at the top level, plus Harbor's `[agent] timeout_sec` (kept as
`metadata.agent_timeout_s`) and `[verifier] timeout_sec` (the acceptance run's `limits.timeout_s`);
defaults: `id` = the folder's name, `domain` = agent, `verifier` = python_tests, `max_steps` = 30.
Tests keep their place under `tests/` in the workspace; every file must be UTF-8 text.
`load_task_folder` raises `TaskFolderError` listing every problem of the folder at once, in the
loader's `FOLDER/FILE: message` style (docs/design/agent.md, "Tasks for agents").
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

import tomllib

from tidal.errors import TaskFolderError, TaskFormatError
from tidal.tasks.loader import _validate, load_tasks
from tidal.types import Task

MARKERS = ("task.toml", "instruction.md")
DEFAULT_MAX_STEPS = 30
MAX_FILE_BYTES = 4 << 20
FROM_FILES = {"prompt": "instruction.md", "tests": "tests/", "files": "files/", "reference": "solution/solve.sh"}


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


def load_task_folder(folder: str | Path, known_verifiers: set[str] | None = None) -> Task:
    """One task from a terminal-task folder; TaskFolderError names every missing or bad file and
    every bad field of `task.toml` at once (`known_verifiers`, when given, also checks the
    verifier's name)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskFolderError([f"{folder}: not a folder"])
    problems: list[str] = []
    prompt = _read_instruction(folder, problems)
    settings = _read_settings(folder, problems)
    tests_dir = folder / "tests"
    tests = _read_tree(tests_dir, "tests/", problems, folder) if tests_dir.is_dir() else {}
    _check_tests(folder, tests, problems)
    files = _read_tree(folder / "files", "", problems, folder) if (folder / "files").is_dir() else {}
    reference = _read_solution(folder, problems)
    data = _task_fields(folder, settings, problems)
    # A missing or empty instruction.md is already reported; a stand-in keeps validation from
    # blaming task.toml for the prompt as well.
    data.update(prompt=prompt if prompt.strip() else "(instruction.md)", tests=tests, files=files,
                reference=reference)
    # Field problems are reported against task.toml, the only file that holds fields.
    task = _validate(f"{folder}/task.toml", data, known_verifiers, problems)
    if problems or task is None:
        raise TaskFolderError(problems)
    return task


def _read_instruction(folder: Path, problems: list[str]) -> str:
    instruction = folder / "instruction.md"
    if not instruction.is_file():
        problems.append(f"{folder}/instruction.md: missing; it holds the task's prompt")
        return ""
    try:
        prompt = instruction.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        problems.append(f"{folder}/instruction.md: not UTF-8 text (byte {error.start})")
        return ""
    if not prompt.strip():
        problems.append(f"{folder}/instruction.md: empty; write the task's prompt there")
    return prompt


def _read_settings(folder: Path, problems: list[str]) -> dict[str, Any]:
    toml_path = folder / "task.toml"
    if not toml_path.is_file():
        problems.append(f"{folder}/task.toml: missing; it holds the task's settings (may be empty)")
        return {}
    try:
        settings = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        problems.append(f"{folder}/task.toml: not UTF-8 text (byte {error.start})")
        return {}
    except tomllib.TOMLDecodeError as error:
        problems.append(f"{folder}/task.toml: not valid TOML: {error}")
        return {}
    for name, source in FROM_FILES.items():
        if name in settings:
            problems.append(f"{folder}/task.toml {name}: comes from {source}; remove it from task.toml")
            del settings[name]
    return settings


def _check_tests(folder: Path, tests: dict[str, str], problems: list[str]) -> None:
    """Tests the acceptance run can use: a pytest module or tests/test.sh, every module valid Python."""
    if any(p.startswith(f"{folder}/tests") for p in problems):
        return
    if not tests:
        near = difflib.get_close_matches("tests", [p.name for p in folder.iterdir() if p.is_dir()], n=1)
        hint = f" (found {near[0]}/: rename it to tests/)" if near else ""
        problems.append(f"{folder}/tests/: missing or empty{hint}; put the acceptance tests "
                        "(test_*.py or test.sh) there")
        return
    modules = [n for n in tests if n.endswith(".py") and PurePosixPath(n).name != "conftest.py"]
    if not modules and "tests/test.sh" not in tests:
        problems.append(f"{folder}/tests/: holds no pytest module and no test.sh ({', '.join(sorted(tests))}); "
                        "the acceptance run needs one of them")
    for name in sorted(n for n in tests if n.endswith(".py")):
        try:
            compile(tests[name], name, "exec", dont_inherit=True)
        except SyntaxError as error:
            problems.append(f"{folder}/{name}:{error.lineno}: not valid Python: {error.msg}")


def _read_solution(folder: Path, problems: list[str]) -> str | None:
    solve = folder / "solution" / "solve.sh"
    if not solve.is_file():
        if (folder / "solution").is_dir():
            problems.append(f"{folder}/solution/solve.sh: missing; solution/ must hold the reference as solve.sh")
        return None
    try:
        reference = solve.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        problems.append(f"{folder}/solution/solve.sh: not UTF-8 text (byte {error.start})")
        return None
    if not reference.strip():
        problems.append(f"{folder}/solution/solve.sh: empty; write the reference solution or remove solution/")
    return reference


def _task_fields(folder: Path, settings: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """Task fields from task.toml, with Harbor's [agent]/[verifier] tables folded in."""
    where = f"{folder}/task.toml"
    data = dict(settings)
    metadata = data.pop("metadata", {})
    if not isinstance(metadata, dict):
        problems.append(f"{where} metadata: must be a table, got {type(metadata).__name__}")
        metadata = {}
    metadata = dict(metadata)
    agent = data.pop("agent", None)
    if agent is not None and not isinstance(agent, dict):
        problems.append(f"{where} agent: must be a table ([agent] timeout_sec = ...), got {type(agent).__name__}")
    elif isinstance(agent, dict) and "timeout_sec" in agent:
        metadata["agent_timeout_s"] = agent["timeout_sec"]
    verifier = data.get("verifier")
    if isinstance(verifier, dict) and "name" not in verifier:
        data.pop("verifier")
        if "timeout_sec" in verifier:
            limits = data.get("limits") or {}
            if isinstance(limits, dict):  # another type is reported by validation below
                data["limits"] = {"timeout_s": verifier["timeout_sec"], **limits}
    data.setdefault("id", folder.name)
    data.setdefault("domain", "agent")
    data.setdefault("verifier", {"name": "python_tests"})
    data.setdefault("max_steps", DEFAULT_MAX_STEPS)
    metadata.setdefault("source", str(folder))
    data["metadata"] = metadata
    return data


def load_eval_tasks(paths: Iterable[str | Path], known_verifiers: set[str] | None = None) -> list[Task]:
    """Tasks from task files (.jsonl/.yaml), task folders, and folders holding either, in order.

    Every problem in every source is reported at once (TaskFormatError); `known_verifiers`, when
    given, is the set of registered verifier names a task may use."""
    problems: list[str] = []
    found: list[tuple[Task, str]] = []  # (task, where it came from) for the duplicate-id check
    for raw in paths:
        path = Path(raw)
        folders = [path] if is_task_folder(path) else (
            sorted({p.parent for marker in MARKERS for p in path.rglob(marker) if not any(
                part.startswith(".") for part in p.relative_to(path).parts)}) if path.is_dir() else [])
        for folder in folders:
            try:
                found.append((load_task_folder(folder, known_verifiers), str(folder)))
            except TaskFormatError as error:
                problems += error.problems
        if path.is_dir() and path not in folders:
            inside = [p for p in path.rglob("*") if p.suffix in (".jsonl", ".yaml", ".yml")
                      and not any(f in p.parents for f in folders)
                      and not any(part.startswith(".") for part in p.relative_to(path).parts)]
            if inside:
                try:
                    found += [(task, str(path)) for task in load_tasks(sorted(inside), known_verifiers)]
                except TaskFormatError as error:
                    problems += error.problems
            elif not folders:
                problems.append(f"{path}: holds no task files and no task folders")
        elif not path.is_dir():
            try:
                found += [(task, str(path)) for task in load_tasks([path], known_verifiers)]
            except TaskFormatError as error:
                problems += error.problems
    sources: dict[str, list[str]] = {}
    for task, source in found:
        sources.setdefault(task.id, []).append(source)
    problems += [f"[{task_id}] id: defined {len(where)} times ({', '.join(where)})"
                 for task_id, where in sources.items() if len(where) > 1]
    if problems:
        raise TaskFormatError(problems)
    return [task for task, _ in found]
