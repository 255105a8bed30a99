"""What every audit check may use: the thresholds, scoring through the task's own verifier (one
answer, or several in one sandbox), sandbox backends per hash seed, the reference's runs (shared
by the checks that need them), and the policy for the difficulty estimate.

Checks never build a verifier call themselves: going through `AuditContext.score` means an audit
scores answers exactly as training does (same verifier, same arguments, same sandbox), which is
what an audit of the reward signal must do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidal.audit.duplicates import DuplicateIndex
from tidal.config.schema import AuditConfig, GateConfig
from tidal.errors import SandboxUnavailableError
from tidal.gate.gate import gate_single
from tidal.reward.registry import ScoringContext, get_batch_verifier, get_verifier
from tidal.sandbox.base import SandboxBackend, SandboxResult, get_backend
from tidal.types import Completion, Episode, Score, Task

# Verifiers that run code in the sandbox; the others are pure functions of the text.
SANDBOX_VERIFIERS = frozenset({"python_tests", "program_io", "compile", "efficiency", "static"})


class RecordingBackend:
    """A backend that keeps the `SandboxResult` of every run it passes through, so a check can
    read the reference's wall time, CPU time and peak memory without a second run.

    It is deliberately not a `BatchBackend`: verifiers then run each answer alone, and each
    result belongs to exactly one answer."""

    def __init__(self, inner: SandboxBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.python = inner.python
        self.results: list[SandboxResult] = []

    def run(self, argv: list[str], files: dict[str, str | bytes], limits: Any, env: dict[str, str] | None = None,
            after: Any = None, **options: Any) -> SandboxResult:
        result = self.inner.run(argv, files, limits, env, after, **options)
        self.results.append(result)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class ReferenceRun:
    """One scoring run of the reference: its variant (hash seed, test order) and what it measured."""

    hash_seed: int
    order: str  # how the tests were reordered: original, reversed, shuffled-N
    score: Score
    wall_s: float | None = None
    cpu_s: float | None = None
    max_rss_mb: float | None = None


Policy = Callable[[Task, int], list[str]]  # (task, k) -> k sampled answers


@dataclass
class AuditContext:
    """Shared by the checks of one audit; safe to use from several threads."""

    config: AuditConfig = field(default_factory=AuditConfig)
    backend: str = "bwrap"
    policy: Policy | None = None
    gate: GateConfig = field(default_factory=GateConfig)
    duplicates: DuplicateIndex = field(default_factory=DuplicateIndex)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _backends: dict[tuple[int, str], SandboxBackend] = field(default_factory=dict, init=False, repr=False)
    _scoring: dict[int, ScoringContext] = field(default_factory=dict, init=False, repr=False)
    _references: dict[str, list[ReferenceRun]] = field(default_factory=dict, init=False, repr=False)
    _reference_locks: dict[str, threading.Lock] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.duplicates.threshold = self.config.near_duplicate
        self.duplicates.paraphrases.threshold = self.config.paraphrase_jaccard

    # ----------------------------------------------------------------------------------- sandbox

    def sandbox(self, image: str, hash_seed: int = 0) -> SandboxBackend:
        """A backend for `image` whose processes see PYTHONHASHSEED=`hash_seed` (bwrap; other
        backends ignore the seed). Raises `SandboxUnavailableError`."""
        key = (hash_seed if self.backend == "bwrap" else 0, image)
        with self._lock:
            if key not in self._backends:
                options: dict[str, Any] = {"image": image, "hash_seed": key[0]} if self.backend == "bwrap" else {}
                self._backends[key] = get_backend(self.backend, **options)
            return self._backends[key]

    def scoring(self, task: Task, hash_seed: int = 0) -> ScoringContext:
        """The scoring context for `task`'s image and `hash_seed`."""
        if task.verifier.name not in SANDBOX_VERIFIERS:
            return ScoringContext(self.backend)  # never touched by a text verifier
        return ScoringContext(self.sandbox(task.image, hash_seed))

    def check_sandbox(self) -> None:
        """Raise `SandboxUnavailableError` now, once, rather than as an infra error on every task."""
        from tidal.types import Limits

        self.sandbox("python3").run(["/bin/true"], {}, Limits(timeout_s=20))

    # ----------------------------------------------------------------------------------- scoring

    def score(self, task: Task, answer: str, hash_seed: int = 0) -> Score:
        """`answer`'s score by the task's verifier, exactly as training scores it."""
        return get_verifier(task.verifier.name)(task, answer, self.scoring(task, hash_seed))

    def score_many(self, task: Task, answers: list[str]) -> list[Score]:
        """Scores of several answers to one task: in one sandbox when the verifier has a batch
        form (each score equals the verifier's own, see `registry.BatchVerifier`)."""
        if not answers:
            return []
        batch = get_batch_verifier(task.verifier.name)
        if batch is not None and len(answers) > 1:
            return batch(task, answers, self.scoring(task))
        return [self.score(task, answer) for answer in answers]

    def measured(self, task: Task, answer: str, hash_seed: int = 0) -> tuple[Score, SandboxResult | None]:
        """`answer`'s score and the sandbox result of its (last) run, for time and memory."""
        ctx = self.scoring(task, hash_seed)
        if task.verifier.name not in SANDBOX_VERIFIERS:
            return get_verifier(task.verifier.name)(task, answer, ctx), None
        recorder = RecordingBackend(ctx.sandbox(task.image))
        score = get_verifier(task.verifier.name)(task, answer, ScoringContext(recorder))
        return score, (recorder.results[-1] if recorder.results else None)

    def kept_by_gate(self, score: Score, answer: str) -> tuple[bool, str]:
        """Would the quality gate let this scored answer train? (keep, drop reason)."""
        completion = Completion([], [0], [0.0], answer, "stop", 0)
        episode = Episode("audit", "audit", "audit", "audit", completion, score=score)
        return gate_single(episode, self.gate, max_new_tokens=1 << 30)

    # -------------------------------------------------------------------------------- reference

    def reference_runs(self, task: Task, compute: Callable[[Task, AuditContext], list[ReferenceRun]]) -> list[ReferenceRun]:
        """The reference's runs for `task`, computed once per task id by `compute` (the
        reference check) and shared with the limits check."""
        with self._lock:
            lock = self._reference_locks.setdefault(task.id, threading.Lock())
        with lock:
            if task.id not in self._references:
                self._references[task.id] = compute(task, self)
            return self._references[task.id]

    def forget(self, task_id: str) -> None:
        """Drop what was kept for a task once its audit is done (bounded memory on big audits)."""
        with self._lock:
            self._references.pop(task_id, None)
            self._reference_locks.pop(task_id, None)


__all__ = ["SANDBOX_VERIFIERS", "AuditContext", "Policy", "RecordingBackend", "ReferenceRun", "SandboxUnavailableError"]
