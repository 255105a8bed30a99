"""Check 11, `impossible_variant`: make the task impossible and see whether the reference still
passes.

One expected value is flipped: in the first test assertion that compares with a literal
(`assert f(2) == 31`, either side), the literal is changed (31 -> 32, "a" -> "ax", True -> False,
a list gets one more element); for `program_io`, the first case's expected output; for
`exact_match`/`math`, the expected answer (and the aliases are dropped). The reference is then
scored against that variant (an agent task's as an oracle episode, episodes.py). If it still gets full marks, the verifier is not checking what the
task claims (an assert that never runs, a comparison that is always true, a verifier that ignores
its answer): `quarantine`. A task with nothing to flip gets an `info` finding.
"""

from __future__ import annotations

import ast
from typing import Any

from tidal import pyast
from tidal.audit.code import test_sources
from tidal.audit.context import AuditContext
from tidal.audit.episodes import is_multi_turn, oracle_episode_score
from tidal.audit.records import Finding
from tidal.tasks.reference import reference_answer
from tidal.types import Outcome, Task

CHECK = "impossible_variant"


def _flipped_literal(node: ast.expr) -> ast.expr | None:
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None
    if isinstance(value, bool):
        changed: Any = not value
    elif isinstance(value, (int, float)):
        changed = value + 1
    elif isinstance(value, str):
        changed = value + "x"
    elif isinstance(value, (list, tuple)):
        changed = type(value)([*value, 0])
    elif value is None:
        changed = 0
    else:
        return None
    return pyast.parse(repr(changed), mode="eval").body


def flip_tests(task: Task) -> tuple[dict[str, str], str] | None:
    """The task's tests with one expected value flipped, and which one; None when there is none."""
    for name, source in test_sources(task).items():
        try:
            tree = pyast.parse(source)
        except SyntaxError:
            return None
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
                    and len(node.test.ops) == 1 and isinstance(node.test.ops[0], ast.Eq)):
                continue
            compare = node.test
            before = ast.unparse(node)
            right = _flipped_literal(compare.comparators[0])
            if right is not None:
                compare.comparators[0] = right
            else:
                left = _flipped_literal(compare.left)
                if left is None:
                    continue
                compare.left = left
            tests = dict(task.tests)
            tests[name] = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
            return tests, f"{name} line {node.lineno}: {before}  ->  {ast.unparse(node)}"
    return None


def impossible_variant(task: Task) -> tuple[Task, str] | None:
    """(the impossible task, what was flipped), or None when there is nothing to flip."""
    name, args = task.verifier.name, task.verifier.args
    if name == "python_tests":
        flipped = flip_tests(task)
        if flipped is None:
            return None
        return task.model_copy(update={"tests": flipped[0]}), flipped[1]
    if name in ("exact_match", "math") and args.get("answer") not in (None, ""):
        answer = str(args["answer"])
        try:
            changed = str(int(answer.strip()) + 1)
        except ValueError:
            changed = answer + "x" if name == "exact_match" else f"({answer}) + 1"
        spec = task.verifier.model_copy(update={"answer": changed, "aliases": []})
        return task.model_copy(update={"verifier": spec}), f"answer {answer!r} -> {changed!r}"
    cases = args.get("cases")
    if name == "program_io" and isinstance(cases, list) and cases and isinstance(cases[0], dict) and "output" in cases[0]:
        first = dict(cases[0])
        first["output"] = str(first["output"]).rstrip("\n") + "x\n"
        spec = task.verifier.model_copy(update={"cases": [first, *cases[1:]]})
        return task.model_copy(update={"verifier": spec}), f"cases[0].output -> {first['output']!r}"
    return None


def check_impossible_variant(task: Task, ctx: AuditContext, measurements: dict[str, Any]) -> list[Finding]:
    if task.reference is None or not task.reference.strip():
        return []
    made = impossible_variant(task)
    if made is None:
        return [Finding(CHECK, "info", "nothing to flip: no assertion compares with a literal")] \
            if task.verifier.name == "python_tests" else []
    variant, what = made
    if is_multi_turn(task):
        score, _ = oracle_episode_score(variant, ctx)
    else:
        score = ctx.score(variant, reference_answer(task))
    if score.outcome is not Outcome.PASSED:
        return []
    return [Finding(CHECK, "quarantine",
                    "the reference still passes after an expected value was flipped: the verifier does not check "
                    "what the task claims", {"flipped": what, "reward": score.value, "detail": score.detail[:500]})]
