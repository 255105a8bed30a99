"""The `efficiency` verifier: CPU time and peak memory of the answer's program against the task's
reference solution, on the same inputs, in the same sandbox.

The in-sandbox harness (io_runner.py) runs the reference once on every case before any candidate
code runs (a reference that fails is the task's fault: infra_error; its outputs are the expected
ones where a case gives none), then candidate and reference `repeats` times per case, interleaved,
each run measured by the rusage of every process it started. Per case the minimum CPU time and the
median peak RSS are kept (the least noisy statistics of a few runs). Correct output is a
precondition (else 0); then per measure ratio = candidate / reference (reference CPU floored at
`min_cpu_s`), score = 1 up to `tolerance`, else tolerance / ratio, and value = cpu_weight * cpu +
(1 - cpu_weight) * memory. Peak RSS has a floor, the harness's own high-water mark, which a forked
child inherits across exec (`rss_floor_mb`, measured on /bin/true each run). A reference that fails
after candidate code ran is `tampered`. Details and limits: docs/design/verifiers.md, "efficiency".
"""

from __future__ import annotations

import statistics
from typing import Any

from tidal.errors import TaskFormatError
from tidal.reward.base import ScoringContext, task_problem, verifier
from tidal.reward.verifiers.io_harness import (
    SOURCE_FILES,
    Case,
    HarnessRun,
    bad_arg,
    case_evidence,
    cases_arg,
    extract_program,
    int_arg,
    number_arg,
    problem_score,
    program_args,
    program_spec,
    reference_program,
    run_cases,
)
from tidal.reward.verifiers.program_io import compile_failure, ended_early
from tidal.types import Outcome, Score, Task

VERDICT_OUTCOMES = {"timeout": Outcome.TIMEOUT, "not_run": Outcome.TIMEOUT, "memory_limit": Outcome.MEMORY_LIMIT,
                    "crashed": Outcome.CRASHED}
MAX_RUNS = 2000  # cases x repeats, per program: bounds the run's time and its report


def bounded(ratio: float, tolerance: float) -> float:
    """1 up to `tolerance`, then tolerance / ratio: in (0, 1], halving when the ratio doubles."""
    return 1.0 if ratio <= tolerance else tolerance / ratio


def measurements(run: HarnessRun, program: str, count: int) -> tuple[list[float], list[float]]:
    """Per case: min CPU seconds and median peak RSS (MiB) of `program`'s measured runs."""
    cpu: list[list[float]] = [[] for _ in range(count)]
    rss: list[list[float]] = [[] for _ in range(count)]
    for event in run.of("case", program):
        index, repeat = int(event.get("index", -1)), int(event.get("repeat", -1))
        if repeat >= 0 and 0 <= index < count and event.get("verdict") == "passed":
            cpu[index].append(float(event.get("cpu_s", 0.0)))
            rss[index].append(float(event.get("max_rss_mb", 0.0)))
    return [min(c) if c else 0.0 for c in cpu], [statistics.median(r) if r else 0.0 for r in rss]


