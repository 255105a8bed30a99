"""Checks 2, 3 and 7: the reference passes, every time (`reference`); a task without one is
unverified (`no_reference`); the reference fits the task's limits with a margin (`limits`).

**Variation.** The reference is scored `reference_runs` (k) times at once from a thread pool (so
the runs load the machine together, as a busy scoring pool does), run i with PYTHONHASHSEED i and
a different test order: run 0 as written, run 1 reversed, run i >= 2 shuffled with seed i, both
the top-level tests of every module (pytest runs them in definition order) and the modules
(python_tests' `test_order`). Tests that pass only after another set module state, or depend on
set/dict iteration order, fail some runs. `program_io` reorders its cases; text verifiers are
pure and run once. An agent task's reference (a shell script) runs as an oracle episode
(episodes.py), with the same seeds and test orders.

**Verdicts.** Every run fails: `quarantine`, classified from the verifier's evidence (missing
module, network, timeout, memory, crash, task error, else a wrong expectation). Some runs fail:
`quarantine` (flaky), with each run's seed, order and outcome as evidence.
"""

from __future__ import annotations

import ast
import random
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tidal import pyast
from tidal.audit.code import test_sources
from tidal.audit.context import SANDBOX_VERIFIERS, AuditContext, ReferenceRun
from tidal.audit.episodes import is_multi_turn, oracle_episode_score
from tidal.audit.records import Finding
from tidal.reward.verifiers.python_tests import pytest_targets
from tidal.tasks.reference import reference_answer
from tidal.types import Outcome, Score, Task

MISSING_MODULE = re.compile(r"ModuleNotFoundError|No module named|ImportError|cannot import name")
NETWORK = re.compile(r"Network is unreachable|ENETUNREACH|Temporary failure in name resolution|gaierror|"
                     r"Name or service not known|Connection refused|socket\.|urlopen error|ConnectionError|"
                     r"Errno 101|Errno -[23]\b", re.IGNORECASE)


# --------------------------------------------------------------------------------- variants


def reorder_tests(source: str, order: str) -> str:
    """`source` with its top-level test functions and classes (decorators included) in another
    order: `original`, `reversed` or `shuffled-N`. Everything else stays where it was."""
    if order == "original":
        return source
    tree = pyast.parse(source)
    lines = source.splitlines(keepends=True)
    spans = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name.lower().startswith("test"):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            spans.append((start, node.end_lineno or node.lineno))
    if len(spans) < 2:
        return source
    blocks = ["".join(lines[start:end]).rstrip("\n") + "\n" for start, end in spans]
    if order == "reversed":
        moved = blocks[::-1]
    else:
        moved = blocks[:]
        random.Random(int(order.split("-")[1])).shuffle(moved)
    out, cursor = [], 0
    for (start, end), block in zip(spans, moved):
        out.append("".join(lines[cursor:start]))
        out.append(block)
        cursor = end
    out.append("".join(lines[cursor:]))
    return "".join(out)


def order_name(run: int) -> str:
    return "original" if run == 0 else "reversed" if run == 1 else f"shuffled-{run}"


def variant(task: Task, order: str) -> Task:
    """`task` with its tests (or I/O cases) in `order`."""
    if order == "original":
        return task
    if task.verifier.name == "python_tests":
        tests = dict(task.tests)
        for name, source in test_sources(task).items():
            try:
                tests[name] = reorder_tests(source, order)
            except SyntaxError:
                pass  # the schema check reports it
        modules = pytest_targets(task.tests)
        if len(modules) < 2:
            return task.model_copy(update={"tests": tests})
        # The test modules run in another order too (python_tests' `test_order`).
        files = modules[::-1] if order == "reversed" else random.Random(int(order.split("-")[1])).sample(modules, len(modules))
        spec = task.verifier.model_copy(update={"test_order": files})
        return task.model_copy(update={"tests": tests, "verifier": spec})
    cases = task.verifier.args.get("cases")
    if isinstance(cases, list) and len(cases) > 1:
        moved = cases[::-1] if order == "reversed" else random.Random(int(order.split("-")[1])).sample(cases, len(cases))
        spec = task.verifier.model_copy(update={"cases": moved})
        return task.model_copy(update={"verifier": spec})
    return task


# --------------------------------------------------------------------------------- runs


def run_reference(task: Task, ctx: AuditContext) -> list[ReferenceRun]:
    """The k runs of the reference (see the module docstring), concurrently."""
    agent = is_multi_turn(task)
    answer = "" if agent else reference_answer(task)
    runs = ctx.config.reference_runs if agent or task.verifier.name in SANDBOX_VERIFIERS else 1

    def one(index: int) -> ReferenceRun:
        order = order_name(index)
        if agent:  # a shell script run in an oracle episode, as `tidal eval --model oracle` does
            score, wall_s = oracle_episode_score(variant(task, order), ctx, hash_seed=index)
            return ReferenceRun(index, order, score, wall_s)
        score, result = ctx.measured(variant(task, order), answer, hash_seed=index)
        if result is None:
            return ReferenceRun(index, order, score)
        return ReferenceRun(index, order, score, result.wall_s, result.cpu_s, result.max_rss_mb)

    if runs == 1:
        return [one(0)]
    with ThreadPoolExecutor(max_workers=runs, thread_name_prefix="tidal-audit-ref") as pool:
        return list(pool.map(one, range(runs)))


