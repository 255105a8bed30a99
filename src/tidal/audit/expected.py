"""What a task's tests expect, as word tokens, and where those tokens can be read.

An expectation is one test assertion comparing with a literal (`assert f(3) == 17`, `assert
Path('out.txt').read_text() == 'ana,35'`, `self.assertEqual(x, [1, 2])`, either side), read with
`ast`: its literal flattened into atoms (strings, numbers, dict keys and values; booleans and
None carry no information and are dropped), tokenised into words and numbers. `reads` names the
starting files the assertion's test function mentions: an assertion that `words.txt` is left as it
was rightly has `words.txt`'s content as its expected value, so that file is no leak for it.

`contains(tokens, needle)` finds `needle` in order inside `tokens`, allowing up to `MAX_GAP` other
tokens between consecutive ones, which is how expected values sit in a JSON map (`{"1": 2, "5":
11}`), a CSV or a "f(3) = 17" listing, and not how they sit in unrelated data by chance.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from tidal import pyast
from tidal.audit.code import test_sources
from tidal.types import Task

WORD = re.compile(r"\d+(?:\.\d+)?|[^\W\d]\w*")
MAX_GAP = 3
MAX_TOKENS = 200_000  # of one visible text searched; longer texts are searched up to here


def tokens(text: str) -> list[str]:
    """Numbers and words (identifiers: `nth_prime` is one token) after NFKC normalisation;
    punctuation is dropped and case kept (an input in lower case is no answer key for a task that
    upper-cases it)."""
    return WORD.findall(unicodedata.normalize("NFKC", text))[:MAX_TOKENS]


@dataclass(frozen=True)
class Expectation:
    """One assertion's expected literal: where it is, its tokens, and the starting files it reads."""

    where: str  # test file:line
    tokens: tuple[str, ...]
    reads: frozenset[str]

    @property
    def chars(self) -> int:
        return sum(len(t) for t in self.tokens)


def _atoms(value: Any) -> list[str]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float, str, bytes)):
        return [value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)]
    if isinstance(value, dict):
        return [a for k, v in value.items() for a in (*_atoms(k), *_atoms(v))]
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [a for item in items for a in _atoms(item)]
    return []


def _literal(node: ast.expr) -> list[str] | None:
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return [t for atom in _atoms(value) for t in tokens(atom)]


def _compared(node: ast.AST) -> list[ast.expr]:
    """The literal sides of an equality (or membership) assertion."""
    if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1 \
            and isinstance(node.test.ops[0], (ast.Eq, ast.In)):
        return [node.test.left, node.test.comparators[0]]
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute) \
            and node.value.func.attr in ("assertEqual", "assertEquals", "assertIn") and len(node.value.args) >= 2:
        return list(node.value.args[:2])
    return []


def expectations(task: Task) -> list[Expectation]:
    """Every assertion of the task's Python tests that compares with a literal, in file order."""
    found: list[Expectation] = []
    starting = set(task.files)
    for name, source in test_sources(task).items():
        try:
            tree = pyast.parse(source)
        except SyntaxError:
            continue  # the schema check reports it
        scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] or [tree]
        for scope in scopes:
            mentioned = {c.value for c in ast.walk(scope) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            reads = frozenset(f for f in starting if f in mentioned or any(f.endswith("/" + m) for m in mentioned))
            for node in ast.walk(scope):
                for side in _compared(node):
                    value = _literal(side)
                    if value:
                        found.append(Expectation(f"{name}:{getattr(node, 'lineno', 0)}", tuple(value), reads))
    unique: dict[tuple[str, tuple[str, ...]], Expectation] = {}
    for e in found:  # a module-level scope and its functions both walk the same nodes
        unique.setdefault((e.where, e.tokens), e)
    return list(unique.values())


def contains(haystack: list[str], needle: tuple[str, ...] | list[str], max_gap: int = MAX_GAP) -> bool:
    """Whether `needle` occurs in order in `haystack`, at most `max_gap` tokens between two of its
    consecutive tokens."""
    if not needle or len(needle) > len(haystack):
        return False
    positions: dict[str, list[int]] = {}
    for i, token in enumerate(haystack):
        positions.setdefault(token, []).append(i)
    ends = positions.get(needle[0], [])
    for token in needle[1:]:
        places = positions.get(token)
        if not places or not ends:
            return False
        following = set()
        for end in ends:
            following.update(p for p in range(end + 1, end + 2 + max_gap) if p < len(haystack) and haystack[p] == token)
        ends = sorted(following)
    return bool(ends)
