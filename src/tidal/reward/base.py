"""What every verifier is built on: `ScoringContext`, the `@verifier` decorator and its table, and
the checks for hostile answers.

This module imports no verifier, so the verifier modules can import it; `registry`, which sits
above them, loads the built-in ones on the first lookup.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tidal.errors import TidalError
from tidal.plugins import defined_at, where
from tidal.types import Limits, Outcome, Score, Task

if TYPE_CHECKING:
    from tidal.sandbox.base import SandboxBackend

MAX_ANSWER_BYTES = 64 * 1024  # longer answers fail without being looked at


class SandboxSettings(Protocol):
    """The fields of `SandboxConfig` a context is made from; named by shape, because the config
    tree validates verifier names through the registry and so sits above this module."""

    backend: str
    timeout_s: float | None
    memory_mb: int | None


@dataclass
class ScoringContext:
    """What a verifier may use besides the task and the answer.

    `backend` is a sandbox backend or its registered name; a name is turned into a backend on
    first use, so verifiers that need no sandbox work on hosts without one. `timeout_s` and
    `memory_mb` override every task's own limits when set (from `SandboxConfig`).
    """

    backend: str | SandboxBackend = "bwrap"
    timeout_s: float | None = None
    memory_mb: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _backends: dict[str, SandboxBackend] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_config(cls, config: SandboxSettings) -> ScoringContext:
        return cls(backend=config.backend, timeout_s=config.timeout_s, memory_mb=config.memory_mb)

    def sandbox(self, image: str | None = None) -> SandboxBackend:
        """The sandbox backend for environment image `image` (a task's `image`; None: the default
        one); raises `SandboxUnavailableError` when it cannot work on this host or the image is
        not built. A ready backend instance given to the context is used for every image."""
        if not isinstance(self.backend, str):
            return self.backend
        from tidal.sandbox.image import DEFAULT_IMAGE

        key = "" if image in (None, DEFAULT_IMAGE) or self.backend != "bwrap" else str(image)
        with self._lock:
            if key not in self._backends:
                from tidal.sandbox import get_backend

                self._backends[key] = get_backend(self.backend, **({"image": key} if key else {}))
            return self._backends[key]

    def limits(self, task: Task) -> Limits:
        """The task's limits with this context's overrides applied."""
        update: dict[str, float | int] = {}
        if self.timeout_s is not None:
            update["timeout_s"] = self.timeout_s
        if self.memory_mb is not None:
            update["memory_mb"] = self.memory_mb
        return task.limits.model_copy(update=update) if update else task.limits


Verifier = Callable[[Task, str, ScoringContext], Score]
# Scores several answers to ONE task at once, in order; each score must equal the verifier's own.
BatchVerifier = Callable[[Task, list[str], ScoringContext], list[Score]]


@dataclass(frozen=True)
class VerifierEntry:
    """A registered verifier. `function` and `batch` are the callables as written; `call` and
    `call_batch` (made once, so an alias hands out the same object) wrap them in `checked_score`,
    and are what the registry hands out; their `__wrapped__` is the function as written."""

    name: str
    function: Verifier
    aliases: tuple[str, ...] = ()
    batch: BatchVerifier | None = None
    sandbox: bool = False  # it runs the answer (or a tool on it) in a sandbox of the task's image
    call: Verifier = field(init=False, repr=False, compare=False)
    call_batch: BatchVerifier | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "call", functools.wraps(self.function)(functools.partial(_call, self.function)))
        batch = None if self.batch is None else functools.wraps(self.batch)(functools.partial(_call_batch, self.batch))
        object.__setattr__(self, "call_batch", batch)

    @property
    def description(self) -> str:
        doc = (self.function.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""


def _call(function: Verifier, task: Task, answer: str, ctx: ScoringContext) -> Score:
    """The verifier's score, its return value checked (`checked_score`). What a plugin's verifier
    raises is an infra_error too; a built-in's (a bug in tidal) and any `TidalError` propagate."""
    try:
        result = function(task, answer, ctx)
    except Exception as error:  # noqa: BLE001 - a plugin's error becomes its score (`_raised`)
        return _raised(function, task, error)
    return checked_score(result, function, task)


def _call_batch(batch: BatchVerifier, task: Task, answers: list[str], ctx: ScoringContext) -> list[Score]:
    """The batch form's scores, one per answer, each checked like `_call`'s."""
    try:
        results = batch(task, answers, ctx)
    except Exception as error:  # noqa: BLE001 - as in `_call`
        problem = _raised(batch, task, error)
        return [dataclasses.replace(problem) for _ in answers]
    if not isinstance(results, (list, tuple)) or len(results) != len(answers):
        got = f"{len(results)} results" if isinstance(results, (list, tuple)) else f"a {type(results).__name__}"
        problem = user_verifier_error(batch, task, f"returned {got} for {len(answers)} answers")
        return [dataclasses.replace(problem) for _ in answers]
    return [checked_score(result, batch, task) for result in results]


USER_ERROR = "user_error"  # Score.info key: the user's verifier failed as written, not the answer


