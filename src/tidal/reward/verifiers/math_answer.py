"""The `math` verifier: the final answer of a model's text, equivalent to the expected `answer`.

Extraction: the last `\\boxed{...}`, else the last "answer is X" / "Answer: X", else the whole text
when it is a short expression, else the last number. Equivalence: exact rationals first (ints,
decimals, fractions, thousands separators, `\\frac`), then sympy. Model text is hostile, so sympy
never sees it raw: it must pass a whitelist (digits, operators, single-letter variables, a few
named functions, no attribute access), it is length- and size-capped, exponents are bounded
before anything is evaluated, and comparison is numeric at sample points rather than `simplify`.
"""

from __future__ import annotations

import random
import re
import tokenize
from fractions import Fraction
from functools import lru_cache
from typing import Any

from tidal.reward.base import ScoringContext, check_answer, failed, format_failed, task_problem, verifier
from tidal.types import Outcome, Score, Task

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 1000
MAX_NODES = 300
MAX_BOXED_TRIED = 20
TOLERANCE = 1e-9  # relative, for symbolic/numeric comparison after exact comparison failed
# What sympy's parser raises on malformed input; such text is simply not an expression.
PARSE_ERRORS: tuple[type[BaseException], ...] = (
    SyntaxError, TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError,
    RecursionError, NameError, tokenize.TokenError,
)

# ----------------------------------------------------------------------------- extraction


def _braced(text: str, start: int, limit: int = 4 * MAX_EXPRESSION_CHARS) -> tuple[str, int] | None:
    """The content of the `{...}` group opening at `start` (balanced, at most `limit` characters),
    and the index after it."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, min(len(text), start + limit + 2)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def _last_boxed(text: str) -> str | None:
    # From the end, and only the last few: hostile text may hold thousands of unclosed \boxed{.
    for match in list(re.finditer(r"\\(?:boxed|fbox)\s*", text))[::-1][:MAX_BOXED_TRIED]:
        group = _braced(text, match.end())
        if group is not None:
            return group[0]
    return None


ANSWER_IS = re.compile(r"(?i)\banswer\b\s*(?:is|:|=)\s*:?\s*(.+)")
NUMBER = re.compile(
    r"-?\\[dt]?frac\{\d+\}\{\d+\}|-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|-?\.\d+"
)
EXPRESSION_CHARS = re.compile(r"^[\w\s+\-*/^().,{}\\=$%]+$")


def _looks_like_expression(text: str) -> bool:
    """A short text of math characters with no words in it (so not a sentence ending in a number)."""
    if len(text) > MAX_EXPRESSION_CHARS or not EXPRESSION_CHARS.match(text):
        return False
    without_commands = re.sub(r"\\[a-zA-Z]+", "", text)
    return not any(len(word) > 3 and word not in FUNCTIONS for word in re.findall(r"[a-zA-Z]+", without_commands))


def extract_answer(text: str) -> str | None:
    """The final answer in a model's text, or None when there is none."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    matches = list(ANSWER_IS.finditer(text))
    if matches:
        return matches[-1].group(1).strip().rstrip(".").strip()
    stripped = text.strip().rstrip(".")
    if _looks_like_expression(stripped):
        return stripped
    numbers = NUMBER.findall(text)
    return numbers[-1].strip() if numbers else None


# ----------------------------------------------------------------------------- exact numbers


def _clean(text: str) -> str:
    text = re.sub(r"\\(?:text|mathrm|mbox)\s*\{[^{}]*\}", "", text)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "$", "\\%", "%", "^\\circ", "^{\\circ}", "°"):
        text = text.replace(token, "")
    text = text.strip().rstrip(".").strip()
    if "=" in text:
        text = text.rsplit("=", 1)[1].strip()
    return text


def parse_number(text: str) -> Fraction | None:
    """An exact rational from '12', '-3.5', '1/2', '1,000', '\\frac{1}{2}', '1e3'; else None."""
    text = _clean(text).replace(" ", "")
    match = re.fullmatch(r"(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}", text)
    if match:
        sign, numerator, denominator = match.groups()
        if int(denominator) == 0:
            return None
        value = Fraction(int(numerator), int(denominator))
        return -value if sign else value
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    match = re.fullmatch(r"(-?\d+(?:\.\d+)?)/(-?\d+(?:\.\d+)?)", text)
    if match:
        denominator = Fraction(match.group(2))
        return Fraction(match.group(1)) / denominator if denominator else None
    if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d{1,3})?", text):
        return Fraction(text)
    return None


