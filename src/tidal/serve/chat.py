"""The model's text back to content and tool calls, and what streaming may send of it.

Messages and tools become prompt text with the agent runner's own rendering
(`tidal.agent.render.render_messages`, re-exported here), so a conversation sent to the server is
the prompt the in-process runner builds for it. The tool-call format is Qwen2.5's (Hermes-style):
after any plain text, `<tool_call>{"name": "<function>", "arguments": {...}}</tool_call>`, one
block per call.

Parsing is strict (`parse_tool_calls`): every block must be whole, hold a JSON object with exactly a
known tool `name` and an object `arguments`, and nothing but whitespace may follow the last block.
Anything else is plain content, and the reason is returned so the server can record it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidal.agent import toolcall
from tidal.agent.render import MessageError, render_messages

__all__ = ["MessageError", "ParsedOutput", "ToolCall", "parse_tool_calls", "render_messages", "stop_holdback",
           "tool_call_holdback", "tool_names"]

TOOL_CALL_OPEN = toolcall.OPEN_TAG
TOOL_CALL_CLOSE = toolcall.CLOSE_TAG


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the function's name and its arguments as a JSON object."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedOutput:
    """What the model wrote, split: `content` (None when only whitespace) and its tool calls.

    `error` is set (and `tool_calls` empty, `content` the whole text) when the text tried to call a
    tool but did not follow the format.
    """

    content: str | None
    tool_calls: list[ToolCall]
    error: str = ""


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    """The function names of OpenAI tool declarations (already validated by the request schema)."""
    return [tool["function"]["name"] for tool in tools]


def parse_tool_calls(text: str, known: list[str]) -> ParsedOutput:
    """Split `text` into content and tool calls, strictly, with the agent runner's parser
    (`tidal.agent.toolcall`), so the same text is judged the same in process and behind the server.

    Text without `<tool_call>` is plain content with no error; text with one that breaks the format,
    or that calls a tool that was not offered, is plain content with the reason in `error`.
    """
    turn = toolcall.parse_tool_calls(text)
    if turn.validity is toolcall.CallValidity.NO_CALL:
        return ParsedOutput(content=text if text.strip() else None, tool_calls=[])
    if turn.validity is not toolcall.CallValidity.VALID:
        return _malformed(text, turn.error)
    unknown = [call.name for call in turn.calls if call.name not in known]
    if unknown:
        return _malformed(text, f"tool {unknown[0]!r} was not offered (offered: {', '.join(known)})")
    calls = [ToolCall(name=call.name, arguments=call.arguments) for call in turn.calls]
    return ParsedOutput(content=turn.content if turn.content.strip() else None, tool_calls=calls)


def _malformed(text: str, reason: str) -> ParsedOutput:
    return ParsedOutput(content=text, tool_calls=[], error=reason)


def tool_call_holdback(text: str) -> int:
    """Where streaming must stop emitting `text` while tools are on: at a `<tool_call>` or at a
    suffix that could still become one, so no part of a call is streamed as content."""
    start = text.find(TOOL_CALL_OPEN)
    if start >= 0:
        return start
    return len(text) - _partial_suffix(text, [TOOL_CALL_OPEN])


def _partial_suffix(text: str, markers: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:size]):
                longest = max(longest, size)
                break
    return longest


def stop_holdback(text: str, stop: list[str]) -> tuple[int, bool]:
    """How much of `text` may be streamed given stop strings: (length, whether a stop was reached).

    Text is cut at the earliest stop string; without one, a suffix that could begin a stop string is
    held back until the next token says whether it does.
    """
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    if cut >= 0:
        return cut, True
    return len(text) - _partial_suffix(text, stop), False
