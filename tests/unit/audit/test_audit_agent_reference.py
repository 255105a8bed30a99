"""Check 2 for agent tasks: the reference (a shell script) runs as an oracle episode, the way
`tidal eval --model oracle` runs it, so built-in agent tasks pass and a wrong script is caught."""

from __future__ import annotations

from pathlib import Path

from tidal.audit import audit_tasks
from tidal.config.schema import AuditConfig
from tidal.tasks import generate_tasks, write_tasks


def test_built_in_agent_tasks_are_not_quarantined(tmp_path: Path, bwrap: None) -> None:
    tasks = [t for split in ("train", "eval") for t in generate_tasks("agent", 5, split, 0, 1, 5)]  # type: ignore[arg-type]
    path = tmp_path / "agent.jsonl"
    write_tasks(tasks, path)
    result = audit_tasks([path], AuditConfig(reference_runs=2),
                         checks=["reference", "limits", "impossible_variant", "leakage", "duplicates"], jobs=2,
                         progress=False)
    assert len(result.audits) == 10
    for audit in result.audits:
        assert audit.verdict != "quarantine", (audit.task_id, [f.to_dict() for f in audit.findings])
        assert audit.measurements["reference_passed"] == "2/2", audit.task_id


def test_a_script_that_does_not_solve_the_chore_is_broken(tmp_path: Path, bwrap: None) -> None:
    task = generate_tasks("agent", 1, "train", 0)[0]
    broken = task.model_copy(update={"id": "broken/agent-wrong-script", "reference": "echo nothing > other.txt\n"})
    path = tmp_path / "agent.jsonl"
    write_tasks([task, broken], path)
    by_id = audit_tasks([path], AuditConfig(reference_runs=2), checks=["reference"], progress=False).by_id()
    assert by_id[task.id].verdict == "ok"
    [finding] = by_id["broken/agent-wrong-script"].findings
    assert finding.severity == "quarantine" and finding.evidence["kind"] == "wrong expectation"
    assert len(finding.evidence["runs"]) == 2
