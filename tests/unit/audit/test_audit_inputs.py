"""Audit input: terminal-task folders and folders of them are audited; input with nothing to audit
(missing or unreadable paths, empty folders, empty files) is an AuditInputError, never 0 tasks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidal.audit import audit_tasks
from tidal.audit.cli_support import run_audit_command
from tidal.config.schema import AuditConfig
from tidal.errors import AuditInputError
from tidal.tasks import generate_tasks, write_tasks

TEST = "from pathlib import Path\n\n\ndef test_word():\n    assert Path('out.txt').read_text().strip() == '{word}'\n"


def make_folder(root: Path, name: str, word: str, solve: str | None = None, toml: str = "") -> Path:
    folder = root / name
    (folder / "tests").mkdir(parents=True)
    (folder / "instruction.md").write_text(f"Write the word {word} to out.txt.\n")
    (folder / "task.toml").write_text(toml)
    (folder / "tests" / "test_out.py").write_text(TEST.format(word=word))
    (folder / "solution").mkdir()
    (folder / "solution" / "solve.sh").write_text(solve if solve is not None else f"echo {word} > out.txt\n")
    return folder


def test_one_task_folder_is_audited(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, "write-cedar", "cedar")
    [audit] = audit_tasks([folder], cheap_only=True, progress=False).audits
    assert (audit.task_id, audit.where, audit.domain, audit.verdict) == ("write-cedar", str(folder), "agent", "ok")


def test_a_folder_of_task_folders_and_task_files(tmp_path: Path) -> None:
    make_folder(tmp_path / "suite", "a-cedar", "cedar")
    make_folder(tmp_path / "suite" / "nested", "b-maple", "maple")
    broken = make_folder(tmp_path / "suite", "c-broken", "birch", toml="max_steps = 'many'\n")
    (broken / "instruction.md").write_text("")
    write_tasks(generate_tasks("math", 2, "train", 0), tmp_path / "suite" / "more.jsonl")
    result = audit_tasks([tmp_path / "suite"], cheap_only=True, progress=False)
    by_id = result.by_id()
    assert sorted(by_id) == ["a-cedar", "b-maple", "c-broken", "math/train-00000", "math/train-00001"]
    assert by_id["a-cedar"].verdict == by_id["b-maple"].verdict == "ok"
    # A folder that does not load is one record, every problem a schema finding naming its file.
    [finding] = by_id["c-broken"].findings
    assert (by_id["c-broken"].verdict, finding.check) == ("quarantine", "schema")
    problems = finding.evidence["problems"]
    assert any("instruction.md: empty" in p for p in problems) and any("task.toml" in p and "max_steps" in p
                                                                       for p in problems)


def test_task_folders_reference_runs_as_an_oracle_episode(tmp_path: Path, bwrap: None) -> None:
    make_folder(tmp_path, "good", "cedar")
    make_folder(tmp_path, "wrong", "maple", solve="echo oak > out.txt\n")
    config = AuditConfig(reference_runs=2)
    result = audit_tasks([tmp_path], config, checks=["reference"], progress=False).by_id()
    assert result["good"].verdict == "ok" and result["good"].measurements["reference_passed"] == "2/2"
    [finding] = result["wrong"].findings
    assert (finding.check, finding.severity, finding.evidence["kind"]) == ("reference", "quarantine", "wrong expectation")


@pytest.mark.parametrize("make", ["missing", "empty-folder", "not-a-task-file", "empty-file", "none"])
def test_nothing_to_audit_is_an_error(make: str, tmp_path: Path) -> None:
    paths: list[Path] = []
    if make == "missing":
        paths = [tmp_path / "nope.jsonl"]
    elif make == "empty-folder":
        (tmp_path / "empty" / "sub").mkdir(parents=True)
        (tmp_path / "empty" / "README.md").write_text("no tasks here\n")
        paths = [tmp_path / "empty"]
    elif make == "not-a-task-file":
        (tmp_path / "tasks.csv").write_text("id,prompt\n")
        paths = [tmp_path / "tasks.csv"]
    elif make == "empty-file":
        (tmp_path / "tasks.jsonl").write_text("")
        paths = [tmp_path / "tasks.jsonl"]
    with pytest.raises(AuditInputError) as caught:
        audit_tasks(paths, cheap_only=True, progress=False)
    if paths:
        assert str(paths[0]) in str(caught.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_path_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    write_tasks(generate_tasks("math", 1, "train", 0), path)
    path.chmod(0)
    with pytest.raises(AuditInputError, match="cannot be read"):
        audit_tasks([path], cheap_only=True, progress=False)


def test_the_command_reports_the_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(AuditInputError, match="holds no task files"):
        run_audit_command([str(tmp_path / "empty")], policy=None, json_out=None, html_out=None, quarantine_out=None,
                          jobs=1, checks=None, cheap=True, reference_runs=None, backend="bwrap")
