"""Check 4 for agent tasks: an agent that does nothing must fail the acceptance tests."""

from __future__ import annotations

from tidal.audit.context import AuditContext
from tidal.audit.nulls import check_null_solutions
from tidal.tasks import generate_tasks


def test_built_in_agent_task_fails_when_nothing_is_done(bwrap: None) -> None:
    task = generate_tasks("agent", 1, "train", 0)[0]
    measurements: dict = {}
    findings = check_null_solutions(task, AuditContext(), measurements)
    assert measurements["do_nothing_reward"] == 0.0
    assert not [f for f in findings if f.evidence.get("null") == "do-nothing agent"]


def test_tests_that_accept_the_starting_workspace_are_quarantined(bwrap: None) -> None:
    task = generate_tasks("agent", 1, "train", 0)[0].model_copy(update={
        "id": "broken/agent-done-already",
        "files": {"notes.txt": "hello\n"},
        "tests": {"test_chore.py": "from pathlib import Path\n\ndef test_notes():\n"
                                   "    assert Path('notes.txt').read_text() == 'hello\\n'\n"},
    })
    measurements: dict = {}
    findings = check_null_solutions(task, AuditContext(), measurements)
    flagged = [f for f in findings if f.evidence.get("null") == "do-nothing agent"]
    assert measurements["do_nothing_reward"] == 1.0
    assert len(flagged) == 1 and flagged[0].severity == "quarantine"
