"""Text verifiers: `exact_match` and `regex` (alias `format`).

Both judge the whole answer, or, when it has one, its final answer: the rest of the line after
its last "Answer:" marker (a chat model's "...so it is 7. Answer: 7"). Only the last marker
counts, so listing candidates ("Answer: 1 ... Answer: 2") earns nothing more than the last one.
The task argument `final_answer: false` turns the marker off (the whole answer must match).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from tidal.reward.base import ScoringContext, check_answer, failed, task_problem, verifier
from tidal.types import Outcome, Score, Task

# "Answer:" / "Final answer:" (any case, optional markdown bold) at a line start or after a sentence
ANSWER_MARKER = re.compile(r"(?:^|(?<=[\s.!?:]))\**(?:final\s+)?answer\**\s*:\**[ \t]*", re.IGNORECASE | re.MULTILINE)
QUOTES = "\"'`\u2018\u2019\u201c\u201d\u00ab\u00bb"


def normalise(text: str, case_sensitive: bool = False) -> str:
    """Whitespace collapsed, surrounding quotes and a final period removed, case folded."""
    text = unicodedata.normalize("NFKC", text)
    text = " ".join(text.split())
    previous = None
    while text != previous:  # '"Paris."' -> 'Paris'
        previous = text
        text = text.strip()
        if len(text) >= 2 and text[0] in QUOTES and text[-1] in QUOTES:
            text = text[1:-1]
        if text.endswith(".") and not text.endswith(".."):
            text = text[:-1]
    return text if case_sensitive else text.casefold()


def final_answer(text: str) -> str | None:
    """The rest of the line after the last "Answer:" marker of `text`, or None without one."""
    last = None
    for last in ANSWER_MARKER.finditer(text):
        pass
    if last is None:
        return None
    return text[last.end():].split("\n", 1)[0].strip()


def _candidates(task: Task, answer: str) -> list[str]:
    """What is compared: the whole answer, and its final answer unless `final_answer: false`."""
    final = final_answer(answer) if task.verifier.args.get("final_answer", True) else None
    return [answer] if final is None else [answer, final]


@verifier("exact_match")
def exact_match(task: Task, answer: str, ctx: ScoringContext) -> Score:
    """The whole answer, or its final answer, equals `answer` (or one of `aliases`) after
    normalisation."""
    problem = check_answer(answer)
    if problem is not None:
        return problem
    args = task.verifier.args
    if "answer" not in args or args["answer"] is None:
        return task_problem(task, "needs an `answer` argument")
    aliases = args.get("aliases") or []
    if not isinstance(aliases, list):
        return task_problem(task, "`aliases` must be a list")
    case_sensitive = bool(args.get("case_sensitive", False))
    expected = [normalise(str(a), case_sensitive) for a in [args["answer"], *aliases]]
    got = [normalise(text, case_sensitive) for text in _candidates(task, answer)]
    if any(text in expected for text in got):
        return Score(1.0, Outcome.PASSED, {"match": 1.0}, "matches the expected answer")
    return failed(f"{_clip(got[-1])!r} does not match the expected answer", match=0.0)


FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE, "a": re.ASCII}
FLAG_NAMES = {"IGNORECASE": "i", "MULTILINE": "m", "DOTALL": "s", "VERBOSE": "x", "ASCII": "a"}


def _flags(value: Any) -> int:
    """`flags` as letters ("im") or a list of names (["IGNORECASE", "DOTALL"] or ["i", "s"])."""
    if value is None:
        return 0
    letters = list(value) if isinstance(value, str) else [FLAG_NAMES.get(str(v).upper(), str(v).lower()) for v in value]
    result = 0
    for letter in letters:
        if letter not in FLAGS:
            raise ValueError(f"unknown regex flag {letter!r}; use {', '.join(FLAGS)} or {', '.join(FLAG_NAMES)}")
        result |= FLAGS[letter]
    return result


@verifier("regex", aliases=("format",))
def regex(task: Task, answer: str, ctx: ScoringContext) -> Score:
    """`pattern` must match the whole stripped answer or its final answer (optional `flags`: "ims"
    or a list of names)."""
    problem = check_answer(answer)
    if problem is not None:
        return problem
    pattern = task.verifier.args.get("pattern")
    if not isinstance(pattern, str):
        return task_problem(task, "needs a `pattern` argument (a string)")
    try:
        compiled = re.compile(pattern, _flags(task.verifier.args.get("flags")))
    except (re.error, ValueError, TypeError) as error:
        return task_problem(task, f"bad pattern or flags: {error}")
    if any(compiled.fullmatch(text.strip()) for text in _candidates(task, answer)):
        return Score(1.0, Outcome.PASSED, {"format": 1.0}, "matches the pattern")
    return failed("does not match the pattern", format=0.0)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
