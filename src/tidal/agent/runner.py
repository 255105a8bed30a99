"""The episode runner: one task, one policy, one sandbox session, many tool-calling turns.

    messages = context.messages(task, tools)           # system, task, memory layers
    session  = open_session(backend, task.files)        # the workspace the agent changes
    loop until submit or a budget runs out (steps, context tokens, wall time):
        turn = conversation.generate()                  # the policy's turn, parsed strictly
        check the calls (parse error, unknown tool, invalid arguments); run them if all are valid
        conversation.observe(results)                   # truncated tool output, or the error
    score = run_acceptance(task, session)               # hidden tests, written in now, run in this session
    outcome = pass | fail | format_error | step_limit | context_exceeded | timeout | agent_error
              | infra_error | verifier_error

An invalid turn runs none of its calls; the model is told what was wrong and the step counts
against the budget. The wall time is a deadline inside the step too: commands are cut to what is
left, and a turn is stopped there when its conversation takes a `deadline` (`TurnTimeout`: the
episode ends `timeout` with the partial turn recorded). Before each turn the context-window rule
(window.py) runs, locally by token count and served by the server's refusal, with the configured
overflow strategy. RL training and evaluation both call `run_episode`.
"""

from __future__ import annotations

import inspect
import json
import re
import time
from dataclasses import dataclass, field

from tidal.agent.acceptance import run_acceptance
from tidal.agent.context import ContextPolicy
from tidal.agent.policy import Conversation, Policy, Turn
from tidal.agent.protocol import TurnTimeout
from tidal.agent.records import (
    AgentOutcome,
    AgentResult,
    CallRecord,
    StepRecord,
    Termination,
)
from tidal.agent.toolcall import CallValidity, ParsedTurn
from tidal.agent.tools import (
    ToolContext,
    ToolSpec,
    check_arguments,
    get_tools,
    tool_schemas,
)
from tidal.agent.window import fits
from tidal.errors import (
    EndpointAuthError,
    EndpointConfigError,
    EndpointRequestError,
    EndpointUnavailableError,
    SandboxUnavailableError,
    UnknownNameError,
)
from tidal.sandbox.base import SandboxBackend
from tidal.sandbox.session import SessionStore, open_session
from tidal.types import Outcome, Score, Task

PREVIEW_CHARS = 2000  # of each turn's text and each call's arguments, in the step records
_CONTEXT_REFUSAL = re.compile(r"context[_ ]length|context window|maximum context|too many tokens|prompt is too long",
                              re.IGNORECASE)


@dataclass
class AgentConfig:
    """Budgets and context for one episode."""

    max_steps: int | None = None  # model turns; None: the task's max_steps
    max_tokens: int = 32768  # context tokens the episode may reach (prompt + every turn + results)
    max_new_tokens: int = 1024  # per turn
    wall_time_s: float = 600.0  # the whole episode, acceptance tests excluded
    tool_timeout_s: float | None = None  # per command; None: the task's limits.timeout_s
    context: ContextPolicy = field(default_factory=ContextPolicy)
    context_window: int | None = None  # the model's window in tokens (window.py); None: unknown, the
    # server's refusal decides (an endpoint)


def _check(parsed: ParsedTurn, tools: dict[str, ToolSpec]) -> tuple[CallValidity, str]:
    """The turn's validity once names and arguments are checked against the tools."""
    if parsed.validity is not CallValidity.VALID:
        return parsed.validity, parsed.error
    for call in parsed.calls:
        if call.name not in tools:
            return CallValidity.UNKNOWN_TOOL, f"unknown tool {call.name!r}; the tools are {', '.join(tools)}"
        problems = check_arguments(tools[call.name].parameters, call.arguments)
        if problems:
            return CallValidity.INVALID_ARGUMENTS, f"{call.name}: " + "; ".join(problems[:5])
    return CallValidity.VALID, ""


def is_context_refusal(error: Exception) -> bool:
    """Whether an endpoint refused a request for its length (tidal serve says
    context_length_exceeded; other servers word it their own way)."""
    return bool(_CONTEXT_REFUSAL.search(str(error)))


