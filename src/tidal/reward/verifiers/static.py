"""The `static` verifier: a style score from ruff's diagnostics on the answer's Python code.

ruff parses and lints the code; it never imports or executes it. It still runs inside the
sandbox, because a parser fed hostile input is attack surface: the ruff binary (from the
environment tidal runs in, pinned in pyproject.toml) is shipped as a read-only harness file and
started through its ELF loader, with `--isolated` (no configuration file from anywhere is read)
and `--no-cache`, by the harness's `ruff` mode (io_runner.py), which prints a bounded summary.

value = max(0, 1 - penalty * diagnostics). passed when there are none; failed otherwise, and
with value 0 when the code does not parse. infra_error when ruff is missing or did not run.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from functools import lru_cache
from pathlib import Path

from tidal.errors import SandboxUnavailableError, TaskFormatError
from tidal.reward.base import ScoringContext, verifier
from tidal.reward.verifiers.io_harness import (
    BOOT,
    HARNESS_FILES,
    bad_arg,
    bool_arg,
    elf_interpreter,
    extract_program,
    int_arg,
    language_arg,
    number_arg,
    problem_score,
    strings_arg,
)
from tidal.types import Outcome, Score, Task

DEFAULT_SELECT = ["E", "F", "W"]
RULE = re.compile(r"ALL|[A-Z]{1,4}[0-9]{0,4}")
RUFF_FILE = "ruff"


@lru_cache(maxsize=1)
def ruff_binary() -> tuple[bytes, str] | None:
    """The ruff executable next to this interpreter (the virtual environment) or on PATH, and its
    ELF loader; None when ruff is not installed."""
    beside = Path(sys.executable).with_name("ruff")
    path = beside if beside.is_file() else (Path(found) if (found := shutil.which("ruff")) else None)
    if path is None:
        return None
    data = path.read_bytes()
    return data, elf_interpreter(data)


def rules_arg(task: Task, name: str, default: list[str]) -> list[str]:
    rules = strings_arg(task, name, default)
    for rule in rules:
        if not RULE.fullmatch(rule):
            raise bad_arg(task, name, f"{rule!r} is not a ruff rule code or prefix (E501, F, ALL)")
    return rules


@verifier("static", sandbox=True)
def static(task: Task, answer: str, ctx: ScoringContext) -> Score:
    """Style score of the answer's Python code from ruff (1 - penalty per diagnostic); the code is never run."""
    try:
        language_arg(task, ("python",))
        select = rules_arg(task, "select", DEFAULT_SELECT)
        ignore = rules_arg(task, "ignore", [])
        penalty = number_arg(task, "penalty", 0.1, 0, 1)
        line_length = int_arg(task, "line_length", 88, 1, 320)
        require_fence = bool_arg(task, "require_fence", True)
    except TaskFormatError as error:
        return problem_score(task, error)
    assert penalty is not None
    if not select:
        return problem_score(task, bad_arg(task, "select", "must name at least one rule"))
    program = extract_program(answer, "python", require_fence)
    if isinstance(program, Score):
        program.components["style"] = 0.0
        return program
    _, code = program
    ruff = ruff_binary()
    if ruff is None:
        return Score(0.0, Outcome.INFRA_ERROR, {}, "ruff is not installed (pip install ruff, pinned in pyproject.toml)")
    data, loader = ruff
    args = ["check", "--isolated", "--no-cache", "--output-format=json", "--exit-zero", "--no-fix",
            f"--select={','.join(select)}", f"--line-length={line_length}"]
    if ignore:
        args.append(f"--ignore={','.join(ignore)}")
    try:
        backend = ctx.sandbox(task.image)
        result = backend.run([backend.python, "-I", "-c", BOOT, "ruff", loader, RUFF_FILE, *args, "--", "solution.py"],
                             {"solution.py": code}, ctx.limits(task),
                             env={"TIDAL_RUFF_TIMEOUT": str(max(1.0, ctx.limits(task).timeout_s - 1.0))},
                             harness_files={**HARNESS_FILES, RUFF_FILE: data})
    except SandboxUnavailableError as error:
        return Score(0.0, Outcome.INFRA_ERROR, {}, f"sandbox unavailable: {error}")
    try:
        summary = json.loads(result.stdout_text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        summary = {"error": f"no summary ({result.status.value} {result.detail}): {result.stderr_text[-1000:].strip()}"}
    if not isinstance(summary, dict):
        summary = {"error": f"malformed summary {result.stdout_text[-200:]!r}"}
    if "error" in summary:
        return Score(0.0, Outcome.INFRA_ERROR, {}, f"task {task.id}: ruff did not run: {summary.get('error')}")
    count, syntax = int(summary.get("count", 0)), int(summary.get("syntax_errors", 0))
    info = {"count": count, "by_code": summary.get("by_code", {}), "diagnostics": summary.get("diagnostics", []),
            "select": select, "ignore": ignore}
    shown = "; ".join(summary.get("diagnostics", [])[:5])
    if syntax:
        return Score(0.0, Outcome.FAILED, {"style": 0.0}, f"the code does not parse: {shown}", info)
    if count == 0:
        return Score(1.0, Outcome.PASSED, {"style": 1.0}, "no ruff diagnostics", info)
    value = max(0.0, 1.0 - penalty * count)
    return Score(value, Outcome.FAILED, {"style": value}, f"{count} ruff diagnostic(s): {shown}", info)
