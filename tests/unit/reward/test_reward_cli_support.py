"""score_command: what `tidal score` prints, from task files and an answer file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.errors import UnknownNameError
from tidal.reward.cli_support import score_command


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    tasks = [
        {"id": "k/capital", "domain": "knowledge", "prompt": "Capital of France?",
         "verifier": {"name": "exact_match", "answer": "Paris"}},
        {"id": "m/sum", "domain": "math", "prompt": "2+2?", "verifier": {"name": "math", "answer": 4}},
    ]
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def test_scores_and_gates_an_answer_file(task_file: Path, tmp_path: Path) -> None:
    answer = tmp_path / "answer.txt"
    answer.write_text("The answer is \\boxed{4}.")
    result = score_command([str(task_file)], "m/sum", str(answer), backend="unsafe_local")
    assert result == {
        "task_id": "m/sum", "reward": 1.0, "outcome": "passed", "keep": True, "drop_reason": "",
        "components": {"correct": 1.0}, "detail": result["detail"],
    }


def test_binary_and_empty_answer_files(task_file: Path, tmp_path: Path) -> None:
    binary = tmp_path / "binary.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    result = score_command([str(task_file)], "k/capital", str(binary))
    assert result["outcome"] == "failed" and result["reward"] == 0.0 and "UTF-8" in result["detail"]
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    result = score_command([str(task_file)], "k/capital", str(empty))
    assert result["outcome"] == "failed" and result["keep"] is False and result["drop_reason"] == "empty"


def test_unknown_task_id_lists_known_ones(task_file: Path, tmp_path: Path) -> None:
    answer = tmp_path / "a.txt"
    answer.write_text("x")
    with pytest.raises(UnknownNameError, match="k/capital"):
        score_command([str(task_file)], "nope", str(answer))
