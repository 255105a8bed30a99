"""Check 4, `null_solution`: answers that solve nothing must score 0.

For code tasks the null answers are generated from the reference's function signatures (and the
names the tests import): stubs of every function returning None, 0, "" or their first argument
(the input), a module that defines nothing, and the empty answer. For I/O programs: a program
that does nothing, one that prints 0, one that echoes its input. For text tasks: "", "0", "none"
and, for `math`, each number in the prompt (copying an operand).

A null answer that is itself the right answer (a math task whose answer is 0, an operand that
happens to equal the result) shows nothing about the verifier and is reported as `info`.
Otherwise: full marks -> `quarantine` (the tests or the verifier check nothing); a value above
`null_warn_value` -> `warn`; any other value above 0 -> `info` (partial credit for a stub).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from tidal.audit.code import callable_names, fenced, is_python_program
from tidal.audit.context import AuditContext
from tidal.audit.records import Finding
from tidal.reward.verifiers.text import normalise
from tidal.types import Outcome, Score, Task

CHECK = "null_solution"
STUB_RETURNS = {"returns None": "None", "returns 0": "0", 'returns ""': '""', "returns the input": "args[0] if args else None"}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def null_answers(task: Task) -> dict[str, str]:
    """Name -> answer, for this task's verifier."""
    answers = {"empty answer": ""}
    if task.verifier.name == "python_tests":
        names = callable_names(task)
        answers["defines nothing"] = fenced("pass")
        for label, value in STUB_RETURNS.items():
            if names:
                answers[f"stub {label}"] = fenced("\n\n".join(
                    f"def {name}(*args, **kwargs):\n    return {value}\n" for name in names))
    elif is_python_program(task):
        answers.update({"does nothing": fenced("pass"), "prints 0": fenced("print(0)"),
                        "echoes the input": fenced("import sys\nsys.stdout.write(sys.stdin.read())")})
    elif task.verifier.name in ("program_io", "efficiency", "compile"):
        answers["does nothing"] = "```c\nint main(void) { return 0; }\n```"
    else:
        answers.update({"zero": "0", "none": "none"})
        if task.verifier.name == "math":
            text = " ".join(m["content"] for m in task.messages())
            for number in dict.fromkeys(NUMBER.findall(text)):
                answers[f"copies {number} from the prompt"] = number
    return answers


def same_answer(task: Task, answer: str) -> bool:
    """Is this null answer the task's own right answer (so its passing proves nothing)?"""
    expected = task.verifier.args.get("answer", task.reference)
    if expected is None:
        return False
    if normalise(str(expected)) == normalise(answer):
        return True
    try:
        return Fraction(str(expected).strip()) == Fraction(answer.strip())
    except (ValueError, ZeroDivisionError):
        return False


def check_null_solutions(task: Task, ctx: AuditContext, measurements: dict[str, Any]) -> list[Finding]:
    answers = null_answers(task)
    scores = ctx.score_many(task, list(answers.values()))
    findings: list[Finding] = []
    warn_above = ctx.config.null_warn_value
    worst = 0.0
    for (name, answer), score in zip(answers.items(), scores):
        if score.value <= 0:
            continue
        evidence = {"null": name, "answer": answer, "reward": score.value, "outcome": score.outcome.value,
                    "detail": score.detail[:500]}
        if task.verifier.name not in ("python_tests", "program_io", "efficiency") and same_answer(task, answer):
            findings.append(Finding(CHECK, "info", f"the right answer is a trivial one ({name})", evidence))
            continue
        worst = max(worst, score.value)
        if score.outcome is Outcome.PASSED or score.value >= 1:
            severity, text = "quarantine", f"a null answer ({name}) gets full marks: the {_what(task)} check nothing"
        elif score.value > warn_above:
            severity, text = "warn", f"a null answer ({name}) scores {score.value:.2f}"
        else:
            severity, text = "info", f"a null answer ({name}) gets partial credit {score.value:.2f}"
        findings.append(Finding(CHECK, severity, text, evidence))
    if task.tools:  # an agent task: its acceptance tests on the untouched starting workspace
        score = do_nothing_score(task, ctx)
        measurements["do_nothing_reward"] = score.value
        if score.value > 0 and score.outcome is not Outcome.INFRA_ERROR:
            worst = max(worst, score.value)
            evidence = {"null": "do-nothing agent", "reward": score.value, "outcome": score.outcome.value,
                        "detail": score.detail[:500]}
            severity = "quarantine" if score.value >= 1 else "warn" if score.value > warn_above else "info"
            findings.append(Finding(CHECK, severity,
                                    f"an agent that does nothing scores {score.value:.2f}: the tests accept the starting workspace",
                                    evidence))
    measurements["null_max_reward"] = worst
    return findings


def do_nothing_score(task: Task, ctx: AuditContext) -> Score:
    """The acceptance verdict of an episode with no actions: a session holding only the task's
    starting files, checked exactly as the agent harness checks a finished episode."""
    from tidal.agent.acceptance import run_acceptance
    from tidal.sandbox.session import SessionStore, open_session

    backend = ctx.sandbox(task.image)
    store = SessionStore()
    try:
        with open_session(backend, dict(task.files), task.limits, store) as session:
            return run_acceptance(task, session, backend, ctx.scoring(task))
    finally:
        store.close()


def _what(task: Task) -> str:
    return "tests" if task.verifier.name == "python_tests" else "cases" if "cases" in task.verifier.args else "verifier's arguments"
