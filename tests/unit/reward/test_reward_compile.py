"""compile under the bwrap sandbox: what compiles scores 1, what does not scores 0 with the
compiler's diagnostics, and hostile sources end in typed outcomes."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from tidal.reward import ScoringContext, get_verifier
from tidal.types import Limits, Outcome, Score, Task

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None, reason="gcc/g++ missing")


def make_task(limits: Limits | None = None, **args: Any) -> Task:
    return Task(id="code/compiles", domain="code", prompt="Write it.", verifier={"name": "compile", **args},
                limits=limits or Limits(timeout_s=20))


def score(ctx: ScoringContext, answer: str, task: Task | None = None) -> Score:
    return get_verifier("compile")(task or make_task(), answer, ctx)


def test_bad_arguments_are_infra_errors() -> None:
    result = score(ScoringContext("bwrap"), "```python\nx = 1\n```", make_task(language="fortran"))
    assert result.outcome is Outcome.INFRA_ERROR and "[code/compiles] verifier.language:" in result.detail
    result = score(ScoringContext("bwrap"), "```python\nx = 1\n```", make_task(flags=3))
    assert result.outcome is Outcome.INFRA_ERROR and "verifier.flags" in result.detail


def test_answers_without_code_fail_before_any_sandbox() -> None:
    ctx = ScoringContext("no-such-backend")  # never asked for
    assert score(ctx, "It is 42.").detail == "the answer holds no fenced code block"
    assert score(ctx, "```python\n   \n```").detail == "the answer's code block is empty"
    assert score(ctx, "```python\nx = '\0'\n```").detail == "answer contains NUL bytes"
    assert score(ctx, "```c\nint x;\n```", make_task(language="python")).outcome is Outcome.FAILED


def test_python_compiles_or_shows_the_syntax_error(sandboxed: ScoringContext) -> None:
    good = score(sandboxed, "Here:\n```python\ndef f(x):\n    return undefined_name(x)\n```")
    assert (good.value, good.outcome, good.components) == (1.0, Outcome.PASSED, {"compiles": 1.0})
    bad = score(sandboxed, "```python\ndef f(x:\n    return x\n```")
    assert (bad.value, bad.outcome) == (0.0, Outcome.FAILED)
    assert "SyntaxError" in bad.detail and 'File "solution.py", line 1' in bad.detail


def test_python_code_is_compiled_not_run(sandboxed: ScoringContext) -> None:
    result = score(sandboxed, "```python\nwhile True:\n    pass\n```", make_task(limits=Limits(timeout_s=5)))
    assert result.outcome is Outcome.PASSED


@needs_gcc
def test_c_and_cpp_compile_in_the_sandbox(sandboxed: ScoringContext) -> None:
    c = score(sandboxed, "```c\n#include <stdio.h>\nint main(void) { puts(\"hi\"); return 0; }\n```")
    assert (c.value, c.outcome, c.info["language"]) == (1.0, Outcome.PASSED, "c")
    cpp = score(sandboxed, "```cpp\n#include <vector>\nint f() { std::vector<int> v{1, 2}; return v.size(); }\n```")
    assert (cpp.value, cpp.outcome, cpp.info["language"]) == (1.0, Outcome.PASSED, "cpp")
    broken = score(sandboxed, "```c++\n#include <vector>\nint f() { std::vector<int> v; return v.size() }\n```")
    assert (broken.value, broken.outcome) == (0.0, Outcome.FAILED)
    assert "error: expected ';'" in broken.detail.replace("\u2018", "'").replace("\u2019", "'")


@needs_gcc
def test_language_argument_wins_over_the_fence(sandboxed: ScoringContext) -> None:
    # Valid C++ that is not C.
    answer = "```\ntemplate <typename T> T id(T x) { return x; }\n```"
    assert score(sandboxed, answer, make_task(language="cpp")).outcome is Outcome.PASSED
    assert score(sandboxed, answer, make_task(language="c")).outcome is Outcome.FAILED


@needs_gcc
def test_hostile_includes_hit_the_limits(sandboxed: ScoringContext) -> None:
    task = make_task(limits=Limits(timeout_s=10, memory_mb=256), language="c")
    endless = score(sandboxed, "```c\n#include \"/dev/zero\"\n```", task)
    assert endless.value == 0.0 and endless.outcome in (Outcome.MEMORY_LIMIT, Outcome.TIMEOUT)
    secret = score(sandboxed, "```c\n#include \"/etc/shadow\"\n```", task)
    assert (secret.value, secret.outcome) == (0.0, Outcome.FAILED)
    assert "/etc/shadow: No such file or directory" in secret.detail or "/etc/shadow: Permission denied" in secret.detail