def _preview(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def run_episode(task: Task, policy: Policy, backend: SandboxBackend, config: AgentConfig | None = None,
                *, seed: int = 0, store: SessionStore | None = None) -> AgentResult:
    """Run one episode of `task` and its acceptance tests. EndpointAuthError and
    EndpointConfigError propagate (no later episode would work either); every other failure is an
    outcome in the result."""
    config = config or AgentConfig()
    started = time.monotonic()
    try:
        tools = get_tools(task.tools)
    except UnknownNameError as error:
        return AgentResult(task.id, task.domain, Termination.TASK_ERROR, AgentOutcome.VERIFIER_ERROR, [], None,
                           f"task {task.id}: tools: {error}")
    schemas = tool_schemas(tools)
    messages = config.context.messages(task)
    max_steps = config.max_steps or task.max_steps
    try:
        session = open_session(backend, dict(task.files), task.limits, store)
    except (SandboxUnavailableError, OSError) as error:
        return AgentResult(task.id, task.domain, Termination.INFRA_ERROR, AgentOutcome.INFRA_ERROR, [], None,
                           f"sandbox: {error}", time.monotonic() - started)
    with session:
        conversation = policy.start(task, messages, schemas, seed=seed)
        context = ToolContext(session, backend.python, config.tool_timeout_s)
        termination, detail, answer, steps = _loop(conversation, tools, context, config, max_steps, started)
        wall_s = time.monotonic() - started
        score: Score | None = None
        acceptance_started = time.monotonic()
        if termination is not Termination.INFRA_ERROR:
            try:
                score = run_acceptance(task, session, backend)
            except SandboxUnavailableError as error:
                termination, detail = Termination.INFRA_ERROR, f"acceptance sandbox: {error}"
        acceptance_s = time.monotonic() - acceptance_started
        trace = conversation.trace()
    outcome = _outcome(termination, score, steps)
    if score is not None and outcome is not AgentOutcome.PASS:
        detail = "; ".join(part for part in (detail, score.detail) if part)
    return AgentResult(task.id, task.domain, termination, outcome, steps, score, detail, wall_s, acceptance_s,
                       answer, trace)


class _ContextFull(Exception):
    """The turn does not fit the context window and the overflow strategy has nothing left to free."""


def _loop(conversation: Conversation, tools: dict[str, ToolSpec], context: ToolContext, config: AgentConfig,
          max_steps: int, started: float) -> tuple[Termination, str, str | None, list[StepRecord]]:
    steps: list[StepRecord] = []
    deadline = started + config.wall_time_s
    context.deadline = deadline  # every command is cut to what is left of the episode
    timed = _takes_deadline(conversation)
    for index in range(max_steps):
        if time.monotonic() >= deadline:
            return Termination.TIMEOUT, f"wall time {config.wall_time_s:g} s used up", None, _mark_recovery(steps)
        room = config.max_tokens - conversation.context_tokens
        if room <= 0:
            return Termination.TOKEN_LIMIT, f"context reached {config.max_tokens} tokens", None, _mark_recovery(steps)
        step_started = time.perf_counter()
        changes: list[str] = []
        try:
            turn = _generate(conversation, min(config.max_new_tokens, room), config, deadline if timed else None,
                             changes)
        except (EndpointAuthError, EndpointConfigError):
            raise
        except TurnTimeout as error:
            if error.turn is not None:
                steps.append(_record(index, error.turn, _check(error.turn.parsed, tools), 0.0, step_started, [],
                                     changes))
            return (Termination.TIMEOUT, f"wall time {config.wall_time_s:g} s ran out during turn {index}: {error}",
                    None, _mark_recovery(steps))
        except _ContextFull as error:
            return Termination.TOKEN_LIMIT, str(error), None, _mark_recovery(steps)
        except EndpointUnavailableError as error:
            return Termination.INFRA_ERROR, str(error), None, _mark_recovery(steps)
        except EndpointRequestError as error:
            return Termination.AGENT_ERROR, str(error), None, _mark_recovery(steps)
        validity, error_text = _check(turn.parsed, tools)
        calls: list[CallRecord] = []
        results: list[str] = []
        submitted, answer, tool_s = False, None, 0.0
        if validity is CallValidity.VALID:
            try:
                submitted, answer, tool_s = _run_calls(turn, tools, context, config, calls, results)
            except SandboxUnavailableError as error:
                return Termination.INFRA_ERROR, f"sandbox: {error}", None, _mark_recovery(steps)
        else:
            results = [f"error ({validity.value}): {error_text}"]
        out_of_time = not submitted and time.monotonic() >= deadline
        if not submitted and not out_of_time:
            conversation.observe(turn, results)
        steps.append(_record(index, turn, (validity, error_text), tool_s, step_started, calls, changes))
        if submitted:
            return Termination.SUBMITTED, "", answer, _mark_recovery(steps)
        if out_of_time:
            return (Termination.TIMEOUT, f"wall time {config.wall_time_s:g} s ran out during the tools of turn {index}",
                    None, _mark_recovery(steps))
    return Termination.STEP_LIMIT, f"{max_steps} steps used without submit", None, _mark_recovery(steps)


def _record(index: int, turn: Turn, check: tuple[CallValidity, str], tool_s: float, step_started: float,
            calls: list[CallRecord], changes: list[str]) -> StepRecord:
    wall = time.perf_counter() - step_started
    return StepRecord(
        index=index, tokens_in=turn.tokens_in, tokens_out=turn.tokens_out, generation_s=turn.generation_s,
        tool_s=tool_s, overhead_s=max(0.0, wall - turn.generation_s - tool_s), validity=check[0].value,
        error=check[1], finish_reason=turn.finish_reason, cpu_s=turn.cpu_s, text=_preview(turn.text),
        calls=calls, first_token_s=turn.first_token_s, context_changes=list(changes))


def _takes_deadline(conversation: Conversation) -> bool:
    """Whether the conversation's `generate` can stop a turn at a deadline (protocol.Conversation)."""
    try:
        return "deadline" in inspect.signature(conversation.generate).parameters
    except (TypeError, ValueError):
        return False


def _generate(conversation: Conversation, new_tokens: int, config: AgentConfig, deadline: float | None,
              changes: list[str]) -> Turn:
    """The next turn under the context-window policy (window.py): free room while the turn does
    not fit the model's window (known locally), or when the server refuses the request for its
    length (served), then generate; `_ContextFull` when the overflow strategy has nothing left."""
    while True:
        tokens = conversation.context_tokens
        if not fits(tokens, new_tokens, config.context_window):
            _free_room(conversation, config, changes, f"the prompt has {tokens} tokens and the turn may add "
                       f"{new_tokens}: over the model's context window of {config.context_window}")
            continue
        try:
            if deadline is not None:
                return conversation.generate(new_tokens, deadline=deadline)  # type: ignore[call-arg]
            return conversation.generate(new_tokens)
        except EndpointRequestError as error:
            if not is_context_refusal(error):  # a refusal for length is the window's doing, not the model's
                raise
            _free_room(conversation, config, changes, str(error))


def _free_room(conversation: Conversation, config: AgentConfig, changes: list[str], why: str) -> None:
    shrink = getattr(conversation, "shrink", None)
    done = shrink(config.context.overflow) if shrink is not None and config.context.overflow else None
    if done is None:
        raise _ContextFull(why)
    changes.append(done)


def _run_calls(turn: Turn, tools: dict[str, ToolSpec], context: ToolContext, config: AgentConfig,
               calls: list[CallRecord], results: list[str]) -> tuple[bool, str | None, float]:
    """Run a valid turn's calls in order, stopping after submit; (submitted, answer, tool seconds)."""
    total = 0.0
    for call in turn.parsed.calls:
        began = time.perf_counter()
        output = tools[call.name].run(context, call.arguments)
        spent = time.perf_counter() - began
        total += spent
        text, truncated, summarized = config.context.compress(output.text)
        results.append(text)
        calls.append(CallRecord(call.name, _preview(json.dumps(call.arguments, ensure_ascii=False)), output.ok,
                                spent, len(output.text), truncated, summarized))
        if output.submitted:
            return True, output.answer, total
    return False, None, total


def _mark_recovery(steps: list[StepRecord]) -> list[StepRecord]:
    """For each invalid turn: whether the next turn was valid (None when no turn followed)."""
    for step, following in zip(steps, [*steps[1:], None]):
        if step.validity != CallValidity.VALID.value:
            step.recovered = None if following is None else following.validity == CallValidity.VALID.value
    return steps


def _outcome(termination: Termination, score: Score | None, steps: list[StepRecord]) -> AgentOutcome:
    """The tests decide a pass whatever stopped the loop; otherwise the stop says why it failed.
    A step budget spent without one valid turn, at least one of them malformed (not merely
    without a call), is a format error: the model never produced a call the harness could run."""
    if termination is Termination.INFRA_ERROR:
        return AgentOutcome.INFRA_ERROR
    if score is None or score.outcome is Outcome.INFRA_ERROR:
        return AgentOutcome.VERIFIER_ERROR
    if score.outcome is Outcome.PASSED:
        return AgentOutcome.PASS
    validity = {step.validity for step in steps}
    malformed = validity - {CallValidity.VALID.value, CallValidity.NO_CALL.value}
    if termination is Termination.STEP_LIMIT and malformed and CallValidity.VALID.value not in validity:
        return AgentOutcome.FORMAT_ERROR
    return {
        Termination.STEP_LIMIT: AgentOutcome.STEP_LIMIT,
        Termination.TOKEN_LIMIT: AgentOutcome.CONTEXT_EXCEEDED,
        Termination.TIMEOUT: AgentOutcome.TIMEOUT,
        Termination.AGENT_ERROR: AgentOutcome.AGENT_ERROR,
    }.get(termination, AgentOutcome.FAIL)
