"""`tidal tasks import`: each format round-trips on files written here, a bad row fails with its
file and row and nothing is written, and every imported reference passes its own verifier."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, get_args

import pytest
from typer.testing import CliRunner

from tidal.cli import app
from tidal.config.schema import TaskSourceFormat
from tidal.errors import TaskFormatError
from tidal.reward.registry import known_verifiers
from tidal.tasks import load_tasks
from tidal.tasks.importers import FORMATS, import_tasks, load_sources, parse_map
from tidal.types import Task

HUMANEVAL = {
    "task_id": "HumanEval/0",
    "prompt": 'def close(numbers: list, threshold: float) -> bool:\n    """Whether two numbers are closer than threshold."""\n',
    "canonical_solution": "    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
                          "            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n",
    "test": "METADATA = {}\n\n\ndef check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0], 0.3) is True\n"
            "    assert candidate([1.0, 2.0, 3.9], 0.05) is False\n",
    "entry_point": "close",
}
MBPP = {"task_id": 11, "text": "Write a function that removes the first and last x from a string.",
        "code": "def remove_occ(s, ch):\n    s = s.replace(ch, '', 1)\n    i = s.rfind(ch)\n"
                "    return s if i < 0 else s[:i] + s[i + 1:]\n",
        "test_list": ["assert remove_occ('hello', 'l') == 'heo'", "assert remove_occ('abcda', 'a') == 'bcd'"]}


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _score(task: Task, answer: str) -> Any:
    from tidal.config.schema import RewardConfig
    from tidal.reward.scorer import Scorer

    scorer = Scorer(RewardConfig(), backend=None)
    try:
        (score,) = scorer.score_many([(task, answer)])
    finally:
        scorer.close()
    return score


def test_formats_match_the_config_schema() -> None:
    assert set(get_args(TaskSourceFormat)) == set(FORMATS)


def test_code_tests_humaneval_and_mbpp_layouts(tmp_path: Path) -> None:
    source = _jsonl(tmp_path / "code.jsonl", [HUMANEVAL])
    (task,) = import_tasks(source, "code-tests", known_verifiers=known_verifiers())
    assert task.id == "HumanEval/0" and task.domain == "code" and task.verifier.name == "python_tests"
    assert task.reference == HUMANEVAL["prompt"] + HUMANEVAL["canonical_solution"]  # prompt + body
    assert "check(close)" in task.tests["test_solution.py"] and "```python" in str(task.prompt)
    assert task.metadata["source"] == {"path": str(source), "row": 1, "format": "code-tests"}
    mbpp = _jsonl(tmp_path / "mbpp.jsonl", [MBPP])
    (plain,) = import_tasks(mbpp, "code-tests", mapping=parse_map(["prompt=text", "test=test_list",
                                                                   "canonical_solution=code"]), id="mbpp-{task_id}")
    assert plain.id == "mbpp-11" and plain.reference == MBPP["code"]  # a whole function: the solution alone
    assert plain.tests["test_solution.py"].count("def test_assert_") == 2  # each assert its own test


def test_qa_final_answers(tmp_path: Path) -> None:
    rows = [{"question": "How many?", "answer": "3 + 4 = <<3+4=7>>7 apples.\n#### 1,007"},
            {"question": "Half?", "answer": "So it is $\\boxed{\\frac{1}{2}}$."},
            {"question": "Capital of France?", "answer": "Paris", "aliases": ["Paris, France"]},
            {"question": "Seven?", "answer": 7}]
    tasks = import_tasks(_jsonl(tmp_path / "qa.jsonl", rows), "qa")
    assert [t.verifier.name for t in tasks] == ["math", "math", "exact_match", "math"]
    assert [t.verifier.args["answer"] for t in tasks] == ["1007", "\\frac{1}{2}", "Paris", "7"]
    assert tasks[2].verifier.args["aliases"] == ["Paris, France"] and tasks[2].domain == "knowledge"
    assert [t.metadata["answer_from"] for t in tasks] == ["####", "boxed", "plain", "plain"]
    for task in tasks:
        assert _score(task, task.reference).value == 1.0, task.id
    assert _score(tasks[0], "The answer is 1006.").value == 0.0


def test_mcq_answers_as_letter_index_label_or_text(tmp_path: Path) -> None:
    rows = [{"question": "2+2?", "choices": ["3", "4", "5"], "answer": "B"},
            {"question": "2+3?", "choices": ["5", "4", "6"], "answer": 0},
            {"question": "Red?", "choices": {"text": ["blue", "red"], "label": ["1", "2"]}, "answer": "2"},
            {"question": "Sky?", "choices": ["green", "blue"], "answer": "blue"}]
    tasks = import_tasks(_jsonl(tmp_path / "mcq.jsonl", rows), "mcq")
    assert [t.reference for t in tasks] == ["B", "A", "B", "B"]
    assert "A. 3\nB. 4\nC. 5" in str(tasks[0].prompt)
    for answer, value in [("B", 1.0), ("(B)", 1.0), ("Answer: B", 1.0), ("B. 4", 1.0), ("C", 0.0), ("A", 0.0)]:
        assert _score(tasks[0], answer).value == value, answer


def test_inspect_samples(tmp_path: Path) -> None:
    rows = [{"id": "s1", "input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}],
             "target": ["hello", "hi"], "metadata": {"topic": "greeting"}},
            {"id": "s2", "input": "Which is even?", "choices": ["3", "8"], "target": "B"},
            {"id": "s3", "input": "6*7?", "target": "42"}]
    tasks = import_tasks(_jsonl(tmp_path / "inspect.jsonl", rows), "inspect")
    assert [t.id for t in tasks] == ["s1", "s2", "s3"]
    assert tasks[0].messages()[0] == {"role": "system", "content": "Be brief."}
    assert tasks[0].verifier.args == {"answer": "hello", "aliases": ["hi"]} and tasks[0].metadata["topic"] == "greeting"
    assert tasks[1].reference == "B" and tasks[2].verifier.name == "math"


def test_hf_saved_dataset_parquet_and_csv(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(5)]
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:3]),
                          "test": datasets.Dataset.from_list(rows[3:])}).save_to_disk(str(saved))
    with pytest.raises(TaskFormatError, match="splits train, test; give one with --split"):
        import_tasks(saved, "qa")
    test = import_tasks(saved, "qa", split="test", id="add-{index}")
    assert [t.id for t in test] == ["add-0", "add-1"] and {t.split for t in test} == {"eval"}
    assert test[1].metadata["source"]["row"] == 2 and test[1].metadata["source"]["split"] == "test"
    # tidal's own fields in Parquet, the verifier named with its answer beside it
    datasets.Dataset.from_list([{"prompt": r["question"], "verifier": "math", "answer": r["answer"]} for r in rows]) \
        .to_parquet(str(tmp_path / "own.parquet"))
    own = import_tasks(tmp_path / "own.parquet", "hf", limit=2, domain="math")
    assert len(own) == 2 and own[1].verifier.args == {"answer": "2"} and own[1].id == "own-2"
    with (tmp_path / "own.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, ["q", "verifier"])
        writer.writeheader()
        writer.writerow({"q": "Say hi", "verifier": json.dumps({"name": "exact_match", "answer": "hi"})})
    (csv_task,) = import_tasks(tmp_path / "own.csv", "hf", mapping=parse_map(["prompt=Say it: {q}", 'domain="chat"']))
    assert csv_task.prompt == "Say it: Say hi" and csv_task.verifier.args == {"answer": "hi"}
    assert csv_task.domain == "chat"


def test_bad_rows_name_file_and_row_and_nothing_is_written(tmp_path: Path) -> None:
    rows = [HUMANEVAL, {**HUMANEVAL, "task_id": "x", "entry_point": None}, {"task_id": "y", "prompt": "p"}]
    source = _jsonl(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["tasks", "import", str(source), "--format", "code-tests", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert f"{source}:line 2 [x]: the tests define check(candidate) but there is no `entry_point`" in result.output
    assert f"{source}:line 3 [y]: no `test`" in result.output
    assert not out.exists()
    mcq = _jsonl(tmp_path / "mcq.jsonl", [{"question": "q", "choices": ["a", "b"], "answer": "E"}])
    with pytest.raises(TaskFormatError, match=r"mcq.jsonl:line 1 \[mcq-1\]: `answer` 'E' is neither"):
        import_tasks(mcq, "mcq")


def test_cli_import_then_oracle_eval_passes_whole_references(tmp_path: Path) -> None:
    source = _jsonl(tmp_path / "code.jsonl", [HUMANEVAL, {**MBPP, "prompt": MBPP["text"], "test": MBPP["test_list"],
                                                          "canonical_solution": MBPP["code"], "task_id": "mbpp/11"}])
    out = tmp_path / "tasks.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, ["tasks", "import", str(source), "--format", "code-tests", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert [t.id for t in load_tasks(out)] == ["HumanEval/0", "mbpp/11"]
    # --max-new-tokens far below the references' length: the oracle answers with them whole anyway
    result = runner.invoke(app, ["eval", "--model", "oracle", "--tasks", str(out), "--out", str(tmp_path / "ev"),
                                 "--max-new-tokens", "8", "--config", str(_unsafe_config(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "pass rate 100.0%" in result.output


def test_wrong_code_fails_the_imported_tests(tmp_path: Path) -> None:
    (task,) = import_tasks(_jsonl(tmp_path / "code.jsonl", [HUMANEVAL]), "code-tests")
    from tidal.config.schema import RewardConfig
    from tidal.reward.scorer import Scorer
    from tidal.sandbox import get_backend

    scorer = Scorer(RewardConfig(), backend=get_backend("unsafe_local"))
    try:
        good, bad = scorer.score_many([(task, task.reference), (task, "def close(numbers, threshold):\n    return False\n")])
    finally:
        scorer.close()
    assert good.value == 1.0 and bad.value == 0.0


def test_domain_sources_name_datasets(tmp_path: Path) -> None:
    from tidal.config.load import load_config
    from tidal.pipeline.run import build_tasks

    _jsonl(tmp_path / "qa.jsonl", [{"q": f"{i} + {i}?", "a": str(2 * i)} for i in range(4)])
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"tasks": {"domains": {"sums": {"sources": [
        {"path": "qa.jsonl", "format": "qa", "map": {"question": "q", "answer": "a"}, "split": "test", "limit": 3}]}}}}))
    cfg = load_config(config)
    assert Path(cfg.tasks.domains["sums"].sources[0].path) == (tmp_path / "qa.jsonl").resolve()  # beside the config
    train, evaluation = build_tasks(cfg)
    assert train["sums"] == [] and [t.verifier.args["answer"] for t in evaluation] == ["0", "2", "4"]
    with pytest.raises(TaskFormatError):  # a plain path still means a tidal task file, which this is not
        load_sources([str(tmp_path / "qa.jsonl")])


def _unsafe_config(tmp_path: Path) -> Path:
    path = tmp_path / "eval.yaml"
    path.write_text("backend: unsafe_local\n")
    return path
