"""Check 8, answers leaked through workspace files, the prompt, or tests shipped to the solver:
the tests' expected values (or the text answer) readable where the solution can read them."""

from __future__ import annotations

from typing import Any

from tidal.audit.context import AuditContext
from tidal.audit.expected import contains, expectations, tokens
from tidal.audit.leakage import check_leakage
from tidal.tasks import generate_tasks
from tidal.types import Task

PRIME_TESTS = ("from solution import nth_prime\n\n\ndef test_small():\n    assert nth_prime(1) == 2\n"
               "    assert nth_prime(5) == 11\n\n\ndef test_large():\n    assert nth_prime(10) == 29\n"
               "    assert nth_prime(100) == 541\n")


def code_task(files: dict[str, str], prompt: str = "Write nth_prime(n): the n-th prime number.", **extra: Any) -> Task:
    return Task.model_validate({"id": "t", "domain": "code", "prompt": prompt, "verifier": {"name": "python_tests"},
                                "tests": {"test_solution.py": PRIME_TESTS}, "files": files,
                                "reference": "def nth_prime(n):\n    return 2\n", **extra})


def leaks(task: Task) -> list[tuple[str, str]]:
    return [(f.severity, f.evidence.get("where", "")) for f in check_leakage(task, AuditContext(), {})
            if f.severity != "info"]


def test_tokens_and_ordered_search() -> None:
    assert tokens('{"1": 2, "Ana": 3.5, "nth_prime": 1}') == ["1", "2", "Ana", "3.5", "nth_prime", "1"]
    assert contains(tokens('{"1": 2, "5": 11}'), ("2", "11"))
    assert not contains(tokens("11 2"), ("2", "11"))  # out of order
    assert not contains(tokens("2 a b c d 11"), ("2", "11"))  # too far apart


def test_expected_values_come_from_the_literal_side() -> None:
    found = expectations(code_task({}))
    assert [e.tokens for e in found] == [("2",), ("11",), ("29",), ("541",)]


def test_a_json_file_of_every_expected_value_is_a_leak() -> None:
    task = code_task({"data/expected.json": '{"1": 2, "5": 11, "10": 29, "100": 541}\n'})
    assert leaks(task) == [("quarantine", "files/data/expected.json")]


def test_a_file_that_is_the_expected_value_is_a_leak() -> None:
    task = Task.model_validate({
        "id": "t", "domain": "code", "prompt": "Write total() returning the sum of 1..100.",
        "verifier": {"name": "python_tests"}, "files": {"expected_output.txt": "5050\n"},
        "tests": {"test_solution.py": "from solution import total\n\ndef test_total():\n    assert total() == 5050\n"}})
    assert leaks(task) == [("quarantine", "files/expected_output.txt")]


def test_an_agent_tasks_answer_key_in_the_workspace_is_a_leak() -> None:
    chore = generate_tasks("agent", 5, "eval", 0, 1, 5)[4]  # totals.csv from sales.csv
    assert leaks(chore) == []
    rows = "\n".join(chore.tests["test_chore.py"].split("== [")[1].split("]")[0].replace("'", "").split(", "))
    leaky = chore.model_copy(update={"files": {**chore.files, "notes/checked_totals.txt": rows + "\n"}})
    assert leaks(leaky) == [("quarantine", "files/notes/checked_totals.txt")]


def test_a_text_answer_in_a_file_is_a_leak() -> None:
    task = Task.model_validate({"id": "t", "domain": "math", "prompt": "What is 17 times 23?",
                                "verifier": {"name": "math", "answer": "391"}, "files": {"answer.txt": "391\n"}})
    assert leaks(task) == [("quarantine", "files/answer.txt")]


def test_io_outputs_in_a_file_are_a_leak() -> None:
    cases = [{"input": "3\n", "output": "9\n"}, {"input": "12\n", "output": "144\n"}]
    task = Task.model_validate({"id": "t", "domain": "code", "prompt": "Read n and print n squared.",
                                "verifier": {"name": "program_io", "cases": cases, "language": "python"},
                                "files": {"cases/outputs.txt": "9\n144\n"}})
    assert ("quarantine", "files/cases/outputs.txt") in leaks(task)


def test_tests_shipped_in_the_workspace_are_a_leak() -> None:
    task = code_task({"tests/test_solution.py": PRIME_TESTS})
    assert ("quarantine", "files/tests/test_solution.py") in leaks(task)


def test_every_expected_value_in_the_prompt_warns() -> None:
    prompt = "Write nth_prime(n). nth_prime(1) is 2, nth_prime(5) is 11, nth_prime(10) is 29, nth_prime(100) is 541."
    assert leaks(code_task({}, prompt=prompt)) == [("warn", "prompt")]
    assert leaks(code_task({}, prompt="Write nth_prime(n); for example nth_prime(5) is 11.")) == []


def test_an_input_to_pick_the_answer_from_is_not_a_leak() -> None:
    config = "[client]\nport = 8080\nhost = localhost\n\n[server]\nport = 9443\nhost = db-main.internal\n"
    tests = ("from pathlib import Path\n\ndef test_host():\n    assert Path('host.txt').read_text().strip() == "
             "'db-main.internal'\n\ndef test_port():\n    assert Path('port.txt').read_text().strip() == '9443'\n")
    task = Task.model_validate({"id": "t", "domain": "agent", "prompt": "Write the [server] host of config.ini to host.txt "
                                "and its port to port.txt.", "tools": ["bash", "submit"], "max_steps": 5,
                                "verifier": {"name": "python_tests"}, "tests": {"test_config.py": tests},
                                "files": {"config.ini": config}})
    assert leaks(task) == []
    notes = task.model_copy(update={"files": {**task.files, "notes.txt": "db-main.internal 9443\n"}})
    assert leaks(notes) == [("quarantine", "files/notes.txt")]


def test_inputs_and_kept_files_are_not_leaks() -> None:
    # Built-in chores: data files are inputs; an assertion that words.txt is unchanged reads it.
    for task in generate_tasks("agent", 10, "train", 3, 1, 5):
        assert leaks(task) == [], task.id
    primes = code_task({"data/primes_below_20.txt": "2 3 5 7 11 13 17 19\n"})
    assert leaks(primes) == []  # 2 and 11 are there, 29 and 541 are not
