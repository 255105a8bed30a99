"""The auditor's two blind spots of issue 48: an answer key the tests read from a starting file
(no expected value is a literal of the tests, so only a candidate that reads the files shows it),
and a short prompt restated across splits with a few words changed (or a code task whose answers
define the same functions for the same assertions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.audit import audit_tasks
from tidal.audit.duplicates import DuplicateIndex
from tidal.audit.exploits import probes_for
from tidal.config.schema import AuditConfig
from tidal.types import Task

KEY_TESTS = ("import json\nfrom solution import square\n\nCASES = json.load(open('expected.json'))\n\n\n"
             "def test_cases():\n    for n, want in CASES.items():\n        assert square(int(n)) == want\n")


def code_task(task_id: str, files: dict[str, str], reference: str, tests: str = KEY_TESTS, split: str = "train",
              prompt: str = "Write square(n) that returns n * n.") -> Task:
    return Task.model_validate({"id": task_id, "domain": "code", "split": split, "prompt": prompt,
                                "verifier": {"name": "python_tests"}, "files": files,
                                "tests": {"test_solution.py": tests}, "reference": reference})


def text(task_id: str, split: str, prompt: str, answer: str, verifier: str = "exact_match") -> Task:
    return Task.model_validate({"id": task_id, "domain": "general", "split": split, "prompt": prompt,
                                "verifier": {"name": verifier, "answer": answer}, "reference": answer})


def test_the_workspace_probe_applies_only_when_the_reference_reads_no_file() -> None:
    keyed = code_task("k", {"expected.json": '{"3": 9, "4": 16}'}, "def square(n):\n    return n * n\n")
    assert "answers from the workspace files" in dict(probes_for(keyed))
    reads = code_task("r", {"table.json": '{"3": 9}'}, "import json\n\ndef square(n):\n"
                      "    return json.load(open('table.json'))[str(n)]\n")
    assert "answers from the workspace files" not in dict(probes_for(reads))
    assert "answers from the workspace files" not in dict(probes_for(code_task("n", {}, "def square(n):\n    return n * n\n")))


@pytest.mark.usefixtures("bwrap")
def test_an_answer_key_the_tests_read_from_a_starting_file_is_quarantined_and_inputs_are_not(tmp_path: Path) -> None:
    import yaml

    keyed = code_task("code/key", {"expected.json": '{"3": 9, "4": 16, "12": 144}'}, "def square(n):\n    return n * n\n")
    inputs = code_task("code/inputs", {"inputs.json": "[3, 4, 12]"}, "def square(n):\n    return n * n\n",
                       tests="import json\nfrom solution import square\n\n\ndef test_inputs():\n"
                             "    for n in json.load(open('inputs.json')):\n        assert square(n) == n ** 2\n")
    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump([t.model_dump(mode="json", exclude_none=True) for t in (keyed, inputs)]))
    result = audit_tasks([path], AuditConfig(reference_runs=1), checks=["null_solution", "exploit"], progress=False)
    verdicts = {a.task_id: a for a in result.audits}
    [finding] = [f for f in verdicts["code/key"].findings if f.check == "exploit"]
    assert finding.severity == "quarantine" and finding.evidence["probe"] == "answers from the workspace files"
    assert verdicts["code/inputs"].verdict == "ok"


def _kinds(tasks: list[Task]) -> dict[str, str | None]:
    index = DuplicateIndex()
    found = {}
    for task in tasks:
        findings = [f for f in index.check(task) if f.severity != "info"]
        found[task.id] = findings[0].evidence["kind"] if findings else None
    return found


def test_a_short_prompt_restated_across_splits_is_a_near_duplicate() -> None:
    found = _kinds([
        text("train/product", "train", "What is 12 times 7?", "84", "math"),
        text("eval/product", "eval", "Compute 12 times 7.", "84", "math"),
        text("train/vowels", "train", "How many vowels does the word banana have?", "3"),
        text("eval/vowels", "eval", "Count the vowels in the word banana.", "3"),
    ])
    assert found == {"train/product": None, "eval/product": "short", "train/vowels": None, "eval/vowels": "short"}


def test_the_same_short_answer_to_another_question_is_not_a_duplicate() -> None:
    found = _kinds([
        text("train/log", "train", "What is the first letter of log?", "l"),
        text("eval/lion", "eval", "What is the first letter of lion?", "l"),  # an operand replaced
        text("train/product", "train", "What is 12 times 7?", "84", "math"),
        text("eval/other", "eval", "What is 21 times 4?", "84", "math"),  # other numbers
        text("eval/same-split", "train", "Compute 12 times 7.", "84", "math"),  # same split: not across
    ])
    assert not any(kind == "short" for kind in found.values()), found


def test_code_with_the_same_functions_and_assertions_is_one_problem_whatever_the_prompt() -> None:
    tests = "from solution import clamp01\n\n\ndef test_low():\n    assert clamp01(-2) == 0\n\n\n" \
            "def test_mid():\n    assert clamp01(0.5) == 0.5\n"
    other = "from solution import clamp01\n\n\ndef test_none():\n    assert clamp01(None) == 0\n\n\n" \
            "def test_mid():\n    assert clamp01(0.25) == 0.25\n"
    found = _kinds([
        code_task("train/clamp", {}, "def clamp01(x):\n    return min(max(x, 0), 1)\n", tests,
                  prompt="Write clamp01(x) that limits x to the range 0 to 1."),
        code_task("eval/clamp", {}, "def clamp01(v):\n    if v < 0:\n        return 0\n    return min(v, 1)\n", tests,
                  split="eval", prompt="Implement clamp01(value): below zero gives 0, above one gives 1, else itself."),
        code_task("eval/other", {}, "def clamp01(x):\n    return 0 if x is None else min(max(x, 0), 1)\n", other,
                  split="eval", prompt="Write clamp01(x) that limits x to the range 0 to 1, mapping None to 0."),
    ])
    assert found == {"train/clamp": None, "eval/clamp": "tests", "eval/other": None}