# ----------------------------------------------------------------------------- symbolic

FUNCTIONS = ("sqrt", "sin", "cos", "tan", "log", "ln", "exp", "abs", "asin", "acos", "atan")
CONSTANTS = ("pi", "e", "i", "oo")


def _latex_to_plain(text: str) -> str:
    text = _clean(text)
    for latex, plain in (("\\cdot", "*"), ("\\times", "*"), ("\\div", "/"), ("\\infty", "oo"),
                         ("\\pi", " pi "), ("\\ln", " log"), ("\\log", " log"), ("\\exp", " exp")):
        text = text.replace(latex, plain)
    for name in ("sin", "cos", "tan", "arcsin", "arccos", "arctan"):
        text = text.replace("\\" + name, " " + name.replace("arc", "a"))
    # \frac{a}{b}, \sqrt{a}, \sqrt[n]{a}, ^{...}: innermost first, until nothing changes.
    for _ in range(20):
        before = text
        match = re.search(r"\\[dt]?frac\s*(?=\{)", text)
        if match:
            first = _braced(text, match.end())
            second = _braced(text, first[1]) if first else None
            if first and second:
                text = text[: match.start()] + f"(({first[0]})/({second[0]}))" + text[second[1]:]
                continue
        match = re.search(r"\\sqrt\s*(?:\[([^\[\]]*)\])?\s*(?=\{)", text)
        if match:
            body = _braced(text, match.end())
            if body:
                root = match.group(1)
                inner = f"(({body[0]})**(1/({root})))" if root else f"sqrt({body[0]})"
                text = text[: match.start()] + inner + text[body[1]:]
                continue
        if text == before:
            break
    text = text.replace("{", "(").replace("}", ")").replace("^", "**")
    return text.strip()


def _safe_plain(text: str) -> bool:
    """Only numbers, operators, parentheses, commas, single-letter names and whitelisted names."""
    if len(text) > MAX_EXPRESSION_CHARS or not re.fullmatch(r"[0-9A-Za-z+\-*/().,\s]*", text):
        return False
    if re.search(r"\.(?!\d)", text):  # a dot is only a decimal point: no attribute access
        return False
    for name in re.findall(r"[A-Za-z]+", text):
        if len(name) > 1 and name not in FUNCTIONS + CONSTANTS:
            return False
    return bool(text.strip())


@lru_cache(maxsize=1)
def _sympy() -> dict[str, Any]:
    import sympy
    from sympy.parsing.sympy_parser import auto_number, auto_symbol, implicit_multiplication, parse_expr

    names: dict[str, Any] = {
        "sqrt": sympy.sqrt, "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "log": sympy.log,
        "ln": sympy.log, "exp": sympy.exp, "abs": sympy.Abs, "asin": sympy.asin, "acos": sympy.acos,
        "atan": sympy.atan, "pi": sympy.pi, "e": sympy.E, "i": sympy.I, "oo": sympy.oo,
    }
    # The generated code only calls these; no builtins are reachable from it.
    global_dict = {"__builtins__": {}, "Symbol": sympy.Symbol, "Integer": sympy.Integer,
                   "Float": sympy.Float, "Rational": sympy.Rational, "Add": sympy.Add, "Mul": sympy.Mul,
                   "Pow": sympy.Pow}
    return {
        "sympy": sympy,
        "parse": parse_expr,
        "names": names,
        "globals": global_dict,
        "transformations": (auto_symbol, auto_number, implicit_multiplication),
    }


def _bounded(expr: Any, sympy: Any) -> bool:
    """No huge or nested powers and a bounded tree, checked before anything is evaluated."""
    nodes = 0
    for node in sympy.preorder_traversal(expr):
        nodes += 1
        if nodes > MAX_NODES:
            return False
        if isinstance(node, sympy.Pow):
            exponent = node.exp
            if any(isinstance(sub, sympy.Pow) for sub in sympy.preorder_traversal(exponent)):
                return False
            if exponent.is_number and abs(float(exponent)) > MAX_EXPONENT:
                return False
    return True


