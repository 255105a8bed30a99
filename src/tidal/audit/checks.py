"""The audit's checks, in the order they run on a task. A check is a function
`(task, ctx, measurements) -> findings`; extend the audit by appending a `Check` to `CHECKS`.

`cost` says what a check needs: `cheap` checks read the task only; `scoring` checks score answers
through the task's verifier (a sandbox for code tasks); `policy` checks sample from a model and
run only with `--policy`. `ordered` checks keep state across tasks (duplicates) and run in input
order on the audit's main thread; the others run on the worker threads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from tidal.audit.context import AuditContext
from tidal.audit.difficulty import check_difficulty
from tidal.audit.exploits import check_exploits
from tidal.audit.impossible import check_impossible_variant
from tidal.audit.judge_hacking import check_judge_hacking
from tidal.audit.leakage import check_leakage
from tidal.audit.mutants import check_test_strength
from tidal.audit.nulls import check_null_solutions
from tidal.audit.records import Finding
from tidal.audit.reference import check_limits, check_no_reference, check_reference
from tidal.audit.schema_check import check_schema
from tidal.errors import UnknownNameError
from tidal.types import Task

CheckFunction = Callable[[Task, AuditContext, dict[str, Any]], list[Finding]]


def check_duplicates(task: Task, ctx: AuditContext, measurements: dict[str, Any]) -> list[Finding]:
    """Check 9 (duplicates.py): the task against every task audited before it. It is here, not in
    duplicates.py, because the context holds the index, so duplicates.py sits below the context."""
    return ctx.duplicates.check(task)


@dataclass(frozen=True)
class Check:
    name: str
    function: CheckFunction
    cost: Literal["cheap", "scoring", "policy"]
    ordered: bool = False


CHECKS: list[Check] = [
    Check("schema", check_schema, "cheap"),
    Check("no_reference", check_no_reference, "cheap"),
    Check("leakage", check_leakage, "cheap"),
    Check("duplicates", check_duplicates, "cheap", ordered=True),
    Check("reference", check_reference, "scoring"),
    Check("limits", check_limits, "scoring"),
    Check("null_solution", check_null_solutions, "scoring"),
    Check("exploit", check_exploits, "scoring"),
    Check("judge_hacking", check_judge_hacking, "scoring"),
    Check("test_strength", check_test_strength, "scoring"),
    Check("impossible_variant", check_impossible_variant, "scoring"),
    Check("difficulty", check_difficulty, "policy"),
]


def select_checks(names: list[str] | None = None, cheap_only: bool = False) -> list[Check]:
    """The checks named (all by default; `cheap_only`: those that score nothing), in run order."""
    known = {check.name: check for check in CHECKS}
    for name in names or []:
        if name not in known:
            raise UnknownNameError("audit check", name, list(known))
    chosen = [c for c in CHECKS if names is None or c.name in names]
    return [c for c in chosen if c.cost == "cheap"] if cheap_only else chosen
