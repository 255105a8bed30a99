"""`tidal eval` through the real CLI on tasks of every kind: single-turn families scored by their
verifiers next to agent episodes, the greedy-repeat warning, the task-clustered interval, and an
audit's quarantine list honoured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tidal.audit import write_quarantine
from tidal.cli import app
from tidal.errors import SandboxUnavailableError
from tidal.eval.harness import read_results
from tidal.eval.stats import wilson_interval
from tidal.sandbox import get_backend
from tidal.tasks import generate_tasks

runner = CliRunner()
FAMILIES = ("math", "code", "knowledge", "reasoning", "general")


@pytest.fixture(scope="module", autouse=True)
def bwrap() -> None:
    try:
        get_backend("bwrap")
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")


def _task_files(folder: Path) -> list[Path]:
    paths = []
    for family in FAMILIES:
        path = folder / f"{family}.jsonl"
        result = runner.invoke(app, ["tasks", "generate", "--family", family, "--n", "2", "--split", "eval",
                                     "--out", str(path), "--seed", "3"])
        assert result.exit_code == 0, result.output
        paths.append(path)
    agent = folder / "agent.jsonl"
    agent.write_text("".join(t.model_dump_json() + "\n" for t in generate_tasks("agent", 1, "eval", seed=3,
                                                                                min_difficulty=1, max_difficulty=1)))
    return [*paths, agent]


def test_every_kind_of_task_with_quarantine_and_greedy_repeats(tmp_path: Path) -> None:
    files = _task_files(tmp_path)
    quarantine = tmp_path / "quarantine.json"
    write_quarantine(quarantine, [("math/eval-00001", ["exploit: the reference is wrong"])])
    out = tmp_path / "eval"
    result = runner.invoke(app, ["eval", "--model", "oracle", "--tasks", *map(str, files), "--epochs", "3",
                                 "--out", str(out), "--quarantine", str(quarantine)])
    assert result.exit_code == 0, result.output
    assert "--epochs 3 at temperature 0: the repeats of a task are identical" in result.output
    assert "1 quarantined task(s) skipped: math/eval-00001" in result.output

    records = read_results(out / "results.jsonl")
    ids = {r["task_id"] for r in records}
    assert "math/eval-00001" not in ids and len(ids) == 2 * len(FAMILIES) - 1 + 1
    assert {r["kind"] for r in records} == {"answer", "episode"}
    assert {r["domain"] for r in records} == {*FAMILIES, "agent"}
    summary = json.loads((out / "summary.json").read_text())
    # The oracle answers every single-turn task with its reference and runs the agent task's script.
    assert summary["outcomes"] == {"pass": 3 * len(ids)} and summary["pass_rate"] == 1.0
    # 30 identical episodes of 10 tasks: the interval is the one over the 10 tasks.
    assert summary["ci"] == pytest.approx(list(wilson_interval(len(ids), len(ids))))
    assert summary["ci"][0] < wilson_interval(3 * len(ids), 3 * len(ids))[0]
    assert summary["quarantined"] == [{"task_id": "math/eval-00001", "domain": "math",
                                       "reasons": ["exploit: the reference is wrong"]}]
    assert "the repeats are identical, so it is the interval over tasks" in summary["interval_note"]
    report = (out / "report.html").read_text()
    assert "Quarantined tasks (skipped)" in report and "exploit: the reference is wrong" in report
    assert "clustered by task" in report


def test_a_malformed_quarantine_file_stops_the_eval_before_it_starts(tmp_path: Path) -> None:
    files = _task_files(tmp_path)[:1]
    bad = tmp_path / "quarantine.json"
    bad.write_text(json.dumps({"quarantined": [{"task_id": "math/eval-00000", "reasons": "wrong"}, 7]}))
    out = tmp_path / "eval"
    result = runner.invoke(app, ["eval", "--model", "oracle", "--tasks", str(files[0]), "--out", str(out),
                                 "--quarantine", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}: quarantined[0] (math/eval-00000): reasons must be a list" in result.output
    assert not out.exists()
    missing = runner.invoke(app, ["eval", "--model", "oracle", "--tasks", str(files[0]), "--out", str(out),
                                  "--quarantine", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "cannot read the quarantine list" in missing.output and not out.exists()


def test_a_checkpoint_on_math_is_scored_not_a_verifier_error(tmp_path: Path) -> None:
    """The issue's case: single-turn math gave every episode verifier_error and 'n/a over 0'."""
    files = _task_files(tmp_path)[:1]
    config = tmp_path / "eval.yaml"
    config.write_text("budgets: {max_new_tokens: 8}\n")
    out = tmp_path / "eval"
    result = runner.invoke(app, ["eval", "--model", "tiny", "--tasks", str(files[0]), "--out", str(out),
                                 "--config", str(config)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scored"] == 2 and summary["verifier_errors"] == 0
    assert set(summary["outcomes"]) <= {"fail", "format_error"}  # an untrained model, judged by the verifier
    assert "pass rate 0.0% [0.0%," in result.output and "over 2 episodes of 2 tasks" in result.output
