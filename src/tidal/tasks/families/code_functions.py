"""`code_fn`: whole Python functions from a signature and a docstring with examples.

The prompt is what a code benchmark gives (the layout `tidal tasks import --format code-tests`
makes): a stub with a signature, a one-sentence docstring and two worked examples, and the answer
is the whole function. Hidden tests call it on the kind's edge cases (empty inputs, ties,
negatives) and on random inputs, one assert per test, so the reward is the share passed. The
functions come from `code_catalog.KINDS` (strings, lists, dicts, numbers and parsing at levels
1-5); the content key is the kind and its constants, so an eval task asks for a function whose
kind-and-constants never appear in train, and the function's name and examples are phrasing.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from string import Template
from typing import Any

from tidal.tasks.families.code_catalog import KINDS, Args, Kind
from tidal.tasks.families.registry import Draft, family
from tidal.tasks.importers import CODE_INSTRUCTION

VERIFIER = {"name": "python_tests", "entrypoint": "solution.py"}
LIMITS = {"timeout_s": 10, "memory_mb": 512}
EXAMPLES = 2  # worked examples in the docstring
RANDOM_TESTS = 5  # random inputs among the hidden tests, beside the kind's edge cases
# A constant answer may pass at most this share of a task's tests (booleans: both values tested).
MAX_SAME_ANSWER = 0.7
BY_LEVEL: dict[int, tuple[Kind, ...]] = {level: tuple(k for k in KINDS if k.level == level) for level in range(1, 6)}


def _reference(kind: Kind, name: str, constants: dict[str, Any]) -> str:
    body = Template(kind.body).substitute(constants)
    return f"def {name}{kind.signature}:\n{body}\n"


def _call(function: Any, args: Args) -> tuple[Args, Any]:
    # The reference gets a copy: the test shows the arguments as drawn even if it mutates them.
    return args, function(*copy.deepcopy(args))


def _stub(kind: Kind, name: str, constants: dict[str, Any], examples: list[tuple[Args, Any]]) -> str:
    doc = Template(kind.doc).substitute(constants)
    lines = [f"def {name}{kind.signature}:", f'    """{doc}', ""]
    for args, result in examples:
        lines += [f"    >>> {name}({', '.join(map(repr, args))})", f"    {result!r}"]
    lines.append('    """')
    return "\n".join(lines) + "\n"


def _tests(name: str, cases: list[tuple[Args, Any]]) -> str:
    blocks = [f"from solution import {name}\n"]
    for index, (args, result) in enumerate(cases):
        blocks.append(f"def test_{index}():\n    assert {name}({', '.join(map(repr, args))}) == {result!r}\n")
    return "\n\n".join(blocks)


def _edges(kind: Kind, constants: dict[str, Any]) -> list[Args]:
    return list(kind.edges(constants) if callable(kind.edges) else kind.edges)


def _distinct(cases: list[tuple[Args, Any]]) -> list[tuple[Args, Any]]:
    seen: set[str] = set()
    kept = []
    for args, result in cases:
        if repr(args) not in seen:
            seen.add(repr(args))
            kept.append((args, result))
    return kept


def _cases(rng: random.Random, kind: Kind, function: Any, constants: dict[str, Any]) -> list[tuple[Args, Any]]:
    """Examples first, then the hidden cases; drawn again until no constant answer passes most."""
    for _ in range(100):
        drawn = [kind.inputs(rng, constants) for _ in range(EXAMPLES + RANDOM_TESTS)]
        cases = _distinct([_call(function, args) for args in drawn + _edges(kind, constants)])
        answers = Counter(repr(result) for _, result in cases[EXAMPLES:])
        if len(cases) >= EXAMPLES + 4 and max(answers.values()) <= MAX_SAME_ANSWER * (len(cases) - EXAMPLES):
            return cases
    raise RuntimeError(f"code_fn kind {kind.kind!r} draws inputs whose answers are nearly all the same; fix its inputs")


@family("code_fn", domain="code")
def make_code_function(rng: random.Random, difficulty: int) -> Draft:
    kind = rng.choice(BY_LEVEL[difficulty])
    constants = kind.constants(rng)
    name = rng.choice(kind.names)
    reference = _reference(kind, name, constants)
    namespace: dict[str, Any] = {}
    exec(compile(reference, f"<code_fn {kind.kind}>", "exec"), namespace)  # noqa: S102 (our own reference, for the expected values)
    cases = _cases(rng, kind, namespace[name], constants)
    prompt = f"{CODE_INSTRUCTION}\n\n```python\n{_stub(kind, name, constants, cases[:EXAMPLES])}```"
    key = kind.kind + "".join(f"|{c}={constants[c]}" for c in sorted(constants))
    # The examples are shown, so they are tested too: the hidden cases are all the cases.
    tests = {"test_solution.py": _tests(name, cases)}
    return Draft(key, prompt, reference, dict(VERIFIER), tests, dict(LIMITS),
                 {"kind": kind.kind, "entry_point": name})
