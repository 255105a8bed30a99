"""Check 1, `schema`: the task is valid for its verifier.

The loader's problems (bad JSON/YAML, unknown fields, wrong types, duplicate ids) arrive with the
record (source.py) and make the task a `quarantine` finding here, by id and FILE:LINE. For a task
that loaded, the verifier's own arguments are checked statically, before anything is scored, so a
broken task is named as such rather than showing up as a failing reference.
"""

from __future__ import annotations

import re
from typing import Any

from tidal import pyast
from tidal.audit.context import AuditContext
from tidal.audit.records import Finding
from tidal.reward.registry import known_verifiers
from tidal.reward.verifiers.python_tests import pytest_targets
from tidal.types import Task

CHECK = "schema"


def record_findings(problems: list[str]) -> list[Finding]:
    """The loader's problems with one record (or file) as a finding."""
    return [Finding(CHECK, "quarantine", f"invalid task record ({len(problems)} problem(s)): {problems[0]}",
                    {"problems": problems})]


def verifier_problems(task: Task) -> list[str]:
    """`field: message` for each argument the task's verifier would refuse."""
    name, args = task.verifier.name, task.verifier.args
    if name not in known_verifiers():
        return [f"verifier.name: unknown verifier {name!r}; known: {', '.join(sorted(known_verifiers()))}"]
    problems: list[str] = []
    if name in ("exact_match", "math") and args.get("answer") in (None, ""):
        problems.append("verifier.answer: is required")
    if name == "exact_match" and not isinstance(args.get("aliases", []), list):
        problems.append("verifier.aliases: must be a list")
    if name in ("regex", "format"):
        pattern = args.get("pattern")
        if not isinstance(pattern, str):
            problems.append("verifier.pattern: is required (a string)")
        else:
            try:
                re.compile(pattern)
            except re.error as error:
                problems.append(f"verifier.pattern: does not compile: {error}")
    if name == "python_tests":
        entrypoint = str(args.get("entrypoint", "solution.py"))
        if not task.tests:
            problems.append("tests: python_tests needs at least one test file")
        if entrypoint in task.tests:
            problems.append(f"tests: a test file is named like the entrypoint {entrypoint}")
        for path in pytest_targets(task.tests):
            try:
                pyast.parse(task.tests[path])
            except SyntaxError as error:
                problems.append(f"tests.{path}: does not parse (line {error.lineno}): {error.msg}")
    if name in ("program_io", "efficiency"):
        cases = args.get("cases")
        if not isinstance(cases, list) or not cases:
            problems.append("verifier.cases: is required (a list of {input, output})")
        else:
            for index, case in enumerate(cases):
                if not isinstance(case, dict) or (name == "program_io" and "output" not in case):
                    problems.append(f"verifier.cases[{index}].output: is required")
    return problems


def check_schema(task: Task, ctx: AuditContext, measurements: dict[str, Any]) -> list[Finding]:
    problems = verifier_problems(task)
    if not problems:
        return []
    return [Finding(CHECK, "quarantine", f"the {task.verifier.name} verifier would refuse this task: {problems[0]}",
                    {"problems": problems})]