def parse_symbolic(text: str) -> Any | None:
    """A sympy expression from answer text, or None when it is not a safe, bounded expression."""
    plain = _latex_to_plain(text)
    if not _safe_plain(plain):
        return None
    s = _sympy()
    sympy = s["sympy"]
    try:
        unevaluated = s["parse"](plain, local_dict=dict(s["names"]), global_dict=dict(s["globals"]),
                                 transformations=s["transformations"], evaluate=False)
        if not _bounded(unevaluated, sympy):
            return None
        return s["parse"](plain, local_dict=dict(s["names"]), global_dict=dict(s["globals"]),
                          transformations=s["transformations"], evaluate=True)
    except PARSE_ERRORS + (sympy.SympifyError,):
        return None


def _close(a: complex, b: complex) -> bool:
    return abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b))


def symbolic_equal(a: Any, b: Any) -> bool:
    """Equal as expressions: structurally, or numerically at several sample points."""
    sympy = _sympy()["sympy"]
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(
            symbolic_equal(x, y) for x, y in zip(a, b))
    try:
        if a == b:
            return True
        symbols = sorted(a.free_symbols | b.free_symbols, key=str)
        rng = random.Random(0)
        points = [{s: sympy.Rational(rng.randint(-40, 40), rng.randint(1, 9)) + sympy.Rational(1, 7) for s in symbols}
                  for _ in range(5 if symbols else 1)]
        agreed = 0
        for point in points:
            x, y = complex(a.subs(point).evalf(30)), complex(b.subs(point).evalf(30))
            if x != x or y != y:  # nan: outside the domain at this point
                continue
            if not _close(x, y):
                return False
            agreed += 1
        return agreed >= min(len(points), 3)
    except (TypeError, ValueError, ZeroDivisionError, OverflowError, AttributeError, RecursionError):
        return False


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _parse(text: str) -> tuple[Fraction | None, Any]:
    number = parse_number(text)
    if number is not None:
        return number, None
    cleaned = _clean(text)
    if "," in cleaned:  # a tuple or list of values ("1,000" was a number above)
        inner = cleaned.strip()
        if inner[:1] in "([" and inner[-1:] in ")]":
            inner = inner[1:-1]
        items = [parse_symbolic(part) for part in _split_top_level(inner)]
        return None, tuple(items) if all(item is not None for item in items) else None
    return None, parse_symbolic(text)


def equivalent(expected: str, got: str) -> bool:
    """Whether the answer `got` means the same value as `expected`."""
    exact_expected, symbolic_expected = _parse(expected)
    exact_got, symbolic_got = _parse(got)
    if exact_expected is not None and exact_got is not None:
        return exact_expected == exact_got
    sympy = _sympy()["sympy"]
    left = symbolic_expected if symbolic_expected is not None else (
        sympy.Rational(exact_expected.numerator, exact_expected.denominator) if exact_expected is not None else None)
    right = symbolic_got if symbolic_got is not None else (
        sympy.Rational(exact_got.numerator, exact_got.denominator) if exact_got is not None else None)
    if left is not None and right is not None:
        return symbolic_equal(left, right)
    return " ".join(_clean(expected).split()).casefold() == " ".join(_clean(got).split()).casefold()


@verifier("math")
def math_answer(task: Task, answer: str, ctx: ScoringContext) -> Score:
    """The final answer (boxed, "answer is", or last number) equals `answer` numerically or symbolically."""
    problem = check_answer(answer)
    if problem is not None:
        return problem
    expected = task.verifier.args.get("answer")
    if expected is None or isinstance(expected, (dict, list)) or not str(expected).strip():
        return task_problem(task, "needs an `answer` argument (a number or an expression)")
    final = extract_answer(answer)
    if final is None:
        return format_failed("no final answer found (no \\boxed{}, 'answer is', or number)", correct=0.0)
    if len(final) > MAX_EXPRESSION_CHARS * 4:
        return failed(f"final answer is {len(final)} characters long", correct=0.0)
    if equivalent(str(expected), final):
        return Score(1.0, Outcome.PASSED, {"correct": 1.0}, f"final answer {final[:80]!r} is correct",
                     {"extracted": final[:200]})
    return Score(0.0, Outcome.FAILED, {"correct": 0.0}, f"final answer {final[:80]!r} is not {str(expected)[:80]!r}",
                 {"extracted": final[:200]})
