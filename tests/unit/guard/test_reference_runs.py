"""The guard's defaults on healthy reference runs: the RL rows of tiny quickstarts' metrics.jsonl
(tests/unit/guard/fixtures, one file a seed: its README says how they were made) replay through
the default detectors with no finding, and the same rows with one fault written into them are
caught by the detector meant for it, once, with the default action."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tidal.config.guard import GuardConfig
from tidal.guard import Finding, Guard

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*.jsonl"))


def rl_rows(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row for row in rows if row.get("phase") == "rl"]


def replay(rows: list[dict], cfg: GuardConfig | None = None) -> tuple[list[Finding], set[str]]:
    guard = Guard(cfg or GuardConfig())
    findings: list[Finding] = []
    actions: set[str] = set()
    for row in rows:
        verdict = guard.observe(row["step"], row, [])
        findings += verdict.findings
        actions |= verdict.actions
    return findings, actions


def test_there_are_reference_runs_to_replay() -> None:
    assert len(FIXTURES) >= 3 and all(len(rl_rows(path)) >= 50 for path in FIXTURES)


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_a_healthy_reference_run_replays_with_no_finding(path: Path) -> None:
    rows = rl_rows(path)
    assert all("sampled_entropy" in row and any(k.startswith("tasks/") for k in row) for row in rows)
    findings, _ = replay(rows)
    assert not findings, [f.reason for f in findings]


def _with(rows: list[dict], first: int, last: int, **changes: object) -> list[dict]:
    """A copy of `rows` whose steps first..last get `changes` (a callable is applied to the old value)."""
    out = []
    for row in rows:
        row = dict(row)
        if first <= row["step"] <= last:
            for key, change in changes.items():
                row[key] = change(row[key]) if callable(change) else change
        out.append(row)
    return out


@pytest.mark.parametrize("path", FIXTURES[:1], ids=[p.stem for p in FIXTURES[:1]])
def test_a_fault_written_into_a_healthy_run_is_caught_once_with_the_default_action(path: Path) -> None:
    rows = rl_rows(path)
    top = max((k for k in rows[0] if k.startswith("tasks/")), key=lambda k: rows[0][k]).split("/", 1)[1]
    faults = {
        "nonfinite": (_with(rows, 30, 30, loss=math.nan, skipped=1.0), {"rollback"}),
        "grad_spike": (_with(rows, 40, 40, grad_norm=lambda g: g * 50), {"rollback"}),
        "infra_errors": (_with(rows, 20, 21, **{"rate/infra_error": 1.0}), {"alert"}),
        # a hack of the domain most tasks come from, sustained: one alert, then the new level is the baseline
        "reward_spike": (_with(rows, 45, 10_000, **{f"reward/{top}": 1.0}), {"alert"}),
        "entropy_collapse": (_with(rows, 50, 10_000, sampled_entropy=lambda h: h * 0.2), {"alert"}),
    }
    for detector, (faulty, expected) in faults.items():
        findings, actions = replay(faulty)
        assert [f.detector for f in findings] == [detector], (detector, [f.reason for f in findings])
        assert actions == expected, (detector, actions)


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_the_same_rows_in_shuffled_orders_raise_no_alarm(path: Path) -> None:
    """Stationary noise in any order (the old entropy detector alerted about 6 times in 150 such
    steps): each permutation keeps the steps ascending and deals the rows' values out anew."""
    import random

    rows = rl_rows(path)
    for seed in range(10):
        values = [dict(row) for row in rows]
        random.Random(seed).shuffle(values)
        shuffled = [{**value, "step": row["step"]} for row, value in zip(rows, values)]
        findings, _ = replay(shuffled)
        assert not findings, (seed, [f.reason for f in findings])
