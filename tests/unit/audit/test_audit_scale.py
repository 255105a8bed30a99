"""Bad input at scale and the command: ~2,000 cheap exact_match tasks streamed through the cheap
checks with `--jobs`, the outputs (JSON, HTML with anchors, quarantine file), and a check that
raises without ending the audit."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tidal.audit import audit_tasks
from tidal.audit.checks import CHECKS, Check
from tidal.audit.quarantine import load_quarantine
from tidal.cli import app
from tidal.tasks import write_tasks
from tidal.types import Task

COUNT = 2000


def many_tasks(path: Path) -> None:
    tasks = [Task(id=f"n/{i:05d}", domain="knowledge", prompt=f"What is the code word number {i} of list {i * 7}?",
                  verifier={"name": "exact_match", "answer": f"w{i}"}, reference=f"w{i}",
                  split="eval" if i % 5 == 0 else "train") for i in range(COUNT)]
    tasks.append(tasks[10].model_copy(update={"id": "n/copy-of-10", "split": "train"}))  # eval content in train
    write_tasks(tasks, path)


def test_thousands_of_tasks_stream_through_the_cheap_checks(tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    many_tasks(path)
    seen: list[str] = []
    result = audit_tasks([path], cheap_only=True, jobs=2, progress=False, on_audit=lambda a: seen.append(a.task_id))
    assert len(result.audits) == COUNT + 1 and seen == [a.task_id for a in result.audits]  # input order
    assert seen[:2] == ["n/00000", "n/00001"]
    assert result.summary["verdicts"] == {"ok": COUNT, "warn": 0, "quarantine": 1}
    [copy] = result.quarantined()
    assert copy.task_id == "n/copy-of-10" and copy.findings[0].evidence["duplicate_of"] == "n/00010"


def test_the_command_writes_json_html_and_quarantine(tmp_path: Path) -> None:
    corpus = Path(__file__).resolve().parents[3] / "examples" / "broken_tasks"
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["audit", str(corpus / "text.yaml"), str(corpus / "invalid.jsonl"),
                                      "--checks", "schema,leakage,duplicates,null_solution", "--json", str(out / "a.json"),
                                      "--html", str(out / "a.html"), "--quarantine", str(out / "q.json")])
    assert result.exit_code == 0, result.output
    assert "quarantine broken/math-answer-in-prompt" in result.output.replace("  ", " ").replace("  ", " ")
    report = json.loads((out / "a.json").read_text())
    assert report["checks"] == ["schema", "leakage", "duplicates", "null_solution"]
    quarantined = load_quarantine(out / "q.json")
    assert {"broken/math-answer-in-prompt", "broken/regex-accepts-anything", "dup/eval-rivers",
            "broken/schema-unknown-field"} <= set(quarantined)
    page = (out / "a.html").read_text()
    assert '<section id="check-leakage">' in page and 'href="#ev-broken_math-answer-in-prompt-0"' in page
    assert 'id="ev-broken_math-answer-in-prompt-0"' in page and "<script" not in page


def test_a_check_that_raises_is_a_finding_not_the_end(tmp_path: Path, monkeypatch) -> None:
    def broken(task: Task, ctx: object, measurements: dict) -> list:
        raise RuntimeError(f"cannot handle {task.id}")

    monkeypatch.setattr("tidal.audit.checks.CHECKS", [*CHECKS, Check("broken", broken, "cheap")])
    path = tmp_path / "two.jsonl"
    write_tasks([Task(id=f"t{i}", domain="math", prompt="1+1?", verifier={"name": "math", "answer": "2"}) for i in range(2)], path)
    result = audit_tasks([path], checks=["broken"], progress=False)
    assert [a.findings[0].message for a in result.audits] == [
        "the check could not run: RuntimeError: cannot handle t0", "the check could not run: RuntimeError: cannot handle t1"]
