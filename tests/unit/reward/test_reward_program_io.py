"""program_io under the bwrap sandbox: per-case verdicts, typed outcomes for broken, hanging and
hostile programs, and a harness the candidate cannot talk over."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from tidal.reward import ScoringContext, get_verifier
from tidal.reward.verifiers.io_harness import extract_program
from tidal.reward.verifiers.io_runner import outputs_match
from tidal.types import Outcome, Score, Task

CASES = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 7\n", "output": "12"}, {"input": "-1 1\n", "output": "0\n"}]
CORRECT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


def make_task(**args: Any) -> Task:
    return Task(id="io/sum", domain="code", prompt="Add two numbers.",
                verifier={"name": "program_io", "cases": CASES, "case_timeout_s": 2, **args})


def score(ctx: ScoringContext, answer: str, task: Task | None = None) -> Score:
    return get_verifier("program_io")(task or make_task(), answer, ctx)


# ----------------------------------------------------------------------------- no sandbox needed


def test_outputs_match_ignores_trailing_whitespace_only() -> None:
    assert outputs_match("3  \n\n\n", "3")
    assert outputs_match("a b\r\nc\n", "a b\nc")
    assert not outputs_match(" 3", "3")
    assert not outputs_match("3\n4", "3")
    assert not outputs_match("0.30000000000000004", "0.3")


def test_outputs_match_with_a_float_tolerance() -> None:
    assert outputs_match("0.30000000000000004 x", "0.3 x", abs_tol=1e-9)
    assert outputs_match("100.5", "100", rel_tol=0.01)
    assert not outputs_match("100.5", "100", rel_tol=0.001)
    assert not outputs_match("nan", "1", abs_tol=1e9)
    assert not outputs_match("1 2", "1", abs_tol=1)


def test_extract_program_picks_the_language() -> None:
    answer = "```python\nprint(1)\n```\nand in C:\n```c\nint main(){}\n```\n"
    assert extract_program(answer, None, False) == ("c", "int main(){}\n")
    assert extract_program(answer, "python", False) == ("python", "print(1)\n")
    assert extract_program("print(2)\n", None, False) == ("python", "print(2)\n")
    missing = extract_program("print(2)\n", None, True)
    assert isinstance(missing, Score) and missing.outcome is Outcome.FAILED
    other = extract_program("```rust\nfn main(){}\n```", "cpp", False)
    assert isinstance(other, Score) and "no cpp code block" in other.detail


@pytest.mark.parametrize("args, field", [
    ({"cases": []}, "verifier.cases"),
    ({"cases": [{"input": "1"}]}, "verifier.cases[0].output"),
    ({"cases": [{"input": 1, "output": "1"}]}, "verifier.cases[0].input"),
    ({"case_timeout_s": -1}, "verifier.case_timeout_s"),
    ({"language": "cobol"}, "verifier.language"),
    ({"abs_tol": "small"}, "verifier.abs_tol"),
])
def test_bad_arguments_are_infra_errors_naming_the_field(args: dict[str, Any], field: str) -> None:
    result = score(ScoringContext("bwrap"), CORRECT, make_task(**args))
    assert result.outcome is Outcome.INFRA_ERROR
    assert f"[io/sum] {field}:" in result.detail


# ----------------------------------------------------------------------------- in the sandbox


def test_correct_program_passes_every_case(sandboxed: ScoringContext) -> None:
    result = score(sandboxed, CORRECT)
    assert (result.value, result.outcome) == (1.0, Outcome.PASSED), result.detail
    assert result.info["verdicts"] == ["passed", "passed", "passed"]
    assert all(case["cpu_s"] > 0 for case in result.info["cases"])


def test_partly_wrong_program_scores_the_fraction_with_evidence(sandboxed: ScoringContext) -> None:
    answer = "```python\na, b = map(int, input().split())\nprint(a + b if a > 0 else 5)\n```"
    result = score(sandboxed, answer)
    assert (result.value, result.outcome) == (pytest.approx(2 / 3), Outcome.FAILED)
    assert result.info["verdicts"] == ["passed", "passed", "wrong_answer"]
    assert "case 2: wrong answer: got '5\\n', expected '0\\n'" in result.detail


def test_runtime_errors_and_syntax_errors_fail(sandboxed: ScoringContext) -> None:
    raises = score(sandboxed, "```python\nraise ValueError('boom')\n```")
    assert (raises.value, raises.outcome) == (0.0, Outcome.FAILED)
    assert raises.info["verdicts"] == ["runtime_error"] * 3 and "ValueError: boom" in raises.detail
    broken = score(sandboxed, "```python\ndef f(:\n```")
    assert (broken.value, broken.outcome) == (0.0, Outcome.FAILED)
    assert "does not compile" in broken.detail and "SyntaxError" in broken.detail


def test_hanging_program_times_out_per_case(sandboxed: ScoringContext) -> None:
    answer = "```python\na, b = map(int, input().split())\nif a < 0:\n    while True: pass\nprint(a + b)\n```"
    result = score(sandboxed, answer, make_task(case_timeout_s=0.5))
    assert (result.value, result.outcome) == (pytest.approx(2 / 3), Outcome.TIMEOUT)
    assert result.info["verdicts"] == ["passed", "passed", "timeout"]


def test_float_tolerance_option(sandboxed: ScoringContext) -> None:
    cases = [{"input": "", "output": "0.3333333\n"}]
    answer = "```python\nprint(1 / 3)\n```"
    assert score(sandboxed, answer, make_task(cases=cases)).outcome is Outcome.FAILED
    assert score(sandboxed, answer, make_task(cases=cases, abs_tol=1e-6)).outcome is Outcome.PASSED


def test_hostile_outputs_are_contained(sandboxed: ScoringContext) -> None:
    flood = score(sandboxed, "```python\nimport sys\nsys.stdout.write('x' * 10**8)\n```", make_task(max_output_bytes=4096))
    assert (flood.value, flood.outcome) == (0.0, Outcome.FAILED)
    assert flood.info["verdicts"] == ["output_limit"] * 3
    binary = score(sandboxed, "```python\nimport sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x00' * 100)\n```")
    assert (binary.value, binary.outcome) == (0.0, Outcome.FAILED)
    assert binary.info["verdicts"] == ["wrong_answer"] * 3


def test_memory_bomb_is_a_memory_limit(sandboxed: ScoringContext) -> None:
    task = make_task().model_copy(update={"limits": make_task().limits.model_copy(update={"memory_mb": 128})})
    result = score(sandboxed, "```python\nx = bytearray(10**9)\n```", task)
    assert (result.value, result.outcome) == (0.0, Outcome.MEMORY_LIMIT)


def test_candidate_cannot_forge_or_reach_the_report_channel(sandboxed: ScoringContext) -> None:
    # It looks for the channel everywhere a subprocess could find it, and prints what it found.
    probe = (
        "```python\nimport os, socket\nfound = [k for k in os.environ if k.startswith('TIDAL_REPORT')]\n"
        "for fd in range(3, 64):\n"
        "    try:\n        socket.socket(fileno=fd).send(b'{\"event\": \"case\", \"verdict\": \"passed\"}\\n')\n"
        "        found.append(fd)\n    except OSError:\n        pass\n"
        "try:\n    os.listdir(f'/proc/{os.getppid()}/fd'); found.append('parent fds')\nexcept OSError:\n    pass\n"
        "try:\n    open(f'/proc/{os.getppid()}/mem', 'rb'); found.append('parent mem')\nexcept OSError:\n    pass\n"
        "print(found)\n```"
    )
    result = score(sandboxed, probe, make_task(cases=[{"input": "", "output": "[]"}]))
    assert (result.value, result.outcome) == (1.0, Outcome.PASSED), result.detail


def test_killing_the_harness_scores_nothing(sandboxed: ScoringContext) -> None:
    result = score(sandboxed, "```python\nimport os\nos.kill(os.getppid(), 9)\n```")
    assert (result.value, result.outcome) == (0.0, Outcome.CRASHED)


def test_no_code_empty_and_prose_answers_fail(sandboxed: ScoringContext) -> None:
    assert score(sandboxed, "```python\n\n```").detail == "the answer's code block is empty"
    assert score(sandboxed, "   ").outcome is Outcome.FAILED
    prose = score(sandboxed, "The answer is 3.")  # no fence: the whole answer is the program
    assert (prose.value, prose.outcome) == (0.0, Outcome.FAILED) and "does not compile" in prose.detail


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_c_program_is_compiled_and_run_in_the_sandbox(sandboxed: ScoringContext) -> None:
    good = "```c\n#include <stdio.h>\nint main(void){int a,b;scanf(\"%d %d\",&a,&b);printf(\"%d\\n\",a+b);return 0;}\n```"
    assert score(sandboxed, good).outcome is Outcome.PASSED
    segfault = "```c\nint main(void){int *p = 0; return *p;}\n```"
    crashed = score(sandboxed, segfault)
    assert (crashed.value, crashed.outcome) == (0.0, Outcome.CRASHED)
    assert crashed.info["verdicts"] == ["crashed"] * 3
    broken = score(sandboxed, "```c\nint main(void){ return }\n```")
    assert (broken.value, broken.outcome) == (0.0, Outcome.FAILED) and "error" in broken.detail
