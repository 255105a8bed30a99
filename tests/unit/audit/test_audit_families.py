"""The built-in task families come out of the audit clean: every check, on a small sample of
each (one code task in the default suite, a larger sample in the slow one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.audit import audit_tasks
from tidal.config.schema import AuditConfig
from tidal.tasks import generate_tasks, write_tasks

SMALL = AuditConfig(reference_runs=2, max_mutants=6)
TEXT_FAMILIES = ("math", "knowledge", "reasoning", "general")


def audit_families(tmp_path: Path, per_split: dict[str, int], difficulty: tuple[int, int] = (1, 5)):
    tasks = []
    for family, n in per_split.items():
        for split in ("train", "eval"):
            tasks += generate_tasks(family, n, split, seed=11, min_difficulty=difficulty[0], max_difficulty=difficulty[1])
    path = tmp_path / "families.jsonl"
    write_tasks(tasks, path)
    return audit_tasks([path], SMALL, jobs=2, progress=False)


def test_text_families_and_one_code_task_are_clean(tmp_path: Path, bwrap: None) -> None:
    result = audit_families(tmp_path, {**dict.fromkeys(TEXT_FAMILIES, 5), "code": 1})
    problems = {a.task_id: [f.message for f in a.findings if f.severity != "info"] for a in result.audits if a.verdict != "ok"}
    assert problems == {}
    assert len(result.audits) == 2 * (5 * len(TEXT_FAMILIES) + 1)


# Known weaknesses of the code family the audit found (reported, not fixed here): `parity` draws
# its four inputs around 0 without balancing even and odd, so a stub returning the even branch's
# constant can score 0.75; `max_floor` never tests a list whose numbers are all below the floor,
# so changing the floor survives.
KNOWN_WEAK_KINDS = {"parity": {"null_solution"}, "max_floor": {"test_strength"}}


@pytest.mark.slow
def test_every_code_level_is_clean_but_for_known_weak_kinds(tmp_path: Path, bwrap: None) -> None:
    result = audit_families(tmp_path, {"code": 5})
    kinds = {t["id"]: t["metadata"]["kind"] for t in map(json.loads, (tmp_path / "families.jsonl").read_text().splitlines())}
    assert not result.quarantined()
    for audit in result.audits:
        assert audit.flagged() <= KNOWN_WEAK_KINDS.get(kinds[audit.task_id], set()), audit.to_dict()
