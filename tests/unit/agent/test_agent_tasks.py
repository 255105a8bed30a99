"""The `agent` family and terminal-task folders: references pass, a do-nothing agent fails,
folders with missing files are typed errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.agent import AgentOutcome, OraclePolicy, ScriptedPolicy, run_episode
from tidal.errors import TaskFolderError, TaskFormatError
from tidal.sandbox.base import SandboxBackend
from tidal.tasks import generate_tasks
from tidal.tasks.terminal import load_eval_tasks, load_task_folder


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_reference_passes_and_doing_nothing_fails(bwrap: SandboxBackend, level: int) -> None:
    task = generate_tasks("agent", 1, "eval", seed=7, min_difficulty=level, max_difficulty=level)[0]
    assert task.domain == "agent" and task.difficulty == level and task.max_steps == 4 + 2 * level
    passed = run_episode(task, OraclePolicy(), bwrap)
    assert passed.outcome is AgentOutcome.PASS, passed.detail
    idle = run_episode(task, ScriptedPolicy([]), bwrap)
    assert idle.outcome is AgentOutcome.STEP_LIMIT, idle.detail
    assert idle.score is not None and idle.score.value < 1.0


def test_generation_is_deterministic_and_keeps_workspaces() -> None:
    a = generate_tasks("agent", 10, "train", seed=1, min_difficulty=1, max_difficulty=5)
    b = generate_tasks("agent", 10, "train", seed=1, min_difficulty=1, max_difficulty=5)
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    assert any(t.files for t in a) and all(t.tools for t in a)


def _folder(root: Path, name: str = "hello", test_sh: bool = False) -> Path:
    folder = root / name
    (folder / "tests").mkdir(parents=True)
    (folder / "solution").mkdir()
    (folder / "files").mkdir()
    (folder / "instruction.md").write_text("Copy in.txt to out.txt.\n")
    (folder / "task.toml").write_text('max_steps = 5\n[metadata]\ngroup = "copy"\n[verifier]\ntimeout_sec = 30\n')
    (folder / "files" / "in.txt").write_text("payload\n")
    (folder / "solution" / "solve.sh").write_text("cp in.txt out.txt\n")
    if test_sh:
        (folder / "tests" / "test.sh").write_text('#!/bin/sh\n[ "$(cat out.txt)" = payload ]\n')
    else:
        (folder / "tests" / "test_outputs.py").write_text(
            "def test_copy():\n    assert open('out.txt').read() == 'payload\\n'\n")
    return folder


@pytest.mark.parametrize("test_sh", [False, True])
def test_terminal_folder_runs_like_any_task(bwrap: SandboxBackend, tmp_path: Path, test_sh: bool) -> None:
    task = load_task_folder(_folder(tmp_path, test_sh=test_sh))
    assert (task.id, task.domain, task.max_steps, task.limits.timeout_s) == ("hello", "agent", 5, 30)
    assert task.files == {"in.txt": "payload\n"} and task.metadata["group"] == "copy"
    assert run_episode(task, OraclePolicy(), bwrap).outcome is AgentOutcome.PASS
    assert run_episode(task, ScriptedPolicy([]), bwrap).outcome is AgentOutcome.STEP_LIMIT


def test_missing_files_are_all_reported(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "instruction.md").write_text("do it")
    with pytest.raises(TaskFolderError) as caught:
        load_task_folder(folder)
    text = str(caught.value)
    assert "broken/task.toml: missing" in text and "broken/tests/: missing" in text
    (folder / "task.toml").write_text("max_steps = 0\n")
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text("true\n")
    with pytest.raises(TaskFolderError, match=r"task.toml max_steps"):
        load_task_folder(folder)


def test_load_eval_tasks_reads_folders_and_files_together(tmp_path: Path) -> None:
    _folder(tmp_path / "suite", "one")
    _folder(tmp_path / "suite", "two", test_sh=True)
    (tmp_path / "suite" / "more.jsonl").write_text(
        '{"id": "x/1", "domain": "math", "prompt": "1+1?", "verifier": {"name": "math", "answer": "2"}}\n')
    tasks = load_eval_tasks([tmp_path / "suite"])
    assert sorted(t.id for t in tasks) == ["one", "two", "x/1"]
    (tmp_path / "suite" / "three").mkdir()
    (tmp_path / "suite" / "three" / "task.toml").write_text("")
    with pytest.raises(TaskFormatError, match="three/instruction.md: missing"):
        load_eval_tasks([tmp_path / "suite"])
