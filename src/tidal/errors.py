"""Typed errors. Every message says what was wrong, where, and what to do.

All tidal errors derive from `TidalError`, so the CLI can print them as one clean report instead
of a traceback.
"""

from __future__ import annotations


class TidalError(Exception):
    """Base class of every error tidal raises on purpose."""


class ConfigError(TidalError):
    """An invalid config: `problems` holds one `path: message` line per error, all at once."""

    def __init__(self, problems: list[str], source: str = "config") -> None:
        self.problems = problems
        self.source = source
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s)\n{lines}")


class TaskFormatError(TidalError):
    """A malformed task file. `problems` holds one `file:line [task id] field: message` per error."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{len(problems)} invalid task(s)\n{lines}")


class UnknownNameError(TidalError):
    """A name (verifier, family, backend, algorithm) that no registry knows; lists the known ones."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind, self.name, self.known = kind, name, sorted(known)
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(self.known) or '(none)'}")


class ModelLoadError(TidalError):
    """A model folder that is missing, not a causal LM, or lacks a tokenizer."""


class SandboxUnavailableError(TidalError):
    """The sandbox backend cannot run on this host (e.g. bubblewrap missing); says how to fix it."""


class CheckpointError(TidalError):
    """A checkpoint or run folder that cannot be resumed."""
