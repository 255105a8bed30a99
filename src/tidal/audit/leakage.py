"""Check 8, `leakage`: what the model must not see, present in what it sees.

Hidden: the reference, the test files, the expected answer (`answer` and `aliases`), the I/O
cases' expected outputs. Visible: the prompt (every message) and the starting workspace (`files`).
Text is compared after normalisation (NFKC, case folded, whitespace collapsed).

- the reference or a test assertion line (at least `leak_min_chars` long) verbatim: `quarantine`;
- at least `leak_token_overlap` of a code reference's tokens (with multiplicity): `warn`;
- a text answer stated as such ("the answer is X") or at least `leak_min_chars` long verbatim:
  `quarantine`; a shorter answer as a whole word is `info`, since for many tasks (the largest of
  a list, a letter of a word) the answer is rightly a part of the question;
- every I/O case's expected output in the prompt (a program could print them without solving
  anything; a few worked examples are fine): `warn`; in one starting file: `quarantine`.

Expected values (expected.py) are searched as tokens, so a JSON map, a CSV or a listing of them is
found whatever its punctuation. A starting file the solution can read that is an answer key
(`_answer_key`: the values, in order, make up at least `ANSWER_KEY_SHARE` of its tokens, or its
name says expected/answer/solution/grader/key/...) for one assertion's expected value (at least
two tokens and `leak_min_chars` characters, not already stated in the prompt) or for every
expected value of the tests, or a file that is exactly one expected value or the text answer:
`quarantine`. An input holding the value amid other data (a config file the task asks to read the
port from) is not an answer key. A file an assertion itself reads (an input the test checks is left
unchanged) is no leak for that assertion. Every expected value of at least three assertions in
the prompt: `warn` (a prompt may state the spec's examples; all of them is the test set).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from typing import Any

from tidal.audit.code import is_python_program, test_sources
from tidal.audit.context import AuditContext
from tidal.audit.expected import Expectation, contains, expectations, tokens
from tidal.audit.records import Finding
from tidal.reward.verifiers.python_tests import extract_code
from tidal.types import Task

CHECK = "leakage"
TOKEN = re.compile(r"\w+|[^\w\s]")
MIN_TOKENS = 8  # references shorter than this are not judged by token overlap
ANSWER_KEY_SHARE = 0.5  # of a file's tokens the expected values must make up (unless its name says "answer")


def norm(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def visible_text(task: Task) -> dict[str, str]:
    """Where the model can read -> normalised text."""
    shown = {"prompt": norm(" ".join(m["content"] for m in task.messages()))}
    shown.update({f"files/{name}": norm(content) for name, content in task.files.items()})
    return shown


def _found(needle: str, shown: dict[str, str]) -> str | None:
    return next((where for where, text in shown.items() if needle and needle in text), None)


def _token_overlap(hidden: str, shown: str) -> float:
    wanted = Counter(TOKEN.findall(hidden))
    have = Counter(TOKEN.findall(shown))
    total = sum(wanted.values())
    return sum(min(count, have[token]) for token, count in wanted.items()) / total if total else 0.0


def check_leakage(task: Task, ctx: AuditContext, measurements: dict[str, Any]) -> list[Finding]:
    shown = visible_text(task)
    minimum = ctx.config.leak_min_chars
    findings: list[Finding] = []
    program = is_python_program(task) or task.verifier.name in ("program_io", "efficiency", "compile")
    if task.reference and program:
        code = norm(extract_code(task.reference))
        where = _found(code, shown) if len(code) >= minimum else None
        if where:
            findings.append(Finding(CHECK, "quarantine", f"the reference is in the {where}",
                                    {"where": where, "leaked": code[:2000]}))
        else:
            overlap = max((_token_overlap(code, text) for text in shown.values()), default=0.0)
            measurements["reference_token_overlap"] = round(overlap, 3)
            if len(TOKEN.findall(code)) >= MIN_TOKENS and overlap >= ctx.config.leak_token_overlap:
                findings.append(Finding(CHECK, "warn", f"{overlap:.0%} of the reference's tokens are in what the model "
                                        "sees", {"overlap": overlap, "reference": code[:2000]}))
    for name, source in test_sources(task).items():
        for line in source.splitlines():
            stripped = norm(line)
            if stripped.startswith("assert") and len(stripped) >= minimum and (where := _found(stripped, shown)):
                findings.append(Finding(CHECK, "quarantine", f"a test assertion of {name} is in the {where}",
                                        {"where": where, "leaked": stripped}))
                break
    findings += _answer_leaks(task, shown, minimum)
    cases = task.verifier.args.get("cases")
    if isinstance(cases, list) and cases:
        outputs = [norm(str(c.get("output", ""))) for c in cases if isinstance(c, dict)]
        in_file = next((w for w in shown if w != "prompt" and all(o and o in shown[w] for o in outputs)), None)
        if outputs and in_file:
            findings.append(Finding(CHECK, "quarantine", f"all {len(outputs)} expected outputs are in the {in_file}",
                                    {"where": in_file, "outputs": outputs[:20]}))
        elif outputs and all(output and _found(output, shown) for output in outputs):
            findings.append(Finding(CHECK, "warn", f"all {len(outputs)} expected outputs are in what the model sees",
                                    {"outputs": outputs[:20]}))
    return findings + expected_value_leaks(task, minimum)


KEY_NAME = re.compile(r"expect|answer|solution|solve|grade|golden|oracle|key|check|result", re.IGNORECASE)


def _answer_key(name: str, text: list[str], needle: tuple[str, ...]) -> bool:
    """Whether a starting file reads as an answer key for `needle`: it holds the values in order
    and either they are at least half of its tokens or its name says so (expected.json,
    grader_notes.txt). An input the task asks to pick a value out of (a config file holding the
    port) has the value amid much else, and is not one."""
    if not contains(text, needle):
        return False
    return len(needle) >= ANSWER_KEY_SHARE * len(text) or bool(KEY_NAME.search(name))


def expected_value_leaks(task: Task, minimum: int) -> list[Finding]:
    """The tests' expected values (or the text answer) readable in a starting file or the prompt;
    rules in the module docstring. At most one finding per place."""
    prompt = tokens(" ".join(m["content"] for m in task.messages()))
    files = {name: tokens(content) for name, content in task.files.items()}
    expected = expectations(task)
    args = task.verifier.args
    if task.verifier.name in ("exact_match", "math") and args.get("answer") not in (None, ""):
        expected += [Expectation("verifier.answer", tuple(t), frozenset())
                     for a in [args["answer"], *(args.get("aliases") or [])] if (t := tokens(str(a)))]
    findings: list[Finding] = []
    free = [e for e in expected if not e.reads]
    every = tuple(t for e in free for t in e.tokens)
    for name, text in files.items():
        where = f"files/{name}"
        whole = next((e for e in expected if name not in e.reads and tuple(text) == e.tokens), None)
        single = next((e for e in expected if name not in e.reads and len(e.tokens) >= 2 and e.chars >= minimum
                       and not contains(prompt, e.tokens) and _answer_key(name, text, e.tokens)), None)
        if whole is not None or single is not None:
            hit = whole or single
            assert hit is not None
            what = "is exactly" if whole is not None else "holds"
            findings.append(Finding(CHECK, "quarantine", f"the {where} {what} the expected value of {hit.where}: the "
                                    "solution can read the answer", {"where": where, "expected": " ".join(hit.tokens)[:500],
                                                                     "assertion": hit.where}))
        elif len(free) >= 2 and len(every) >= 3 and _answer_key(name, text, every):
            findings.append(Finding(CHECK, "quarantine", f"the {where} holds every expected value of the tests "
                                    f"({len(free)} assertions), in order: the solution can read the answers",
                                    {"where": where, "expected": " ".join(every)[:500]}))
    if len(free) >= 3 and contains(prompt, every):
        findings.append(Finding(CHECK, "warn", f"the prompt holds every expected value of the tests ({len(free)} "
                                "assertions)", {"where": "prompt", "expected": " ".join(every)[:500]}))
    return findings


def _answer_leaks(task: Task, shown: dict[str, str], minimum: int) -> list[Finding]:
    args = task.verifier.args
    if task.verifier.name not in ("exact_match", "math") or args.get("answer") in (None, ""):
        return []
    answers = [norm(str(a)) for a in [args["answer"], *(args.get("aliases") or [])] if str(a).strip()]
    for answer in answers:
        stated = re.compile(r"\b(?:answer|solution|result)\s*(?:is|:|=)\s*:?\s*" + re.escape(answer) + r"(?!\w)")
        for where, text in shown.items():
            if stated.search(text):
                return [Finding(CHECK, "quarantine", f"the {where} states the answer",
                                {"where": where, "answer": answer})]
            if len(answer) >= minimum and answer in text:
                return [Finding(CHECK, "quarantine", f"the answer appears verbatim in the {where}",
                                {"where": where, "answer": answer})]
            if re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", text):
                return [Finding(CHECK, "info", f"the (short) answer appears in the {where}; fine when the task "
                                "asks to pick it out", {"where": where, "answer": answer})]
    return []
