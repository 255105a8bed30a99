"""The policy protocol: a `Policy` opens one `Conversation` per episode, whose turns are `Turn`s.

It lives apart from policy.py (the scripted policies and `make_policy`) so that the policies
make_policy builds, local.py and endpoint.py, import it without importing their own factory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from tidal.agent.toolcall import ParsedTurn
from tidal.types import Task

Message = dict[str, Any]


@dataclass
class Turn:
    """One model turn. Token counts are the policy's own: exact for local models, the endpoint's
    `usage` for APIs, characters for scripted turns."""

    text: str
    parsed: ParsedTurn
    tokens_in: int  # context tokens the model read for this turn
    tokens_out: int  # tokens it wrote
    generation_s: float
    finish_reason: str = "stop"  # stop | length | tool_calls
    cpu_s: float = 0.0  # process CPU seconds spent generating (local models)
    call_ids: list[str] = field(default_factory=list)  # endpoint tool-call ids, to answer each one
    first_token_s: float | None = None  # time to the first generated token (local: queue + prefill); None: not measured


class Conversation(Protocol):
    """One episode's dialogue with the model."""

    @property
    def context_tokens(self) -> int:
        """Tokens the next turn would read (its prompt)."""
        ...

    def generate(self, max_new_tokens: int) -> Turn: ...

    def observe(self, turn: Turn, results: list[str]) -> None:
        """The tool results for `turn`: one per call when it was valid, else one error message.
        They go back as `render.answer_messages` says: tool messages for offered calls, else a
        user message."""
        ...

    def trace(self) -> dict[str, Any]:
        """The episode as the policy saw it: messages; token ids, mask and logprobs for local models."""
        ...


class Policy(Protocol):
    name: str

    def start(self, task: Task, messages: list[Message], tools: list[dict[str, Any]], seed: int = 0) -> Conversation:
        """A new episode on `messages` (system, task, memory) with `tools` (OpenAI declarations),
        which a text policy renders into the prompt with `render.render_messages` and an endpoint
        sends as the request's `tools`; `seed` (e.g. the epoch) varies sampling between repeats."""
        ...
