"""Policies: what writes the agent's turns. The policies that need no model, and the factory.

A `Policy` (protocol.py) opens one `Conversation` per episode; the conversation generates a turn,
is told the tool results, and generates the next. Three implementations:

- `LocalPolicy` (local.py): a checkpoint or the tiny model in-process through the EmbeddedEngine,
  token-in/token-out;
- `EndpointPolicy` (endpoint.py): any OpenAI-compatible chat-completions endpoint, over HTTP;
- `ScriptedPolicy` (here): replays fixed turns. It is a real policy, used where a test needs a
  model with known behaviour (malformed calls, a reference solution), and by `OraclePolicy`,
  which runs each task's reference script: the harness's own sanity check, as Harbor's oracle.

`make_policy(spec)` picks one from a model spec: `tiny`, a checkpoint folder, `oracle`, or
`openai:<model>@<base_url>`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from tidal.agent.protocol import Conversation, Message, Policy, Turn
from tidal.agent.render import answer_messages, calls_offered, render_messages
from tidal.agent.toolcall import format_tool_call, parse_tool_calls
from tidal.agent.window import shrink
from tidal.types import Task, is_multi_turn

# The protocol is named here too, where the runner and the harness import it.
__all__ = [
    "Conversation",
    "Message",
    "OraclePolicy",
    "Policy",
    "ScriptedConversation",
    "ScriptedPolicy",
    "Turn",
    "make_policy",
    "oracle_turns",
]


# --------------------------------------------------------------------------------------- scripted


class ScriptedConversation:
    """Replays `outputs` one per turn; after the last one every turn is empty (a `no_call` turn).
    Its messages are what a local model would read (tools rendered into the system message). A
    turn longer than `max_new_tokens` characters is cut there unless `truncate` is False."""

    def __init__(self, messages: list[Message], outputs: Sequence[str], tools: list[dict[str, Any]],
                 truncate: bool = True) -> None:
        self.messages = render_messages(messages, tools)
        self.opening = len(self.messages)
        self.offered = [tool["function"]["name"] for tool in tools]
        self.outputs = list(outputs)
        self.turns = 0
        self.truncate = truncate

    @property
    def context_tokens(self) -> int:
        return sum(len(str(m.get("content", ""))) for m in self.messages)

    def generate(self, max_new_tokens: int) -> Turn:
        started = time.perf_counter()
        text = self.outputs[self.turns] if self.turns < len(self.outputs) else ""
        self.turns += 1
        finish = "stop"
        if self.truncate and len(text) > max_new_tokens:  # a scripted "token" is a character
            text, finish = text[:max_new_tokens], "length"
        context = self.context_tokens
        self.messages.append({"role": "assistant", "content": text})
        return Turn(text, parse_tool_calls(text), context, len(text), time.perf_counter() - started, finish)

    def observe(self, turn: Turn, results: list[str]) -> None:
        calls = len(turn.parsed.calls) if calls_offered(turn.parsed, self.offered) else 0
        self.messages.extend(answer_messages(results, calls))

    def shrink(self, strategy: Sequence[str]) -> str | None:
        """One step of the overflow strategy (window.shrink) on the messages."""
        return shrink(self.messages, self.opening, strategy)

    def trace(self) -> dict[str, Any]:
        return {"messages": self.messages}


class ScriptedPolicy:
    """Replays the same fixed turns in every episode (or `outputs_for(task)` when given)."""

    def __init__(self, outputs: Sequence[str] = (), name: str = "scripted",
                 outputs_for: Callable[[Task], Sequence[str]] | None = None, truncate: bool = True) -> None:
        self.name = name
        self.outputs = list(outputs)
        self.outputs_for = outputs_for
        self.truncate = truncate

    def start(self, task: Task, messages: list[Message], tools: list[dict[str, Any]],
              seed: int = 0) -> ScriptedConversation:
        outputs = self.outputs_for(task) if self.outputs_for is not None else self.outputs
        return ScriptedConversation(messages, outputs, tools, truncate=self.truncate)


def oracle_turns(task: Task) -> list[str]:
    """The turns of an agent that runs the task's reference script with bash, then submits; for a
    single-turn task, its reference answer."""
    if not is_multi_turn(task):
        return [task.reference or ""]
    if not task.reference:
        return [format_tool_call("submit", {})]
    return [format_tool_call("bash", {"command": task.reference}), format_tool_call("submit", {})]


class OraclePolicy(ScriptedPolicy):
    """Runs each task's reference solution: every task should pass; one that fails is broken. Its
    turns are never cut at the token budget: a long reference is answered whole, so a task set is
    validated on its references, not on the budget."""

    def __init__(self) -> None:
        super().__init__(name="oracle", outputs_for=oracle_turns, truncate=False)


# --------------------------------------------------------------------------------------- factory


def make_policy(spec: str, **options: Any) -> Policy:
    """The policy a model spec names: `tiny`, a checkpoint folder, `oracle`, `openai:<model>@<url>`.

    `options` go to the policy's constructor (sampling settings, `api_key_env`, timeouts).
    """
    if spec == "oracle":
        return OraclePolicy()
    if spec.startswith("openai:"):
        from tidal.agent.endpoint import EndpointPolicy

        return EndpointPolicy.from_spec(spec, **options)
    from tidal.agent.local import LocalPolicy

    return LocalPolicy.load(spec, **options)
