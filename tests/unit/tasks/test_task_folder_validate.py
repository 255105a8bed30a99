"""`tidal tasks validate` on terminal-task folders: good folders next to JSONL pass, and every
missing or malformed file and bad `task.toml` field is reported with its folder, file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tidal.cli import app
from tidal.errors import TaskFolderError
from tidal.reward import known_verifiers
from tidal.tasks.terminal import load_eval_tasks, load_task_folder

runner = CliRunner()


def _folder(root: Path, name: str) -> Path:
    folder = root / name
    (folder / "tests").mkdir(parents=True)
    (folder / "solution").mkdir()
    (folder / "files").mkdir()
    (folder / "instruction.md").write_text("Copy in.txt to out.txt.\n")
    (folder / "task.toml").write_text('max_steps = 5\n[verifier]\ntimeout_sec = 30\n')
    (folder / "files" / "in.txt").write_text("payload\n")
    (folder / "solution" / "solve.sh").write_text("cp in.txt out.txt\n")
    (folder / "tests" / "test_outputs.py").write_text("def test_copy():\n    assert open('out.txt').read() == 'payload\\n'\n")
    return folder


def _validate(*paths: Path) -> tuple[int, str]:
    result = runner.invoke(app, ["tasks", "validate", *map(str, paths)])
    return result.exit_code, result.output


def test_folders_and_task_files_validate_together(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    _folder(suite, "copy")
    (suite / "more.jsonl").write_text(json.dumps(
        {"id": "m/1", "domain": "math", "prompt": "1+1?", "verifier": {"name": "math", "answer": "2"}}) + "\n")
    code, output = _validate(suite)
    assert code == 0, output
    assert "ok: 2 tasks (agent: 1, math: 1)" in output
    code, output = _validate(suite / "copy")  # a folder named directly
    assert code == 0 and "ok: 1 tasks (agent: 1)" in output, output


def test_every_problem_of_a_folder_is_named_with_folder_file_and_field(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "broken")
    (folder / "instruction.md").write_text("   \n")
    (folder / "task.toml").write_text(
        'max_steps = 0\nprompt = "sneaky"\nmax_stpes = 3\n[verifier]\nname = "nope"\n[limits]\ntimeout_s = "long"\n')
    (folder / "tests" / "test_outputs.py").write_text("def test_x(:\n    pass\n")
    (folder / "solution" / "solve.sh").unlink()
    (folder / "files" / "blob.bin").write_bytes(b"\xff\xfe\x00")
    code, output = _validate(folder)
    assert code == 2, output
    expected = [
        f"{folder}/instruction.md: empty",
        f"{folder}/task.toml prompt: comes from instruction.md",
        f"{folder}/tests/test_outputs.py:1: not valid Python",
        f"{folder}/solution/solve.sh: missing",
        f"{folder}/files/blob.bin: not UTF-8 text",
        f"{folder}/task.toml max_steps: must be >= 1, got 0",
        f"{folder}/task.toml max_stpes: unknown field (did you mean 'max_steps'?)",
        f"{folder}/task.toml limits.timeout_s:",
        f"{folder}/task.toml verifier.name: unknown verifier 'nope'",
    ]
    missing = [line for line in expected if line not in output]
    assert not missing, output


def test_missing_files_and_misnamed_tests_folder(tmp_path: Path) -> None:
    folder = tmp_path / "bare"
    (folder / "test").mkdir(parents=True)
    (folder / "test" / "test_a.py").write_text("def test_a():\n    pass\n")
    (folder / "task.toml").write_text("max_steps = [\n")
    with pytest.raises(TaskFolderError) as caught:
        load_task_folder(folder, known_verifiers())
    problems = caught.value.problems
    assert any(p.startswith(f"{folder}/instruction.md: missing") for p in problems), problems
    assert any(p.startswith(f"{folder}/task.toml: not valid TOML") for p in problems), problems
    assert any(p.startswith(f"{folder}/tests/: missing or empty (found test/") for p in problems), problems


def test_tests_folder_without_a_runnable_test(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "notests")
    (folder / "tests" / "test_outputs.py").unlink()
    (folder / "tests" / "expected.txt").write_text("payload\n")
    with pytest.raises(TaskFolderError, match=r"notests/tests/: holds no pytest module and no test.sh"):
        load_task_folder(folder)
    (folder / "tests" / "test.sh").write_text('[ "$(cat out.txt)" = payload ]\n')
    assert load_task_folder(folder).tests.keys() == {"tests/expected.txt", "tests/test.sh"}


def test_duplicate_ids_name_both_sources_and_bad_folders_sit_beside_good_files(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    _folder(suite, "a")
    (suite / "a" / "task.toml").write_text('id = "same"\n')
    _folder(suite, "b")
    (suite / "b" / "task.toml").write_text('id = "same"\n')
    (suite / "c").mkdir()
    (suite / "c" / "instruction.md").write_text("do it\n")
    (suite / "tasks.jsonl").write_text('{"id": "x", "domain": "math", "prompt": "", "verifier": {"name": "math"}}\n')
    code, output = _validate(suite)
    assert code == 2
    assert f"[same] id: defined 2 times ({suite}/a, {suite}/b)" in output, output
    assert f"{suite}/c/task.toml: missing" in output and f"{suite}/c/tests/: missing" in output
    assert f"{suite}/tasks.jsonl:1 [x] prompt" in output
    with pytest.raises(TaskFolderError):
        load_task_folder(suite / "c")
    assert [t.id for t in load_eval_tasks([suite / "a"])] == ["same"]
