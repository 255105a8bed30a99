"""The verifier registry: verifiers looked up by the name `@verifier("name")` recorded (in `base`);
the first lookup loads the built-in verifiers, which register themselves on import.

A verifier is `fn(task, answer, ctx) -> Score`. It reads its arguments from `task.verifier.args`
(the task file records them, so a log can rebuild the call), returns a typed `Outcome`, and never
turns a problem into a silent 0: a sandbox that cannot start, or a task whose verifier arguments
are wrong, is `Outcome.INFRA_ERROR`, which the gate drops instead of training on.
"""

from __future__ import annotations

from tidal.errors import UnknownNameError
from tidal.reward import base
from tidal.reward.base import (
    MAX_ANSWER_BYTES,
    BatchVerifier,
    SandboxSettings,
    ScoringContext,
    Verifier,
    VerifierEntry,
    check_answer,
    decode_answer,
    failed,
    task_problem,
    verifier,
)

# The decorator, the context and the answer checks live in `base` (the verifiers import them
# from there); they are named here too, where callers have always found them.
__all__ = [
    "MAX_ANSWER_BYTES",
    "BatchVerifier",
    "SandboxSettings",
    "ScoringContext",
    "Verifier",
    "VerifierEntry",
    "check_answer",
    "decode_answer",
    "failed",
    "get_batch_verifier",
    "get_verifier",
    "known_verifiers",
    "needs_sandbox",
    "task_problem",
    "verifier",
    "verifier_entries",
]


def get_verifier(name: str) -> Verifier:
    """The verifier registered as `name`; `UnknownNameError` lists the known ones."""
    _load_builtins()
    entry = base._VERIFIERS.get(name)
    if entry is None:
        raise UnknownNameError("verifier", name, list(base._VERIFIERS))
    return entry.function


def get_batch_verifier(name: str) -> BatchVerifier | None:
    """The batch form of the verifier `name`, or None when it has none (or is unknown)."""
    _load_builtins()
    entry = base._VERIFIERS.get(name)
    return entry.batch if entry is not None else None


def needs_sandbox(name: str) -> bool:
    """Whether verifier `name` runs in a sandbox of the task's image (registered with sandbox=True)."""
    _load_builtins()
    entry = base._VERIFIERS.get(name)
    return entry is not None and entry.sandbox


def known_verifiers() -> set[str]:
    """Every registered verifier name, aliases included."""
    _load_builtins()
    return set(base._VERIFIERS)


def verifier_entries() -> list[VerifierEntry]:
    """One entry per verifier (aliases folded in), for listings."""
    _load_builtins()
    return sorted({id(e): e for e in base._VERIFIERS.values()}.values(), key=lambda e: e.name)


def _load_builtins() -> None:
    # The built-in verifiers register themselves on import.
    import tidal.reward.verifiers  # noqa: F401
