"""The stability guard: detectors over each RL step's metrics, the actions their findings ask for,
and fault injection to prove them (docs/design/guard.md). The pipeline wires it as a step hook."""

from tidal.guard.detectors import Finding, build_detectors, robust_baseline
from tidal.guard.guard import Guard, TaskStat, Verdict, Webhook
from tidal.guard.inject import InjectedScorer, Injector

__all__ = ["Finding", "Guard", "InjectedScorer", "Injector", "TaskStat", "Verdict", "Webhook", "build_detectors",
           "robust_baseline"]