def classify(score: Score) -> str:
    """Why a reference failed, from the verifier's evidence."""
    if score.outcome is Outcome.TIMEOUT or "wall-clock limit" in score.detail or "CPU time limit" in score.detail:
        return "timeout"
    if score.outcome is Outcome.MEMORY_LIMIT:
        return "memory limit"
    text = " ".join([score.detail, str(score.info.get("failure", "")), " ".join(map(str, score.info.get("failing", [])))])
    if MISSING_MODULE.search(text):
        return "missing module or package"
    if NETWORK.search(text):
        return "network access"
    if score.outcome is Outcome.INFRA_ERROR:
        return "task error"
    if score.outcome is Outcome.TAMPERED:
        return "tamper detection"
    if score.outcome is Outcome.CRASHED:
        return "crash"
    return "wrong expectation"


def _run_evidence(run: ReferenceRun) -> dict[str, object]:
    return {"hash_seed": run.hash_seed, "order": run.order, "outcome": run.score.outcome.value,
            "reward": run.score.value, "detail": run.score.detail[:500],
            "failure": str(run.score.info.get("failure", ""))[-1200:]}


# --------------------------------------------------------------------------------- checks


def check_no_reference(task: Task, ctx: AuditContext, measurements: dict[str, Any]) -> list[Finding]:
    """Check 3: without a reference nothing shows that the task can be solved at all."""
    if task.reference is not None and task.reference.strip():
        return []
    return [Finding("no_reference", "warn", "the task has no reference: its solvability is unverified")]


def check_reference(task: Task, ctx: AuditContext, measurements: dict[str, Any]) -> list[Finding]:
    """Check 2: the reference passes every run."""
    if task.reference is None or not task.reference.strip():
        return []
    runs = ctx.reference_runs(task, run_reference)
    failed = [run for run in runs if run.score.outcome is not Outcome.PASSED]
    measurements["reference_passed"] = f"{len(runs) - len(failed)}/{len(runs)}"
    if not failed:
        return []
    evidence = {"runs": [_run_evidence(run) for run in runs]}
    if len(failed) == len(runs):
        kinds = sorted({classify(run.score) for run in failed})
        return [Finding("reference", "quarantine",
                        f"broken: the reference fails every run ({', '.join(kinds)}): {failed[0].score.detail[:200]}",
                        {"kind": kinds[0], **evidence})]
    which = ", ".join(f"seed {run.hash_seed}/{run.order}" for run in failed)
    return [Finding("reference", "quarantine",
                    f"flaky: the reference fails {len(failed)} of {len(runs)} runs ({which})",
                    {"kind": "flaky", **evidence})]


def check_limits(task: Task, ctx: AuditContext, measurements: dict[str, Any]) -> list[Finding]:
    """Check 7: the reference's wall time, CPU time and peak memory, the least of its passing runs
    (the least disturbed by load), must stay within the task's limits divided by the margin. Peak
    memory is compared only where the sandbox measured it (a cgroup host)."""
    if task.reference is None or not task.reference.strip() or task.verifier.name not in SANDBOX_VERIFIERS:
        return []
    if is_multi_turn(task):
        return []  # an agent task's limits bind each command, not the episode an oracle run measures
    runs = [r for r in ctx.reference_runs(task, run_reference) if r.score.outcome is Outcome.PASSED]
    if not runs:
        return []  # the reference check says why
    margin, limits = ctx.config.limit_margin, task.limits
    measured = {key: min(values) for key in ("wall_s", "cpu_s", "max_rss_mb")
                if (values := [getattr(r, key) for r in runs if getattr(r, key) is not None])}
    # The sandbox reports peak memory from its cgroup, or None where it cannot tell the sandbox's
    # own figure from this process's (SandboxResult.max_rss_mb); a None is not compared.
    budget = {"wall_s": limits.timeout_s, "cpu_s": limits.timeout_s, "max_rss_mb": float(limits.memory_mb)}
    over = [f"{key} {value:.2f} > {budget[key]:g}/{margin:g}" for key, value in measured.items()
            if value > budget[key] / margin]
    evidence = {"measured": {k: round(v, 3) for k, v in measured.items()}, "limits": budget, "margin": margin}
    measurements["reference_usage"] = evidence["measured"]
    if not over:
        return []
    return [Finding("limits", "warn", f"the reference comes too close to the task's limits: {'; '.join(over)}",
                    evidence)]
