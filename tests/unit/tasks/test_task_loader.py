"""Task files: JSONL and YAML, folders, writing, and problem reports with file, line, id and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.errors import TaskFormatError
from tidal.tasks import generate_tasks, load_tasks, write_tasks

VERIFIERS = {"math", "python_tests", "exact_match", "regex"}


def task(task_id: str, **fields: object) -> dict[str, object]:
    record: dict[str, object] = {
        "id": task_id,
        "domain": "math",
        "prompt": "What is 1 + 1?",
        "verifier": {"name": "math", "answer": "2"},
    }
    record.update(fields)
    return record


def jsonl(path: Path, *lines: object) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def problems_of(paths: list[str | Path], known: set[str] | None = VERIFIERS) -> list[str]:
    with pytest.raises(TaskFormatError) as caught:
        load_tasks(paths, known_verifiers=known)
    return caught.value.problems


def test_jsonl_loads_with_blank_lines(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "a.jsonl", task("a"), "", "   ", task("b", reference="2"))
    tasks = load_tasks([path], known_verifiers=VERIFIERS)
    assert [t.id for t in tasks] == ["a", "b"] and tasks[1].reference == "2"


def test_every_problem_is_reported_at_once_with_line_id_and_field(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path / "bad.jsonl",
        task("ok"),
        '{"id": "broken", "domain": "math" "prompt": "x"}',
        "[1, 2]",
        task("t4", domain="my-maths", limits={"timeout_s": -1, "memroy_mb": 3}, promt="x"),
        task("t5", verifier={"name": "math"}, prompt=[{"role": "bot", "content": "x"}, {"role": "user"}]),
        task("t6", prompt=5, tests={"test_a.py": 3}, split="test"),
        {"domain": "math", "prompt": "", "verifier": "math", "max_steps": "many"},
        task("t8", verifier={"name": "pyhton_tests"}),
    )
    found = problems_of([path])
    where = str(path)
    expected = [
        f"{where}:2: not valid JSON: Expecting ',' delimiter (column 35)",
        f"{where}:3 (root): a task is a mapping of fields (a JSON object), got a list",
        f"{where}:4 [t4] domain: 'my-maths' is not a domain name: an identifier (letters, digits, _; e.g. code, agent, math, knowledge, reasoning, general, custom, or your own such as sql)",
        f"{where}:4 [t4] limits.timeout_s: must be > 0.0, got -1",
        f"{where}:4 [t4] limits.memroy_mb: unknown field (did you mean 'memory_mb'?)",
        f"{where}:4 [t4] promt: unknown field (did you mean 'prompt'?)",
        f"{where}:5 [t5] prompt.0.role: must be 'system', 'user', 'assistant' or 'tool', got 'bot'",
        f"{where}:5 [t5] prompt.1.content: is required",
        f"{where}:6 [t6] prompt: must be str or list[Message], got a number",
        f"{where}:6 [t6] tests.test_a.py: input should be a valid string, got 3",
        f"{where}:6 [t6] split: must be 'train' or 'eval', got 'test'",
        f"{where}:7 id: is required",
        f"{where}:7 prompt: must not be empty",
        f"{where}:7 verifier: input should be a valid dictionary or instance of VerifierSpec, got 'math'",
        f"{where}:7 max_steps: input should be a valid integer, unable to parse string as an integer, "
        "got 'many'",
        f"{where}:8 [t8] verifier.name: unknown verifier 'pyhton_tests' (did you mean 'python_tests'?); "
        "known: exact_match, math, python_tests, regex",
    ]
    assert found == expected


def test_unknown_verifiers_are_only_checked_when_the_names_are_given(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "a.jsonl", task("a", verifier={"name": "judge"}))
    assert load_tasks([path])[0].verifier.name == "judge"
    assert problems_of([path], known=set()) == [
        f"{path}:1 [a] verifier.name: unknown verifier 'judge'; known: (none)"
    ]


def test_yaml_documents_and_lists_carry_their_start_lines(tmp_path: Path) -> None:
    path = tmp_path / "tasks.yaml"
    path.write_text(
        "# a comment\n"
        "id: y1\n"                                  # line 2: document 1 starts
        "domain: math\n"
        "prompt: hi\n"
        "verifier: {name: math, answer: '2'}\n"
        "---\n"
        "- id: y2\n"                                # line 7: list item 1
        "  domain: code\n"
        "  prompt: write f\n"
        "  verifier: {name: python_tests, entrypoint: solution.py}\n"
        "  reference: |\n"
        "    def f():\n"
        "        return 1\n"
        "- id: y3\n"                                # line 14: list item 2
        "  domain: math\n"
        "  prompt: [1]\n"
        "  verifier: {name: math}\n"
        "- 7\n"                                     # line 18: not a task
        "---\n"
        "---\n"                                     # an empty document is skipped
        "id: y1\n"                                  # line 21: duplicate of line 2
        "domain: math\n"
        "prompt: again\n"
        "verifier: {name: math}\n"
    )
    assert problems_of([path]) == [
        f"{path}:14 [y3] prompt.0: input should be a valid dictionary or instance of Message, got 1",
        f"{path}:18 (root): a task is a mapping of fields (a JSON object), got a number",
        f"{path}:21 [y1] id: duplicate id, first defined at {path}:2",
    ]
    path.write_text(path.read_text().replace("prompt: [1]", "prompt: fine").replace("- 7\n", "")
                    .replace("id: y1\ndomain: math\nprompt: again", "id: y4\ndomain: math\nprompt: again"))
    tasks = load_tasks([path], known_verifiers=VERIFIERS)
    assert [t.id for t in tasks] == ["y1", "y2", "y3", "y4"]
    assert tasks[1].reference == "def f():\n    return 1\n"


def test_yaml_syntax_error_names_its_line_and_keeps_earlier_problems(tmp_path: Path) -> None:
    path = tmp_path / "broken.yml"
    path.write_text("id: a\ndomain: no-pe\nprompt: x\nverifier: {name: math}\n---\nid: b\nprompt: : bad\n")
    found = problems_of([path])
    assert found[0].startswith(f"{path}:1 [a] domain: 'no-pe' is not a domain name")
    assert found[1].startswith(f"{path}:7: not valid YAML: mapping values are not allowed here (column 9)")


def test_folders_are_searched_recursively_in_sorted_order(tmp_path: Path) -> None:
    jsonl(tmp_path / "b.jsonl", task("b1"))
    (tmp_path / "a").mkdir()
    jsonl(tmp_path / "a" / "z.jsonl", task("a-z"))
    (tmp_path / "a" / "y.yml").write_text("id: a-y\ndomain: math\nprompt: p\nverifier: {name: math}\n")
    (tmp_path / "notes.txt").write_text("not tasks")
    (tmp_path / ".hidden").mkdir()
    jsonl(tmp_path / ".hidden" / "c.jsonl", "not even json")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    tasks = load_tasks([tmp_path, tmp_path / "b.jsonl"])  # b.jsonl named twice is read once
    assert [t.id for t in tasks] == ["a-y", "a-z", "b1"]
    assert load_tasks([tmp_path / "empty.yaml", tmp_path / "blank.jsonl"]) == []


def test_duplicate_ids_across_files_name_both_places(tmp_path: Path) -> None:
    first = jsonl(tmp_path / "one.jsonl", task("x"), task("y"))
    second = jsonl(tmp_path / "two.jsonl", task("z"), task("x"))
    assert problems_of([first, second]) == [f"{second}:2 [x] id: duplicate id, first defined at {first}:1"]


def test_missing_paths_and_other_file_types_are_problems(tmp_path: Path) -> None:
    other = tmp_path / "tasks.json"
    other.write_text("{}")
    good = jsonl(tmp_path / "good.jsonl", task("g", domain="code"))
    assert problems_of([tmp_path / "missing.jsonl", other, good]) == [
        f"{tmp_path / 'missing.jsonl'}: no such file or folder",
        f"{other}: not a task file; task files end in .jsonl, .yaml or .yml",
    ]


def test_non_utf8_bytes_are_a_problem_not_a_crash(tmp_path: Path) -> None:
    bad_jsonl = tmp_path / "latin.jsonl"
    valid = json.dumps(task("a")).encode()
    lines = [valid, b'{"id": "b", "prompt": "caf\xe9"}', valid]
    bad_jsonl.write_bytes(b"\n".join(lines) + b"\n")
    bad_yaml = tmp_path / "latin.yaml"
    bad_yaml.write_bytes(b"id: c\ndomain: math\nprompt: caf\xe9\n")
    assert problems_of([bad_jsonl, bad_yaml]) == [
        f"{bad_jsonl}:2: not UTF-8 text (byte 0xe9 at column 27); save the file as UTF-8",
        f"{bad_jsonl}:3 [a] id: duplicate id, first defined at {bad_jsonl}:1",  # other lines still read
        f"{bad_yaml}:3: not UTF-8 text (byte 0xe9 at column 12); save the file as UTF-8",
    ]


def test_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(task("a")).encode() + b"\n")
    assert load_tasks(path)[0].id == "a"


@pytest.mark.parametrize("name", ["tasks.jsonl", "tasks.yaml", "out/tasks.yml"])
def test_written_tasks_load_back_identical(tmp_path: Path, name: str) -> None:
    tasks = generate_tasks("code", 6, "train", 0, 1, 5) + generate_tasks("general", 6, "eval", 0, 1, 5)
    path = tmp_path / name
    write_tasks(tasks, path)
    assert load_tasks([path], known_verifiers=VERIFIERS) == tasks
    if name.endswith((".yaml", ".yml")):
        assert "reference: |" in path.read_text()  # code stays readable in YAML


def test_writing_an_unknown_file_type_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match="use .jsonl, .yaml or .yml"):
        write_tasks([], tmp_path / "tasks.csv")


def test_error_message_lists_every_problem(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "a.jsonl", "{", "[]")
    with pytest.raises(TaskFormatError) as caught:
        load_tasks([path])
    assert str(caught.value).startswith("2 invalid task(s)\n")
    assert f"{path}:1: not valid JSON" in str(caught.value) and f"{path}:2 (root)" in str(caught.value)
