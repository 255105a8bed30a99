"""`code`: one-line Python functions, scored by hidden pytest tests.

Levels: 1 `x op k`; 2 `(x op k) op m`; 3 a list reduced with a constant (sum, max, min, count,
length); 4 a conditional (larger/smaller of x and k, distance, parity); 5 combinations over
lists. Each kind is one fixed sentence with one fixed reference shape, so a small model can learn
the mapping; the content key is the kind and its constants, so eval asks for new constants.

Expected test values come from evaluating the reference expression itself, so a reference and its
tests cannot disagree (a unit test also runs every reference against its tests under pytest).
"""

from __future__ import annotations

import random
from collections import Counter
from functools import lru_cache
from types import CodeType
from typing import Any

from tidal.tasks.families.registry import Draft, family

FUNCTION_NAMES = ("f", "g", "calc", "solve", "step")
OPERATIONS = {"plus": "+", "minus": "-", "times": "*"}
VERIFIER = {"name": "python_tests", "entrypoint": "solution.py"}
LIMITS = {"timeout_s": 10, "memory_mb": 512}
TEST_NAMES = ("test_a", "test_b", "test_c", "test_d")
# The reference's expression runs with only these builtins when expected values are computed.
SAFE_BUILTINS = {"sum": sum, "len": len, "max": max, "min": min, "abs": abs}

# Per level: kind -> (sentence after "returns ", expression, argument). {k} and {m} are constants.
KINDS: dict[int, dict[str, tuple[str, str, str]]] = {
    3: {
        "sum_plus": ("the sum of xs plus {k}", "sum(xs) + {k}", "xs"),
        "max_plus": ("the largest number in xs plus {k}", "max(xs) + {k}", "xs"),
        "min_minus": ("the smallest number in xs minus {k}", "min(xs) - {k}", "xs"),
        "count_above": ("how many numbers in xs are above {k}", "len([x for x in xs if x > {k}])", "xs"),
        "length_times": ("the length of xs times {k}", "len(xs) * {k}", "xs"),
    },
    4: {
        # max/min rather than `x if x > k else k`: moving that comparison by one (> to >=, k to
        # k + 1) gives the same function, a mutant no test can kill (the auditor's test_strength).
        "larger": ("the larger of x and {k}", "max(x, {k})", "x"),
        "smaller": ("the smaller of x and {k}", "min(x, {k})", "x"),
        "distance": ("the distance between x and {k}", "abs(x - {k})", "x"),
        "parity": ("{k} if x is even, else {m}", "{k} if x % 2 == 0 else {m}", "x"),
    },
    5: {
        "sum_above": ("the sum of the numbers in xs above {k}", "sum(x for x in xs if x > {k})", "xs"),
        "add_each": ("xs with {k} added to each number", "[x + {k} for x in xs]", "xs"),
        "capped_sum": ("the sum of xs times {k}, but at most {m}", "min(sum(xs) * {k}, {m})", "xs"),
        "max_floor": ("the largest of {k} and the numbers in xs", "max(max(xs), {k})", "xs"),
    },
}


