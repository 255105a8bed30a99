"""The `tasks generate`, `tasks validate` and `score` commands, through the real CLI."""

import json
from pathlib import Path

from typer.testing import CliRunner

from tidal.cli import app
from tidal.tasks import load_tasks, reference_answer

runner = CliRunner()


def test_generate_then_validate(tmp_path: Path) -> None:
    out = tmp_path / "math.jsonl"
    result = runner.invoke(app, ["tasks", "generate", "--family", "math", "--n", "12", "--split", "eval", "--out", str(out)])
    assert result.exit_code == 0, result.output
    tasks = load_tasks([out])
    assert len(tasks) == 12 and {t.split for t in tasks} == {"eval"}
    result = runner.invoke(app, ["tasks", "validate", str(out)])
    assert result.exit_code == 0 and "ok: 12 tasks (math: 12)" in result.output


def test_validate_reports_file_line_id_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"id": "a", "domain": "math", "prompt": "1+1?", "verifier": {"name": "math", "answer": "2"}})
        + "\n"
        + json.dumps({"id": "b", "domain": "math", "prompt": "", "verifier": {"name": "nope"}})
        + "\n{not json\n"
    )
    result = runner.invoke(app, ["tasks", "validate", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:2 [b] prompt" in result.output
    assert "nope" in result.output and "exact_match" in result.output  # the known verifiers are listed
    assert f"{bad}:3" in result.output


def test_generate_unknown_family_lists_known(tmp_path: Path) -> None:
    result = runner.invoke(app, ["tasks", "generate", "--family", "poetry", "--out", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2 and "math" in result.output and "poetry" in result.output


def test_score_json_for_right_wrong_and_binary_answers(tmp_path: Path) -> None:
    tasks_file = tmp_path / "code.jsonl"
    assert runner.invoke(app, ["tasks", "generate", "--family", "code", "--n", "3", "--out", str(tasks_file)]).exit_code == 0
    task = load_tasks([tasks_file])[0]
    right, wrong, binary = tmp_path / "right.md", tmp_path / "wrong.md", tmp_path / "binary.bin"
    right.write_text(reference_answer(task))
    wrong.write_text("```python\ndef nothing():\n    return None\n```")
    binary.write_bytes(b"\xff\xfe\x00\x81garbage\x00")
    scores = {}
    for name, path in [("right", right), ("wrong", wrong), ("binary", binary)]:
        result = runner.invoke(app, ["score", str(tasks_file), "--task", task.id, "--answer", str(path), "--json"])
        assert result.exit_code == 0, result.output
        scores[name] = json.loads(result.output)
        assert {"reward", "outcome", "keep", "components"} <= set(scores[name])
    assert scores["right"]["reward"] == 1.0 and scores["right"]["outcome"] == "passed" and scores["right"]["keep"]
    assert scores["wrong"]["reward"] == 0.0 and scores["wrong"]["outcome"] == "failed"
    assert scores["binary"]["reward"] == 0.0 and scores["binary"]["outcome"] == "failed"


def test_score_unknown_task_id(tmp_path: Path) -> None:
    tasks_file = tmp_path / "math.jsonl"
    runner.invoke(app, ["tasks", "generate", "--family", "math", "--n", "2", "--out", str(tasks_file)])
    answer = tmp_path / "a.txt"
    answer.write_text("4")
    result = runner.invoke(app, ["score", str(tasks_file), "--task", "math/nope", "--answer", str(answer)])
    assert result.exit_code == 2 and "math/nope" in result.output
