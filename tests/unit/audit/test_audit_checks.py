"""The checks' building blocks, without a sandbox: test reordering, mutants, the impossible
variant, null answers and probes, leakage rules, MinHash, failure classes, lenient loading."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tidal.audit.code import callable_names
from tidal.audit.context import AuditContext
from tidal.audit.duplicates import DuplicateIndex, minhash, shingles, similarity
from tidal.audit.exploits import probes_for
from tidal.audit.impossible import flip_tests, impossible_variant
from tidal.audit.leakage import check_leakage
from tidal.audit.mutants import mutants
from tidal.audit.nulls import null_answers
from tidal.audit.reference import classify, reorder_tests
from tidal.audit.source import stream_records
from tidal.types import Outcome, Score, Task

TESTS = '''from solution import f

def test_a():
    assert f(1) == 2


@pytest.mark.x
def test_b():
    assert f(2) == 3

HELPER = 1

def test_c():
    assert f(3) == 4
'''


def code_task(**update: object) -> Task:
    record = {"id": "t", "domain": "code", "prompt": "Write f(x) returning x plus 1.",
              "verifier": {"name": "python_tests"}, "tests": {"test_solution.py": TESTS},
              "reference": "def f(x):\n    return x + 1\n"}
    record.update(update)
    return Task.model_validate(record)


def test_reorder_reverses_tests_and_keeps_everything_else_in_place() -> None:
    reversed_source = reorder_tests(TESTS, "reversed")
    names = [line for line in reversed_source.splitlines() if line.startswith("def test_")]
    assert names == ["def test_c():", "def test_b():", "def test_a():"]
    assert "@pytest.mark.x\ndef test_b():" in reversed_source  # the decorator moves with its test
    assert reversed_source.index("HELPER = 1") > reversed_source.index("def test_b")
    assert sorted(reversed_source.splitlines()) == sorted(TESTS.splitlines())
    assert reorder_tests(TESTS, "original") == TESTS
    assert reorder_tests(TESTS, "shuffled-3") == reorder_tests(TESTS, "shuffled-3")


def test_mutants_are_deterministic_distinct_and_capped() -> None:
    code = "def grade(s):\n    if s >= 90 and s < 101:\n        return 'A'\n    return -1\n"
    every = mutants(code, 100)
    descriptions = [d for d, _ in every]
    assert "line 2: >= -> >" in descriptions and "line 2: and -> or" in descriptions
    assert "line 3: return None" in descriptions and "line 4: drop unary -" in descriptions
    assert len({source for _, source in every}) == len(every)
    capped = mutants(code, 4)
    assert len(capped) == 4 and capped == mutants(code, 4)
    assert all(source != code for _, source in every)


def test_impossible_variant_flips_the_first_literal_expectation() -> None:
    flipped, what = flip_tests(code_task())
    assert "assert f(1) == 3" in flipped["test_solution.py"]
    assert what.startswith("test_solution.py line 4")
    math = Task(id="m", domain="math", prompt="1+1?", verifier={"name": "math", "answer": "2"}, reference="2")
    variant, _ = impossible_variant(math)
    assert variant.verifier.args["answer"] == "3"


def test_null_answers_use_the_reference_signatures() -> None:
    answers = null_answers(code_task())
    assert answers["stub returns the input"] == "```python\ndef f(*args, **kwargs):\n    return args[0] if args else None\n```"
    assert set(answers) == {"empty answer", "defines nothing", "stub returns None", "stub returns 0",
                            'stub returns ""', "stub returns the input"}
    math = Task(id="m", domain="math", prompt="Ann has 3 pens and buys 4.", verifier={"name": "math", "answer": "7"})
    assert null_answers(math)["copies 4 from the prompt"] == "4"


def test_probes_are_written_for_the_task_names() -> None:
    task = code_task(tests={"test_x.py": "from solution import alpha, beta\ndef test_a():\n    assert alpha(1) == beta(2)\n"})
    assert callable_names(task) == ["f", "alpha", "beta"]
    probes = dict(probes_for(task))
    assert "def beta(*args, **kwargs):\n    return _Anything()" in probes["always-equal object built with type()"]
    assert "open('test_x.py', 'w')" in probes["rewrites the test files"]


def test_leakage_rules() -> None:
    ctx = AuditContext()
    leaked = code_task(prompt="Write f. Check: assert f(1) == 2")
    assert [f.severity for f in check_leakage(leaked, ctx, {})] == ["quarantine"]
    reference_in_files = code_task(files={"notes.txt": "def f(x):\n    return x + 1\n"})
    [finding] = check_leakage(reference_in_files, ctx, {})
    assert finding.message == "the reference is in the files/notes.txt"
    assert check_leakage(code_task(), ctx, {}) == []
    picked = Task(id="r", domain="reasoning", prompt="What is the largest of 3 9 2?",
                  verifier={"name": "exact_match", "answer": "9"}, reference="9")
    assert [f.severity for f in check_leakage(picked, ctx, {})] == ["info"]


def test_minhash_estimates_jaccard() -> None:
    a = shingles("the quick brown fox jumps over the lazy dog near the river bank today")
    b = shingles("the quick brown fox jumps over the lazy dog near the river bank")
    c = shingles("an entirely different sentence about tax forms and bureaucracy")
    exact = len(a & b) / len(a | b)
    assert abs(similarity(minhash(a), minhash(b)) - exact) < 0.2
    assert similarity(minhash(a), minhash(c)) < 0.2
    assert (minhash(a) == minhash(set(a))).all()


def test_duplicates_within_a_split_are_milder_than_across() -> None:
    index = DuplicateIndex()
    base = {"domain": "math", "verifier": {"name": "math", "answer": "5"}, "prompt": "What is two plus three?"}
    assert index.check(Task(id="a", split="train", **base)) == []
    [within] = index.check(Task(id="b", split="train", **base))
    [across] = index.check(Task(id="c", split="eval", **base))
    assert (within.severity, across.severity) == ("warn", "quarantine")
    other_answer = {**base, "verifier": {"name": "math", "answer": "6"}}
    assert index.check(Task(id="d", split="eval", **other_answer)) == []  # a template sibling, not a duplicate


def test_failures_are_classified() -> None:
    def score(outcome: Outcome, detail: str, failure: str = "") -> Score:
        return Score(0.0, outcome, {}, detail, {"failure": failure})

    assert classify(score(Outcome.TIMEOUT, "")) == "timeout"
    assert classify(score(Outcome.FAILED, "", "E   ModuleNotFoundError: No module named 'x'")) == "missing module or package"
    assert classify(score(Outcome.FAILED, "", "OSError: [Errno 101] Network is unreachable")) == "network access"
    assert classify(score(Outcome.FAILED, "1/2 tests passed", "AssertionError")) == "wrong expectation"


def test_records_stream_past_bad_input(tmp_path: Path) -> None:
    good = {"id": "ok-1", "domain": "math", "prompt": "1+1?", "verifier": {"name": "math", "answer": "2"}}
    (tmp_path / "a.jsonl").write_bytes(b'{"id": \n' + json.dumps(good).encode() + b"\n\xff\xfe\n")
    (tmp_path / "b.yaml").write_text("- id: ok-1\n  domain: math\n")  # a duplicate id, fields missing
    unreadable = tmp_path / "c.jsonl"
    unreadable.write_text(json.dumps({**good, "id": "ok-2"}))
    unreadable.chmod(0)
    records = list(stream_records([tmp_path, tmp_path / "missing.jsonl"]))
    valid = [r.task_id for r in records if r.task is not None]
    problems = [p for r in records for p in r.problems]
    if os.geteuid() == 0:  # root reads a file whatever its mode
        assert valid == ["ok-1", "ok-2"]
    else:
        assert valid == ["ok-1"] and any("cannot read the file" in p for p in problems)
    assert any("not valid JSON" in p for p in problems) and any("not UTF-8" in p for p in problems)
    assert any("duplicate id" in p for p in problems) and any("no such file" in p for p in problems)