def _arithmetic(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    """Levels 1 and 2: (content key, sentence, expression) over x."""
    steps = []
    for _ in range(difficulty):
        word = rng.choice(tuple(OPERATIONS))
        # Level 1 has a single step, so it gets the wider range of constants.
        top = 12 if word == "times" else 50 if difficulty == 1 else 9
        steps.append((word, rng.randint(2 if word == "times" else 1, top)))
    if len(steps) == 2 and {steps[0][0], steps[1][0]} == {"plus", "minus"} and steps[0][1] == steps[1][1]:
        steps[1] = (steps[1][0], steps[1][1] % 9 + 1)  # (x plus 3) minus 3 would be just x
    (word, k), *rest = steps
    sentence, expression = f"x {word} {k}", f"x {OPERATIONS[word]} {k}"
    for word, m in rest:
        sentence, expression = f"({sentence}) {word} {m}", f"({expression}) {OPERATIONS[word]} {m}"
    return ":".join(f"{word}:{k}" for word, k in steps), sentence, expression


def _constants(rng: random.Random, kind: str) -> dict[str, int]:
    if kind == "parity":
        k, m = rng.sample(range(0, 10), 2)
        return {"k": k, "m": m}
    if kind == "capped_sum":
        return {"k": rng.randint(2, 5), "m": rng.randint(10, 40)}
    if kind in ("larger", "smaller", "distance"):
        return {"k": rng.randint(-5, 15)}
    return {"k": rng.randint(1, 20)}


def _inputs(rng: random.Random, argument: str, constants: dict[str, int], kind: str = "") -> list[Any]:
    """Four inputs; scalar ones straddle the constant so a comparison's both branches are tested.
    Both branches are also what the auditor's null answers and mutants probe: parity gets two even
    and two odd numbers (a stub returning one branch's value scores half, not three quarters), and
    max_floor gets a list wholly under its floor and one reaching over it (so a changed floor fails),
    and the comparisons with a constant get the values just past it on both sides."""
    if kind == "parity":
        values = [2 * v for v in rng.sample(range(-5, 6), 2)] + [2 * v + 1 for v in rng.sample(range(-5, 5), 2)]
        rng.shuffle(values)
        return values
    if kind == "max_floor":
        k = constants["k"]
        under = [rng.randint(k - 12, k - 1) for _ in range(rng.randint(1, 5))]
        over = [rng.randint(-3, k + 8) for _ in range(rng.randint(1, 5))] + [rng.randint(k + 1, k + 8)]
        rng.shuffle(over)
        lists = [under, over] + [[rng.randint(-3, k + 8) for _ in range(rng.randint(1, 6))] for _ in range(2)]
        rng.shuffle(lists)
        return lists
    if kind in ("larger", "smaller", "distance"):
        # Just past the constant on both sides, so a comparison moved by one (> to > k + 1, or
        # k to k - 1) fails a test: found by the auditor's mutants.
        k = constants["k"]
        values = [k - 1, k + 1, rng.randint(k - 9, k - 2), rng.randint(k + 2, k + 9)]
        rng.shuffle(values)
        return values
    if argument == "x":
        centre = constants.get("k", 0) if "m" not in constants else 0
        values = rng.sample(range(centre - 9, centre), 2) + rng.sample(range(centre, centre + 10), 2)
        rng.shuffle(values)
        return values
    # Values reach past the constant so that "above k" filters keep some numbers and drop others.
    top = max(15, constants.get("k", 0) + 8)
    if kind in ("sum_above", "count_above"):  # numbers on both sides of k, so counts vary
        k = constants["k"]
        lists = [[rng.randint(k - 8, k + 8) for _ in range(rng.randint(1, 6))] for _ in range(4)]
    elif kind == "capped_sum":  # two sums under the cap and two over it
        lists = [[rng.randint(-4, 2) for _ in range(rng.randint(1, 4))] for _ in range(2)]
        lists += [[rng.randint(5, 15) for _ in range(rng.randint(2, 5))] for _ in range(2)]
        rng.shuffle(lists)
    else:
        lists = [[rng.randint(-3, top) for _ in range(rng.randint(1, 6))] for _ in range(4)]
    if kind in ("sum_above", "count_above"):
        # k itself (dropped) and k + 1 (kept) in the lists: a filter moved by one fails a test.
        k = constants["k"]
        lists[0].insert(rng.randint(0, len(lists[0])), k)
        lists[1].insert(rng.randint(0, len(lists[1])), k + 1)
        rng.shuffle(lists)
    return lists


@lru_cache(maxsize=4096)
def _compiled(expression: str) -> CodeType:
    # Generation draws many candidates per kept task; compiling once per expression keeps it fast.
    return compile(expression, "<reference>", "eval")


def _tests(name: str, expression: str, argument: str, inputs: list[Any]) -> dict[str, str] | None:
    code = _compiled(expression)
    expected = [eval(code, {"__builtins__": SAFE_BUILTINS}, {argument: value}) for value in inputs]
    half = len(expected) // 2
    if max(Counter(repr(value) for value in expected).values()) > half or \
            sum(repr(e) == repr(i) for e, i in zip(expected, inputs)) > half:
        return None  # a constant or the identity function would pass most tests; draw again
    blocks = [f"from solution import {name}\n"]
    for test_name, value, result in zip(TEST_NAMES, inputs, expected):
        blocks.append(f"def {test_name}():\n    assert {name}({value!r}) == {result!r}\n")
    return {"test_solution.py": "\n\n".join(blocks)}


@family("code")
def make_code(rng: random.Random, difficulty: int) -> Draft:
    name = rng.choice(FUNCTION_NAMES)
    if difficulty <= 2:
        key, sentence, expression = _arithmetic(rng, difficulty)
        argument, constants, kind = "x", {}, "arithmetic"
    else:
        kind = rng.choice(tuple(KINDS[difficulty]))
        template, expression_template, argument = KINDS[difficulty][kind]
        constants = _constants(rng, kind)
        sentence = template.format(**constants)
        expression = expression_template.format(**constants)
        key = kind + "".join(f":{constants[c]}" for c in sorted(constants))
    for _ in range(100):
        tests = _tests(name, expression, argument, _inputs(rng, argument, constants, kind))
        if tests is not None:
            break
    else:
        raise RuntimeError(f"no inputs tell {expression!r} from a constant or from x; {kind!r} is broken")
    prompt = f"Write a Python function {name}({argument}) that returns {sentence}."
    reference = f"def {name}({argument}):\n    return {expression}\n"
    return Draft(key, prompt, reference, dict(VERIFIER), tests, dict(LIMITS), {"kind": kind})
