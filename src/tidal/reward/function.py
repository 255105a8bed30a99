"""Plain reward functions as verifiers: `def reward(task, answer) -> float | Score`.

`@reward_function("name")` registers such a function as the verifier `name`. By default each call
runs in the sandbox (bubblewrap, the task's image and limits): the function's file is copied in
as a read-only harness file and imported there by `function_harness.py`, with a stand-in `tidal`
package that provides `reward_function`, `Score` and `Outcome` (so the file may import those, and
whatever the image has; nothing else of tidal). The task crosses as data (`task.id`,
`task.metadata`, `task.verifier.args`, ...), the result comes back over the report channel.

`in_process=True` is the explicit opt-in to call the function in the scoring process: no
isolation, no time or memory limit, but no sandbox start either (for trusted, pure-Python rewards
on hosts without bubblewrap). The answer is model output either way; the function is the user's.

What the function returns: a bool or number in [0, 1] (`passed` at `pass_at` or above, else
`failed`), or a `Score`. What it raises, a value out of range or of the wrong type, or a sandbox
run that does not finish is never a 0: it is an `infra_error` score with `info["user_error"]`,
whose detail names the function's file and line, which the gate drops instead of training on.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidal.errors import SandboxUnavailableError
from tidal.plugins import where
from tidal.reward import function_harness
from tidal.reward.base import (
    TASK_PROBLEM,
    USER_ERROR,
    ScoringContext,
    check_answer,
    verifier,
)
from tidal.sandbox.base import SandboxStatus
from tidal.types import Outcome, Score, Task

RewardFn = Callable[[Task, str], "float | Score"]
HARNESS_FILE = "tidal_reward_harness.py"
BOOT = ("import os, runpy; runpy.run_path(os.path.join(os.environ['TIDAL_HARNESS'], "
        f"'{HARNESS_FILE}'), run_name='__main__')")
SHIMS: dict[str, str | bytes] = {
    "tidal/__init__.py": '"""Stand-in for tidal inside the sandbox (reward functions)."""\n',
    "tidal/types.py": function_harness.SHIM_TYPES,
    "tidal/reward/__init__.py": function_harness.SHIM_REWARD,
}


def reward_function(
    name: str | None = None, *, in_process: bool = False, pass_at: float = 1.0, aliases: tuple[str, ...] = ()
) -> Callable[[RewardFn], RewardFn]:
    """Register `fn(task, answer) -> float | Score` as the verifier `name` (default: the
    function's name), run in the sandbox unless `in_process` (see the module docstring).
    `pass_at`: a returned number at or above it is `passed`."""

    def decorate(function: RewardFn) -> RewardFn:
        register_reward_function(name or function.__name__, function, in_process=in_process, pass_at=pass_at,
                                 aliases=aliases)
        return function

    return decorate


def register_reward_function(
    name: str, function: RewardFn, *, in_process: bool = False, pass_at: float = 1.0, aliases: tuple[str, ...] = ()
) -> None:
    """The function form of `@reward_function` (entry points of group `tidal.verifiers` that name
    a two-argument function come here)."""
    source = inspect.getsourcefile(function)
    if not in_process and (source is None or not os.path.isfile(source)):
        raise ValueError(f"reward function {name!r} has no source file to run in the sandbox; "
                         "define it in a .py file, or register it with in_process=True")
    if not 0.0 <= pass_at <= 1.0:
        raise ValueError(f"reward function {name!r}: pass_at={pass_at} must be in [0, 1]")

    def run(task: Task, answer: str, ctx: ScoringContext) -> Score:
        problem = check_answer(answer)
        if problem is not None:
            return problem
        if in_process:
            return _in_process(name, function, task, answer, pass_at)
        return _sandboxed(name, function, str(source), task, answer, ctx, pass_at)

    run.__doc__ = (function.__doc__ or f"reward function {function.__module__}.{function.__qualname__}")
    run.__module__ = function.__module__
    verifier(name, aliases=aliases, sandbox=not in_process)(run)


def user_error(name: str, detail: str, **info: Any) -> Score:
    """The score of a reward function that failed: an infra_error, never a 0 to train on."""
    return Score(0.0, Outcome.INFRA_ERROR, {}, f"reward function {name}: {detail}",
                 {USER_ERROR: True, TASK_PROBLEM: True, **info})


def _in_process(name: str, function: RewardFn, task: Task, answer: str, pass_at: float) -> Score:
    try:
        value = function(task, answer)
    except Exception as error:
        location = where(error, inspect.getsourcefile(function))
        return user_error(name, f"raised {type(error).__name__} at {location}: {error}", location=location)
    if isinstance(value, Score):
        return _checked(name, {"value": value.value, "outcome": value.outcome.value, "components": value.components,
                               "detail": value.detail, "info": value.info}, pass_at)
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return _checked(name, {"value": float(value)}, pass_at)
    return user_error(name, f"returned a {type(value).__name__}, not a float or a Score")


def _sandboxed(name: str, function: RewardFn, source: str, task: Task, answer: str, ctx: ScoringContext,
               pass_at: float) -> Score:
    copied = f"user_reward_{secrets.token_hex(4)}.py"
    job = {"task": task.model_dump(mode="json"), "answer": answer, "file": copied, "function": function.__name__}
    job["task"]["verifier"] = {"name": task.verifier.name, "args": task.verifier.args}
    harness = {HARNESS_FILE: Path(function_harness.__file__).read_text(encoding="utf-8"), **SHIMS,
               copied: Path(source).read_bytes()}
    try:
        backend = ctx.sandbox(task.image)
        result = backend.run([backend.python, "-I", "-c", BOOT], {}, ctx.limits(task), harness_files=harness,
                             report_input=json.dumps(job).encode("utf-8"))
    except SandboxUnavailableError as error:
        return Score(0.0, Outcome.INFRA_ERROR, {}, f"sandbox unavailable: {error}")
    if result.status is not SandboxStatus.OK or not result.report:
        return user_error(name, f"did not finish in the sandbox ({result.status.value}"
                          f"{', ' + result.detail if result.detail else ''}): {result.stderr_text[-1000:].strip()}",
                          status=result.status.value)
    try:
        reply = json.loads(result.report)
    except ValueError:
        return user_error(name, "sent back a reply that is not JSON")
    if "error" in reply:
        location = f"{source}:{reply['line']}" if reply.get("line") else source
        return user_error(name, f"raised {reply.get('type', 'an error')} at {location}: {reply['error']}",
                          location=location, traceback=_host_paths(str(reply.get("traceback", "")), copied, source))
    return _checked(name, reply, pass_at)


def _host_paths(text: str, copied: str, source: str) -> str:
    """The sandbox's traceback with the copied file's path (in the harness folder) as the host's."""
    lines = []
    for line in text.splitlines():
        if copied in line and line.lstrip().startswith("File "):
            start, end = line.find('"'), line.find('"', line.find('"') + 1)
            line = line[: start + 1] + source + line[end:] if 0 <= start < end else line
        lines.append(line)
    return "\n".join(lines)


def _checked(name: str, reply: dict[str, Any], pass_at: float) -> Score:
    value = reply.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return user_error(name, f"returned value {value!r}, not a finite number")
    if not 0.0 <= value <= 1.0:
        return user_error(name, f"returned {value}, outside [0, 1]")
    outcome_name = reply.get("outcome")
    if outcome_name is None:
        outcome = Outcome.PASSED if value >= pass_at else Outcome.FAILED
    else:
        try:
            outcome = Outcome(outcome_name)
        except ValueError:
            return user_error(name, f"returned outcome {outcome_name!r}; known: {', '.join(o.value for o in Outcome)}")
    components = reply.get("components") or {}
    info = reply.get("info") or {}
    if not isinstance(components, dict) or not isinstance(info, dict):
        return user_error(name, "returned a Score whose components or info is not a dict")
    return Score(float(value), outcome, {str(k): float(v) for k, v in components.items()},
                 str(reply.get("detail") or f"{name}: {value:g}"), dict(info))