def judge(task: Task, run: HarnessRun, cases: list[Case], options: dict[str, Any]) -> Score:
    """The score of one harness run, following the module docstring."""
    broken = run.broken(task)
    if broken is not None:
        return broken
    info = run.info()
    reference_compiled = run.of("compile", "reference")
    if reference_compiled and not reference_compiled[-1].get("ok"):
        return task_problem(task, f"the reference does not compile: {reference_compiled[-1].get('diagnostics')}")
    warmup = [e for e in run.of("case", "reference") if int(e.get("repeat", 0)) < 0]
    bad_warmup = [e for e in warmup if e.get("verdict") not in ("passed", "ok")]
    if bad_warmup:
        index = int(bad_warmup[0].get("index", -1))
        return task_problem(task, f"the reference fails case {index}: "
                            f"{case_evidence(bad_warmup[0], cases[index] if 0 <= index < len(cases) else None, options['case_timeout_s'])}")
    if len(warmup) < len(cases):
        return Score(0.0, ended_early(run), {"correct": 0.0}, "the run ended while the reference ran", info)
    # Where a case gives no output, the reference's (its excerpt) is what the candidate must print.
    printed = {int(e.get("index", -1)): str(e.get("got", "")) for e in warmup}
    cases = [c if c.output is not None else Case(c.input, printed.get(i, "")) for i, c in enumerate(cases)]
    not_compiled = compile_failure(run, "candidate", "correct")
    if not_compiled is not None:
        return not_compiled

    candidate_runs = run.of("case", "candidate")
    wrong = [e for e in candidate_runs if e.get("verdict") != "passed"]
    if wrong:
        index = int(wrong[0].get("index", -1))
        evidence = case_evidence(wrong[0], cases[index] if 0 <= index < len(cases) else None, options["case_timeout_s"])
        outcome = VERDICT_OUTCOMES.get(str(wrong[0].get("verdict")), Outcome.FAILED)
        info["failure"] = {"case": index, "evidence": evidence}
        return Score(0.0, outcome, {"correct": 0.0}, f"case {index}: {evidence}; correct output is required", info)
    reference_failed = [e for e in run.of("case", "reference") if int(e.get("repeat", -1)) >= 0 and e.get("verdict") != "passed"]
    if reference_failed:
        event = reference_failed[0]
        return Score(0.0, Outcome.TAMPERED, {"correct": 0.0},
                     f"the reference failed case {event.get('index')} ({event.get('verdict')}) after candidate code ran, "
                     "having passed it before", info)
    expected_runs = options["repeats"] * len(cases)
    if len(candidate_runs) < expected_runs or not run.finished:
        outcome = ended_early(run)
        return Score(0.0, outcome, {"correct": 0.0},
                     f"the run ended after {len(candidate_runs)}/{expected_runs} candidate runs ({outcome.value})", info)

    candidate_cpu, candidate_rss = measurements(run, "candidate", len(cases))
    reference_cpu, reference_rss = measurements(run, "reference", len(cases))
    cpu_ratio = sum(candidate_cpu) / max(sum(reference_cpu), options["min_cpu_s"])
    memory_ratio = max(candidate_rss) / max(max(reference_rss), 1.0)
    cpu_score = bounded(cpu_ratio, options["cpu_tolerance"])
    memory_score = bounded(memory_ratio, options["memory_tolerance"])
    value = options["cpu_weight"] * cpu_score + (1 - options["cpu_weight"]) * memory_score
    floor = [float(e.get("rss_floor_mb", 0.0)) for e in run.report.of("start")]
    info.update(
        rss_floor_mb=round(floor[0], 3) if floor else None,
        candidate_cpu_s=round(sum(candidate_cpu), 6), reference_cpu_s=round(sum(reference_cpu), 6),
        cpu_ratio=round(cpu_ratio, 4), candidate_max_rss_mb=round(max(candidate_rss), 3),
        reference_max_rss_mb=round(max(reference_rss), 3), memory_ratio=round(memory_ratio, 4),
        repeats=options["repeats"],
        per_case=[{"candidate_cpu_s": round(c, 6), "reference_cpu_s": round(r, 6), "candidate_rss_mb": round(cm, 3),
                   "reference_rss_mb": round(rm, 3)}
                  for c, r, cm, rm in zip(candidate_cpu, reference_cpu, candidate_rss, reference_rss)][:100],
    )
    components = {"correct": 1.0, "cpu": cpu_score, "memory": memory_score}
    detail = (f"correct on {len(cases)} cases; CPU {sum(candidate_cpu):.4f}s vs reference {sum(reference_cpu):.4f}s "
              f"(x{cpu_ratio:.2f}), peak memory {max(candidate_rss):.1f} vs {max(reference_rss):.1f} MiB (x{memory_ratio:.2f})")
    return Score(value, Outcome.PASSED if value >= 1.0 else Outcome.FAILED, components, detail, info)


@verifier("efficiency", sandbox=True)
def efficiency(task: Task, answer: str, ctx: ScoringContext) -> Score:
    """The answer's program is correct and about as cheap in CPU and memory as the task's reference."""
    try:
        args = program_args(task)
        cases = cases_arg(task, require_output=False)
        options = {
            "case_timeout_s": args["case_timeout_s"],
            "repeats": int_arg(task, "repeats", 3, 1, 20),
            "cpu_tolerance": number_arg(task, "cpu_tolerance", 1.5, 0, 1000),
            "memory_tolerance": number_arg(task, "memory_tolerance", 1.5, 0, 1000),
            "cpu_weight": number_arg(task, "cpu_weight", 0.7, 0, 1, closed=True),
            "min_cpu_s": number_arg(task, "min_cpu_s", 0.01, 0, 60),
        }
        if len(cases) * options["repeats"] > MAX_RUNS:
            raise bad_arg(task, "repeats", f"{len(cases)} cases x {options['repeats']} repeats is over {MAX_RUNS} runs")
        reference_language, reference_code = reference_program(task, args["language"] or "python")
    except TaskFormatError as error:
        return problem_score(task, error)
    program = extract_program(answer, args["language"], args["require_fence"])
    if isinstance(program, Score):
        program.components["correct"] = 0.0
        return program
    language, code = program
    compilers: dict[str, list[str]] = {}
    reference = program_spec(task, reference_language, reference_code,
                             "reference" + SOURCE_FILES[reference_language][len("solution"):], args["flags"], compilers)
    candidate = program_spec(task, language, code, SOURCE_FILES[language], args["flags"], compilers)
    for spec in (reference, candidate):
        if isinstance(spec, Score):
            return spec
    assert isinstance(reference, dict) and isinstance(candidate, dict)
    spec: dict[str, Any] = {
        "programs": {"candidate": candidate, "reference": reference},
        "compilers": compilers,
        "cases": [{"input": c.input, "output": c.output} for c in cases],
        "compare": args["compare"],
        "case_timeout_s": args["case_timeout_s"],
        "compile_timeout_s": args["compile_timeout_s"],
        "max_output_bytes": args["max_output_bytes"],
        "repeats": options["repeats"],
        "stop_on_failure": True,
    }
    run = run_cases(task, ctx, {candidate["file"]: code}, spec)
    if isinstance(run, Score):
        return run
    return judge(task, run, cases, options)
