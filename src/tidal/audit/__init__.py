"""audit layer: environment-quality inspection of tasks (docs/design/audit.md).

`audit_tasks(paths)` runs the checks of `checks.CHECKS` on every task and gives each a verdict
(`ok`, `warn`, `quarantine`) with findings; `write_quarantine`/`load_quarantine` keep the list
training honours; `TaskWatch` quarantines tasks during RL from the gate's signals.
"""

from tidal.audit.checks import CHECKS, Check, select_checks
from tidal.audit.context import AuditContext
from tidal.audit.continuous import TaskWatch
from tidal.audit.quarantine import load_quarantine, write_quarantine
from tidal.audit.records import Finding, TaskAudit
from tidal.audit.runner import AuditResult, audit_tasks

__all__ = [
    "CHECKS",
    "AuditContext",
    "AuditResult",
    "Check",
    "Finding",
    "TaskAudit",
    "TaskWatch",
    "audit_tasks",
    "load_quarantine",
    "select_checks",
    "write_quarantine",
]
