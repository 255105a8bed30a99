"""Check 6, `test_strength`: mutants of the reference must fail the tests.

A mutant is the reference with one small change, made by an `ast.NodeTransformer` at one site:
an arithmetic operator swapped (+ -, * /, // %, ...), a comparison changed (< <=, == !=, ...),
`and`/`or` swapped, a `not` or unary minus dropped, an integer, float, string or boolean constant
changed, or a returned value replaced by None. Sites are numbered in `ast.walk` order; when there
are more than `max_mutants`, evenly spaced ones are taken, so the choice is deterministic and
covers the whole reference. A mutant that scores `passed` survived; one whose score the verifier
could not judge (`infra_error`) is left out. kill rate = killed / judged, `warn` below
`min_kill_rate`, with the surviving mutants as evidence.

Equivalent mutants (`x if x > k else k` with `>=` is the same function) survive any test, so a
kill rate of 1 is not always reachable; the threshold leaves room for them.
"""

from __future__ import annotations

import ast
import copy
from typing import Any

from tidal import pyast
from tidal.audit.code import fenced, reference_code
from tidal.audit.context import AuditContext
from tidal.audit.records import Finding
from tidal.types import Outcome, Task

CHECK = "test_strength"

BINARY: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
                            ast.FloorDiv: ast.Mod, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
                            ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.LShift: ast.RShift, ast.RShift: ast.LShift}
COMPARE: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                             ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
          ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
          ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is",
          ast.IsNot: "is not", ast.And: "and", ast.Or: "or"}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the constant nodes that are docstrings (not mutated: changing them changes nothing)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def _changed_constant(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.0
    if isinstance(value, str):
        return value + "x" if value == "" else ""
    return _NO_CHANGE


_NO_CHANGE = object()


def _sites(tree: ast.AST) -> list[tuple[int, int, str]]:
    """(node index in ast.walk order, option, description) of every mutation."""
    docstrings = _docstrings(tree)
    sites = []
    for index, node in enumerate(ast.walk(tree)):
        line = getattr(node, "lineno", "?")
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BINARY:
            sites.append((index, 0, f"line {line}: {SYMBOL[type(node.op)]} -> {SYMBOL[BINARY[type(node.op)]]}"))
        elif isinstance(node, ast.Compare):
            for position, op in enumerate(node.ops):
                if type(op) in COMPARE:
                    sites.append((index, position, f"line {line}: {SYMBOL[type(op)]} -> {SYMBOL[COMPARE[type(op)]]}"))
        elif isinstance(node, ast.BoolOp):
            other = "or" if isinstance(node.op, ast.And) else "and"
            sites.append((index, 0, f"line {line}: {SYMBOL[type(node.op)]} -> {other}"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            sites.append((index, 0, f"line {line}: drop {'not' if isinstance(node.op, ast.Not) else 'unary -'}"))
        elif isinstance(node, ast.Constant) and id(node) not in docstrings:
            changed = _changed_constant(node.value)
            if changed is not _NO_CHANGE:
                sites.append((index, 0, f"line {line}: {node.value!r} -> {changed!r}"))
        elif isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            sites.append((index, 0, f"line {line}: return None"))
    return sites


class _Mutate(ast.NodeTransformer):
    """Applies mutation (`index`, `option`) of `_sites` to a copy of the tree it was counted on."""

    def __init__(self, target: ast.AST, option: int) -> None:
        self.target, self.option = target, option

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        if node is not self.target:
            return node
        if isinstance(node, (ast.BinOp, ast.AugAssign)):
            node.op = BINARY[type(node.op)]()
        elif isinstance(node, ast.Compare):
            node.ops[self.option] = COMPARE[type(node.ops[self.option])]()
        elif isinstance(node, ast.BoolOp):
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif isinstance(node, ast.UnaryOp):
            return node.operand
        elif isinstance(node, ast.Constant):
            return ast.copy_location(ast.Constant(_changed_constant(node.value)), node)
        elif isinstance(node, ast.Return):
            node.value = ast.Constant(None)
        return node


def mutants(code: str, limit: int) -> list[tuple[str, str]]:
    """Up to `limit` (description, mutant source) pairs of `code`, deterministic, each different
    from the original and from each other."""
    tree = pyast.parse(code)
    original = ast.unparse(tree)
    sites = _sites(tree)
    if limit <= 0 or not sites:
        return []
    if len(sites) > limit:
        step = (len(sites) - 1) / max(limit - 1, 1)
        sites = [sites[round(i * step)] for i in range(limit)] if limit > 1 else sites[:1]
    out: dict[str, str] = {}  # source -> description
    for index, option, description in sites:
        copied = copy.deepcopy(tree)
        target = next(node for i, node in enumerate(ast.walk(copied)) if i == index)
        mutated = ast.fix_missing_locations(_Mutate(target, option).visit(copied))
        try:
            source = ast.unparse(mutated)
            compile(source, "<mutant>", "exec")
        except (SyntaxError, ValueError):
            continue
        if source != original and source not in out:
            out[source] = description
    return [(description, source) for source, description in out.items()]


def check_test_strength(task: Task, ctx: AuditContext, measurements: dict[str, Any]) -> list[Finding]:
    code = reference_code(task)
    if code is None:
        return []
    found = mutants(code, ctx.config.max_mutants)
    if not found:
        return []
    scores = ctx.score_many(task, [fenced(source) for _, source in found])
    judged = [(m, s) for m, s in zip(found, scores) if s.outcome is not Outcome.INFRA_ERROR]
    if not judged:
        return []
    survivors = [(description, source) for (description, source), score in judged if score.outcome is Outcome.PASSED]
    rate = 1 - len(survivors) / len(judged)
    measurements["kill_rate"] = round(rate, 4)
    measurements["mutants"] = len(judged)
    if rate >= ctx.config.min_kill_rate:
        return []
    return [Finding(CHECK, "warn",
                    f"weak tests: {len(survivors)} of {len(judged)} mutants of the reference pass them "
                    f"(kill rate {rate:.2f} < {ctx.config.min_kill_rate:g})",
                    {"kill_rate": rate, "survivors": [{"mutation": d, "code": s} for d, s in survivors]})]
