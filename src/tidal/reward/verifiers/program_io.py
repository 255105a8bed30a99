"""The `program_io` verifier: the answer is a program that reads stdin and writes stdout; each of
the task's cases feeds it an input and compares what it prints with the expected output.

The program (Python, or C/C++ compiled by gcc/g++ inside the sandbox) runs once per case under the
in-sandbox harness (io_runner.py): per-case wall clock, output cap, every process the run started
killed and reaped before the next case. Expected outputs reach the harness over the report channel
and never touch the workspace; verdicts come back on it with the run's nonce, which the candidate
never holds. Outputs match after trailing whitespace is dropped; with `abs_tol` / `rel_tol`,
numbers may differ by that much. value = passed cases / cases. Outcomes (first that applies):
infra_error (sandbox or harness could not start, no compiler, a broken task), tampered (report
lines without the nonce), timeout (a case hit `case_timeout_s`, or `limits.timeout_s` ended the
run), memory_limit, crashed (a case killed by a signal, or the harness ended early), passed (every
case passed), failed (wrong answers, runtime errors, output over the cap, does not compile).
"""

from __future__ import annotations

from typing import Any

from tidal.errors import TaskFormatError
from tidal.reward.base import ScoringContext, verifier
from tidal.reward.verifiers.io_harness import (
    SOURCE_FILES,
    Case,
    HarnessRun,
    case_evidence,
    cases_arg,
    clip,
    extract_program,
    problem_score,
    program_args,
    program_spec,
    run_cases,
)
from tidal.sandbox.base import SandboxStatus
from tidal.types import Outcome, Score, Task

MAX_CASES_IN_INFO = 100
COMPILE_OUTCOMES = {"timeout": Outcome.TIMEOUT, "memory_limit": Outcome.MEMORY_LIMIT}


def compile_failure(run: HarnessRun, program: str, component: str) -> Score | None:
    """The score of a program that did not compile (or, in Python, did not parse), else None."""
    compiled = run.of("compile", program)
    if not compiled or compiled[-1].get("ok"):
        return None
    event = compiled[-1]
    outcome = COMPILE_OUTCOMES.get(str(event.get("verdict")), Outcome.FAILED)
    how = "" if event.get("verdict") == "runtime_error" else f" ({event.get('verdict')})"
    return Score(0.0, outcome, {component: 0.0},
                 f"the {program} does not compile{how}: {clip(str(event.get('diagnostics', '')))}",
                 {**run.info(), "diagnostics": clip(str(event.get("diagnostics", "")))})


def ended_early(run: HarnessRun) -> Outcome:
    """The outcome of a run whose harness did not report everything."""
    if run.result.status is SandboxStatus.TIMEOUT:
        return Outcome.TIMEOUT
    if run.result.status is SandboxStatus.MEMORY_LIMIT:
        return Outcome.MEMORY_LIMIT
    return Outcome.CRASHED


def judge(task: Task, run: HarnessRun, cases: list[Case], timeout_s: float) -> Score:
    """The score of one harness run, following the outcome order in the module docstring."""
    broken = run.broken(task)
    if broken is not None:
        return broken
    not_compiled = compile_failure(run, "candidate", "cases")
    if not_compiled is not None:
        return not_compiled
    info = run.info()
    events = {int(e.get("index", -1)): e for e in run.of("case", "candidate")}
    verdicts = [str(events.get(i, {}).get("verdict", "not_reported")) for i in range(len(cases))]
    passed = verdicts.count("passed")
    info.update(passed=passed, total=len(cases), verdicts=verdicts, cases=[
        {k: events[i].get(k) for k in ("verdict", "cpu_s", "max_rss_mb", "wall_s", "exit_code")}
        for i in range(min(len(cases), MAX_CASES_IN_INFO)) if i in events])
    failing = [i for i, v in enumerate(verdicts) if v != "passed"]
    summary = f"{passed}/{len(cases)} cases passed"
    if failing:
        first = failing[0]
        evidence = case_evidence(events.get(first, {"verdict": verdicts[first]}), cases[first], timeout_s)
        info["failure"] = {"case": first, "evidence": evidence}
        summary += f"; case {first}: {evidence}"

    kinds = set(verdicts)
    if not failing and run.finished:
        return Score(1.0, Outcome.PASSED, {"cases": 1.0}, summary, info)
    # Every case passed but the harness did not end cleanly: its end counts as one more check.
    value = passed / len(cases) if failing else passed / (len(cases) + 1)
    if run.result.status is SandboxStatus.TIMEOUT or kinds & {"timeout", "not_run"}:
        outcome = Outcome.TIMEOUT
    elif "memory_limit" in kinds or run.result.status is SandboxStatus.MEMORY_LIMIT:
        outcome = Outcome.MEMORY_LIMIT
    elif "crashed" in kinds:
        outcome = Outcome.CRASHED
    elif not run.finished:
        outcome = ended_early(run)
        summary += f"; the harness ended before reporting every case ({run.result.detail or run.result.status.value})"
    else:
        outcome = Outcome.FAILED
    return Score(value, outcome, {"cases": value}, summary, info)


@verifier("program_io", sandbox=True)
def program_io(task: Task, answer: str, ctx: ScoringContext) -> Score:
    """The answer's program (Python, C or C++) maps each case's stdin to its stdout (value = fraction of cases)."""
    try:
        args = program_args(task)
        cases = cases_arg(task, require_output=True)
    except TaskFormatError as error:
        return problem_score(task, error)
    program = extract_program(answer, args["language"], args["require_fence"])
    if isinstance(program, Score):
        program.components["cases"] = 0.0
        return program
    language, code = program
    compilers: dict[str, list[str]] = {}
    candidate = program_spec(task, language, code, SOURCE_FILES[language], args["flags"], compilers)
    if isinstance(candidate, Score):
        return candidate
    spec: dict[str, Any] = {
        "programs": {"candidate": candidate},
        "compilers": compilers,
        "cases": [{"input": c.input, "output": c.output} for c in cases],
        "compare": args["compare"],
        "case_timeout_s": args["case_timeout_s"],
        "compile_timeout_s": args["compile_timeout_s"],
        "max_output_bytes": args["max_output_bytes"],
        "repeats": 1,
        "stop_on_failure": False,
    }
    run = run_cases(task, ctx, {candidate["file"]: code}, spec)
    if isinstance(run, Score):
        return run
    return judge(task, run, cases, args["case_timeout_s"])
