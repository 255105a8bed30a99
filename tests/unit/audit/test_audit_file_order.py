"""Test-module order: python_tests' `test_order`, and the auditor varying it to find flaky tasks."""

from __future__ import annotations

from tidal.audit.context import AuditContext
from tidal.audit.reference import check_reference
from tidal.reward import ScoringContext, get_verifier
from tidal.types import Outcome, Task

# test_b passes only if test_a ran first in the same session (module state shared through solution).
TESTS = {
    "test_a.py": "import solution\n\ndef test_a():\n    solution.seen.append('a')\n    assert solution.f(1) == 2\n",
    "test_b.py": "import solution\n\ndef test_b():\n    assert solution.seen == ['a']\n",
}
REFERENCE = "seen = []\n\ndef f(x):\n    return x + 1\n"


def _task(**args: object) -> Task:
    return Task(id="order/shared-state", domain="code", prompt="Write f.", reference=REFERENCE, tests=TESTS,
                verifier={"name": "python_tests", "mode": "in_process", **args})


def test_test_order_runs_the_modules_in_the_given_order(bwrap: None) -> None:
    score = get_verifier("python_tests")
    answer = f"```python\n{REFERENCE}```"
    context = ScoringContext()
    assert score(_task(), answer, context).outcome is Outcome.PASSED  # sorted: a, then b
    assert score(_task(test_order=["test_a.py", "test_b.py"]), answer, context).outcome is Outcome.PASSED
    reordered = score(_task(test_order=["test_b.py", "test_a.py"]), answer, context)
    assert reordered.outcome is Outcome.FAILED and reordered.value == 0.5
    bad = score(_task(test_order=["test_b.py"]), answer, context)
    assert bad.outcome is Outcome.INFRA_ERROR and "test_order must list exactly" in bad.detail


def test_the_audit_finds_a_cross_module_order_dependence(bwrap: None) -> None:
    ctx = AuditContext()
    ctx.config.reference_runs = 3  # original, reversed, shuffled
    measurements: dict = {}
    [finding] = check_reference(_task(), ctx, measurements)
    assert finding.check == "reference" and finding.evidence["kind"] == "flaky"
    assert "reversed" in finding.message
    assert measurements["reference_passed"] in ("1/3", "2/3")
