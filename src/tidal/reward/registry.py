"""The verifier registry: verifiers looked up by the name `@verifier("name")` recorded (in `base`);
the first lookup loads the built-in verifiers, which register themselves on import.

A verifier is `fn(task, answer, ctx) -> Score` (or a float or bool reward in [0, 1]; the registry
hands out the function wrapped in `base.checked_score`, so what else it returns is an
`infra_error` naming the function, never a crash further on). It reads its arguments from `task.verifier.args`
(the task file records them, so a log can rebuild the call), returns a typed `Outcome`, and never
turns a problem into a silent 0: a sandbox that cannot start, or a task whose verifier arguments
are wrong, is `Outcome.INFRA_ERROR`, which the gate drops instead of training on.
"""

from __future__ import annotations

import inspect

from tidal import plugins
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
        raise UnknownVerifierError(name, list(base._VERIFIERS))
    return entry.call


class UnknownVerifierError(UnknownNameError):
    """A verifier no registry knows; says how a plugin's verifier is made known."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__("verifier", name, known)
        self.args = (f"{self.args[0]} (a plugin's verifier? name its module or file in the config's `imports:` "
                     "or with `--import`, or install its package)",)


def get_batch_verifier(name: str) -> BatchVerifier | None:
    """The batch form of the verifier `name`, or None when it has none (or is unknown)."""
    _load_builtins()
    entry = base._VERIFIERS.get(name)
    return entry.call_batch if entry is not None and entry.batch is not None else None


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
    # The built-in verifiers register themselves on import; then the plugins (tidal.plugins):
    # those this process's parent imported, and the installed entry points of `tidal.verifiers`.
    import tidal.reward.verifiers  # noqa: F401

    for name, loaded in plugins.entry_point_objects("tidal.verifiers"):
        register_entry_point(name, loaded)


def register_entry_point(name: str, loaded: object) -> None:
    """Register the object an entry point of `tidal.verifiers` names: a module registers its own
    verifiers on import (nothing to do); a function of (task, answer, ctx) is a verifier, one of
    (task, answer) a reward function (run in the sandbox); either under the entry point's name."""
    if inspect.ismodule(loaded):
        return
    existing = base._VERIFIERS.get(name)
    if existing is not None and (existing.function is loaded or existing.function.__module__ == getattr(
            loaded, "__module__", None)):
        return  # its module registered it with a decorator
    if not callable(loaded):
        raise plugins.PluginError(f"entry point {name} (group tidal.verifiers) names a {type(loaded).__name__}, "
                                  "not a module or a function")
    from tidal.reward.function import register_reward_function

    try:
        arity = len(inspect.signature(loaded).parameters)
    except (TypeError, ValueError):
        arity = 3
    if arity == 2:
        register_reward_function(name, loaded)  # type: ignore[arg-type]
    else:
        verifier(name)(loaded)  # type: ignore[arg-type]
