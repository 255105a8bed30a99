"""The broken-task corpus (examples/broken_tasks): each broken task is flagged by exactly the
checks its `metadata.expect` names, and each good task comes out `ok`.

The default suite runs each scoring task with only its expected checks (fast), the good code task
with every check, and the whole corpus with the cheap checks; the `slow` test audits the whole
corpus with every check and compares the full sets."""

from __future__ import annotations

from pathlib import Path

import pytest
from audit_corpus import CORPUS, corpus_tasks, expected

from tidal.audit import audit_tasks
from tidal.config.schema import AuditConfig
from tidal.tasks import write_tasks

SMALL = AuditConfig(reference_runs=2, max_mutants=6)
CHEAP = {"schema", "no_reference", "leakage", "duplicates"}
TASKS = corpus_tasks()
SCORED = sorted(t for t, task in TASKS.items() if expected(task.metadata) - CHEAP)


def audit_one(task_id: str, tmp_path: Path, checks: list[str] | None, config: AuditConfig = SMALL):
    path = tmp_path / "task.jsonl"
    write_tasks([TASKS[task_id]], path)
    [audit] = audit_tasks([path], config, checks=checks, jobs=1, progress=False).audits
    return audit


def test_cheap_checks_flag_exactly_their_tasks() -> None:
    result = audit_tasks([CORPUS], SMALL, cheap_only=True, progress=False)
    flagged = {a.task_id: a.flagged() for a in result.audits}
    for task_id, task in TASKS.items():
        assert flagged[task_id] == expected(task.metadata) & CHEAP, task_id
    # The invalid records: every one reported by id (or FILE:LINE), and the good line after them audited.
    assert flagged["broken/schema-unknown-field"] == {"schema"}
    assert flagged["broken/schema-no-verifier"] == {"schema"}
    assert flagged["broken/schema-unknown-verifier"] == {"schema"}
    assert flagged[f"{CORPUS / 'invalid.jsonl'}:2"] == {"schema"}
    assert flagged["good/after-bad-lines"] == set()
    by_id = result.by_id()
    assert by_id["dup/eval-rivers"].verdict == "quarantine"  # exact duplicate across splits
    assert by_id["dup/eval-rivers-reworded"].verdict == "warn"  # near-duplicate across splits
    assert by_id["dup/eval-rivers-reworded"].findings[0].evidence["duplicate_of"] == "dup/train-rivers"


@pytest.mark.parametrize("task_id", SCORED)
def test_scoring_check_flags_its_task(task_id: str, tmp_path: Path, bwrap: None) -> None:
    wanted = expected(TASKS[task_id].metadata)
    audit = audit_one(task_id, tmp_path, sorted(wanted | ({"reference"} if "limits" in wanted else set())))
    assert audit.flagged() == wanted
    kind = TASKS[task_id].metadata.get("kind")
    if kind is not None:
        [finding] = [f for f in audit.findings if f.check == "reference"]
        assert finding.evidence["kind"] == kind


def test_good_code_task_passes_every_check(tmp_path: Path, bwrap: None) -> None:
    audit = audit_one("good/add-three", tmp_path, None)
    assert audit.verdict == "ok", [f.to_dict() for f in audit.findings]
    assert audit.measurements["kill_rate"] == 1.0
    assert audit.measurements["reference_passed"] == "2/2"


def test_good_text_tasks_pass_every_check(tmp_path: Path) -> None:
    path = tmp_path / "good.jsonl"
    write_tasks([t for i, t in TASKS.items() if i.startswith("good/") and t.verifier.name != "python_tests"], path)
    result = audit_tasks([path], SMALL, progress=False)
    assert {a.task_id: a.verdict for a in result.audits} == {
        "good/capital-of-france": "ok", "good/apples": "ok", "good/nothing-left": "ok"}
    # The answer 0 is a null answer too; its passing is noted, not held against the task.
    [note] = result.by_id()["good/nothing-left"].findings
    assert (note.check, note.severity) == ("null_solution", "info")


@pytest.mark.slow
def test_whole_corpus_every_check(bwrap: None) -> None:
    result = audit_tasks([CORPUS], SMALL, jobs=2, progress=False)
    by_id = result.by_id()
    for task_id, task in TASKS.items():
        assert by_id[task_id].flagged() == expected(task.metadata), (task_id, [f.to_dict() for f in by_id[task_id].findings])