def checked_score(result: object, function: Callable[..., object], task: Task) -> Score:
    """What a verifier returned, as a `Score`: a Score as it is; a bool or a number in [0, 1] as
    that reward, `passed` at 1 (True) and `failed` below. Anything else (None, a dict, a string,
    NaN, a number outside [0, 1], a Score without an `Outcome`) is an `infra_error` naming the
    function, its file and line, and what it returned, which the gate drops instead of training on."""
    if isinstance(result, Score):
        if not isinstance(result.outcome, Outcome):
            return user_verifier_error(function, task, f"returned a Score whose outcome is {result.outcome!r}, "
                                       f"not an Outcome ({', '.join(o.name for o in Outcome)})")
        if isinstance(result.value, bool) or not isinstance(result.value, (int, float)) or not math.isfinite(result.value):
            return user_verifier_error(function, task, f"returned a Score whose value is {result.value!r}, "
                                       "not a finite number")
        return result
    if isinstance(result, (bool, int, float)) and math.isfinite(result) and 0.0 <= result <= 1.0:
        value = float(result)
        return Score(value, Outcome.PASSED if value >= 1.0 else Outcome.FAILED, {}, f"{task.verifier.name}: {value:g}")
    if isinstance(result, (bool, int, float)):
        return user_verifier_error(function, task, f"returned {result!r}, not a number in [0, 1]")
    return user_verifier_error(function, task, f"returned {_shown(result)}, not a float, a bool or a Score")


def user_verifier_error(function: Callable[..., object], task: Task, detail: str) -> Score:
    """The infra_error score of a verifier that failed as written: says which function, where."""
    location = defined_at(function)
    name = getattr(inspect.unwrap(function), "__qualname__", repr(function))
    return Score(0.0, Outcome.INFRA_ERROR, {},
                 f"task {task.id}: verifier {task.verifier.name} (function {name} at {location}) {detail}",
                 {USER_ERROR: True, TASK_PROBLEM: True, "location": location})


def _raised(function: Callable[..., object], task: Task, error: Exception) -> Score:
    """A plugin's exception as its infra_error score; a built-in's and a `TidalError` re-raised."""
    if isinstance(error, TidalError) or _is_builtin(function):
        raise error
    return user_verifier_error(function, task, f"raised {type(error).__name__} at "
                               f"{where(error, _source_file(function))}: {error}")


def _shown(result: object) -> str:
    text = repr(result)
    return f"a {type(result).__name__} {text if len(text) <= 200 else text[:200] + '...'}"


def _source_file(function: Callable[..., object]) -> str | None:
    try:
        return inspect.getsourcefile(inspect.unwrap(function))
    except TypeError:
        return None


def _is_builtin(function: Callable[..., object]) -> bool:
    return (getattr(inspect.unwrap(function), "__module__", "") or "").startswith("tidal.")


_VERIFIERS: dict[str, VerifierEntry] = {}


def verifier(
    name: str, *, aliases: tuple[str, ...] = (), batch: BatchVerifier | None = None, sandbox: bool = False
) -> Callable[[Verifier], Verifier]:
    """Register `fn(task, answer, ctx) -> Score | float | bool` as the verifier `name` (and its
    `aliases`); a number or bool is the reward, in [0, 1] (see `checked_score`).
    `sandbox`: it needs a sandbox of the task's image (a scoring node must have bubblewrap and the image).

    `batch(task, answers, ctx) -> scores`, when given, scores several answers to one task in one
    go (one sandbox instead of one each); `Scorer.score_many` uses it for groups of answers.
    """

    def decorate(function: Verifier) -> Verifier:
        entry = VerifierEntry(name, function, tuple(aliases), batch, sandbox)
        for key in (name, *aliases):
            existing = _VERIFIERS.get(key)
            if existing is not None and existing.function is not function:
                raise ValueError(f"verifier {key!r} is already registered by {existing.function.__module__}")
            _VERIFIERS[key] = entry
        return function

    return decorate


# ----------------------------------------------------------------------------- hostile answers


def decode_answer(answer: str | bytes) -> str | Score:
    """Bytes as UTF-8 text, or a failed `Score` saying why they cannot be an answer."""
    if isinstance(answer, str):
        return answer
    if len(answer) > MAX_ANSWER_BYTES:
        return failed(f"answer is {len(answer)} bytes, over the {MAX_ANSWER_BYTES // 1024} KiB cap")
    try:
        return answer.decode("utf-8")
    except UnicodeDecodeError as error:
        return failed(f"answer is not valid UTF-8 (byte {error.start})")


def check_answer(answer: str) -> Score | None:
    """A failed `Score` for answers no verifier should look at (empty, too big, binary), else None."""
    if not isinstance(answer, str):
        return failed(f"answer is a {type(answer).__name__}, not text")
    try:
        size = len(answer.encode("utf-8"))
    except UnicodeEncodeError as error:
        return failed(f"answer is not valid text (unpaired surrogate at character {error.start})")
    if size > MAX_ANSWER_BYTES:
        return failed(f"answer is {size} bytes, over the {MAX_ANSWER_BYTES // 1024} KiB cap")
    if "\0" in answer:
        return failed("answer contains NUL bytes")
    if not answer.strip():
        return format_failed("empty answer")
    return None


def failed(detail: str, **components: float) -> Score:
    return Score(0.0, Outcome.FAILED, dict(components), detail)


FORMAT_ERROR = "format_error"  # Score.info key: the answer is not in the form the task asks for
TASK_PROBLEM = "task_problem"  # Score.info key: the task itself cannot be judged


def format_failed(detail: str, **components: float) -> Score:
    """A failed `Score` for an answer that holds nothing to judge in the task's format (no final
    answer, no code block): a model failure that evaluation reports as `format_error`."""
    return Score(0.0, Outcome.FAILED, dict(components), detail, {FORMAT_ERROR: True})


def task_problem(task: Task, detail: str) -> Score:
    """A task whose verifier arguments are wrong: not the answer's fault, so never a training 0
    (evaluation reports it as `verifier_error`, apart from the model's outcomes)."""
    return Score(0.0, Outcome.INFRA_ERROR, {}, f"task {task.id}: verifier {task.verifier.name}: {detail}",
                 {TASK_PROBLEM: True})
