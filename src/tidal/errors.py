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


class StoreError(TidalError):
    """The trajectory store at `url` cannot be opened, written or read as asked."""

    def __init__(self, message: str, url: str = "") -> None:
        self.url = url
        super().__init__(message)


class StoreUnavailableError(StoreError):
    """A store URL that cannot be used at all (unknown protocol, read-only, missing driver); raised
    when the store is opened, before any trajectory is generated."""


class StoreWriteError(StoreError):
    """A segment could not be written (e.g. the disk is full); nothing of it is visible."""


class CorruptSegmentError(StoreError):
    """A segment that is torn, damaged or not a tidal segment; `segment` is its full URL."""

    def __init__(self, message: str, url: str = "", segment: str = "") -> None:
        self.segment = segment
        super().__init__(message, url)


class ExactlyOnceError(StoreError):
    """Training would break exactly-once: an id trained twice, or one the store never received."""


class EndpointError(TidalError):
    """An OpenAI-compatible endpoint that did not answer usefully; says which URL and why."""

    def __init__(self, message: str, url: str = "", status: int | None = None) -> None:
        self.url, self.status = url, status
        super().__init__(message)


class EndpointAuthError(EndpointError):
    """401/403 from an endpoint: the API key is missing or wrong. Not retried: no later call would work."""


class EndpointConfigError(EndpointError):
    """404 from an endpoint, or an unusable spec: the model name or base URL is wrong. Not retried."""


class EndpointUnavailableError(EndpointError):
    """The endpoint could not be reached, timed out, was overloaded (429) or failed (5xx). Retried."""


class EndpointRequestError(EndpointError):
    """The endpoint refused a request (400/413/422), e.g. a conversation over its context window."""


class TaskFolderError(TaskFormatError):
    """A terminal-task folder with missing or malformed files; one `FOLDER/FILE: message` per problem."""


class AuditInputError(TidalError):
    """`tidal audit` input with nothing to audit: a path that does not exist or cannot be read, a
    folder holding no task file or task folder, files holding no record. One line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"nothing to audit: {len(problems)} problem(s) with the input\n{lines}")


class QuarantineError(TidalError):
    """A quarantine list (audit/quarantine.py) that cannot be read or does not have its format."""


class EvalError(TidalError):
    """An evaluation that cannot go on (bad arguments, an out folder of another eval)."""


class WeightVerificationError(TidalError):
    """Weights a rollout worker loaded do not match what the trainer published (checksum or
    canary logprobs); the worker refuses to generate with them."""


class EngineServerError(TidalError):
    """The HTTP rollout engine's server failed a request (rollout/http_engine.py); `url` and the
    HTTP `status` (None: no answer) say where."""

    def __init__(self, message: str, url: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.url, self.status = url, status


class EngineUnavailableError(EngineServerError):
    """The server could not be reached, timed out, or answered 429/5xx after every retry."""


class EngineRequestError(EngineServerError):
    """The server refused the request (4xx: a wrong key, model id or parameter); not retried."""


class EngineResponseError(EngineServerError):
    """The server answered 200 with a body that is not what was asked for (malformed JSON, token
    ids outside the vocabulary, logprobs that do not match the tokens, missing choices)."""


class WeightTimeoutError(TidalError):
    """The weights a rollout worker needs were not published (or could not be fetched) within
    `pipeline.weight_timeout_s`."""


class BackendUnavailableError(TidalError):
    """A backend that cannot run here (e.g. Ray not installed, or its cluster unreachable)."""


class WorkerLostError(TidalError):
    """A worker died more often than `pipeline.worker_restarts` allows, or a call to it timed out."""


class PreemptedError(TidalError):
    """Work stopped partway because higher-priority work needed its worker (the scheduler's
    preemption). It runs again, which for generation gives the same result (same seed, weights
    and ids); the embedded engine's carries `handles`, what it did, for the next try to resume
    (`EmbeddedEngine.generate`'s `resume`)."""


class PlanError(TidalError):
    """A run whose predicted peak memory does not fit (`tidal plan`): raised before anything is
    launched, with the plan's numbers; `record` is the whole plan (`RunPlan.record`)."""

    def __init__(self, message: str, record: dict | None = None) -> None:
        self.record = record or {}
        super().__init__(message)


class RunPaused(TidalError):
    """A step hook (the stability guard) paused the run: it stopped cleanly at its latest
    checkpoint; `tidal train RUN_FOLDER` resumes it."""

    def __init__(self, step: int, reason: str) -> None:
        self.step, self.reason = step, reason
        super().__init__(f"run paused after step {step}: {reason}; resume it with `tidal train RUN_FOLDER`")
