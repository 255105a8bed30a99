"""The text format local models use to call tools, and its strict parser.

A tool call is one JSON object between two tags, on the model's own turn:

    <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>

This is the Hermes/Qwen convention that common chat templates already carry; `tidal serve` turns
the same text into OpenAI `tool_calls` with this parser, so a model behaves the same in process and
behind the server. Model output is hostile input: the parser never raises on it, it returns a
`ParsedTurn` whose `CallValidity` says what was wrong (`parse_error`, `no_call`); checking names
and arguments against the tools is the runner's job. Strict means: exact tags, never nested, every
tag closed; a body of exactly `name` (non-empty string) and `arguments` (object); only whitespace
after the last call; text before the first call kept as reasoning; bodies over `MAX_CALL_CHARS`
refused before `json.loads`, nesting deeper than `MAX_DEPTH` a parse error, not a RecursionError.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
MAX_CALL_CHARS = 256 * 1024  # one call's JSON body
MAX_CALLS = 8  # calls in one turn; more is a parse error (a model looping on the tag)
MAX_DEPTH = 32  # JSON nesting


class CallValidity(str, enum.Enum):
    """What a turn's tool calls amount to. Only `valid` turns run their tools."""

    VALID = "valid"
    NO_CALL = "no_call"  # no tool call at all
    PARSE_ERROR = "parse_error"  # tags or JSON broken
    UNKNOWN_TOOL = "unknown_tool"  # a name the registry does not have
    INVALID_ARGUMENTS = "invalid_arguments"  # arguments that do not match the tool's schema


@dataclass
class ToolCall:
    """One parsed call. `id` is the OpenAI call id when the call came from an endpoint."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class ParsedTurn:
    """A model turn split into its text, its calls, and whether they parsed."""

    content: str  # the text before the first call (the whole text when there is none)
    calls: list[ToolCall] = field(default_factory=list)
    validity: CallValidity = CallValidity.VALID
    error: str = ""  # why the turn is not valid, for the model's next observation and the record


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, stopping early once it passes `limit`."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def parse_call_body(body: str) -> ToolCall | str:
    """One call from its JSON body, or why it is not one."""
    if len(body) > MAX_CALL_CHARS:
        return f"the tool call is {len(body)} characters, over the {MAX_CALL_CHARS} limit"
    try:
        data = json.loads(body)
    except RecursionError:
        return f"the tool call's JSON is nested deeper than {MAX_DEPTH} levels"
    except ValueError as error:
        return f"the tool call is not valid JSON: {error}"
    if not isinstance(data, dict):
        return f"the tool call must be a JSON object, got {type(data).__name__}"
    if _depth(data, MAX_DEPTH) > MAX_DEPTH:
        return f"the tool call's JSON is nested deeper than {MAX_DEPTH} levels"
    keys = set(data)
    if keys != {"name", "arguments"}:
        missing, extra = sorted({"name", "arguments"} - keys), sorted(keys - {"name", "arguments"})
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unexpected {', '.join(extra)}"] if extra else [])
        return "the tool call must have exactly the keys name and arguments: " + "; ".join(parts)
    name, arguments = data["name"], data["arguments"]
    if not isinstance(name, str) or not name.strip():
        return "the tool call's name must be a non-empty string"
    if not isinstance(arguments, dict):
        return f"the tool call's arguments must be a JSON object, got {type(arguments).__name__}"
    return ToolCall(name=name, arguments=arguments)


def parse_tool_calls(text: str) -> ParsedTurn:
    """Split a model turn into text and tool calls (see the module docstring for the rules)."""
    if not isinstance(text, str):
        return ParsedTurn("", [], CallValidity.PARSE_ERROR, f"the turn is a {type(text).__name__}, not text")
    first = text.find(OPEN_TAG)
    stray = text.find(CLOSE_TAG)
    if first < 0:
        if stray >= 0:
            return ParsedTurn(text, [], CallValidity.PARSE_ERROR, f"{CLOSE_TAG} without an opening {OPEN_TAG}")
        return ParsedTurn(text, [], CallValidity.NO_CALL, f"no tool call; write {OPEN_TAG}{{...}}{CLOSE_TAG}")
    content = text[:first]
    if 0 <= stray < first:
        return ParsedTurn(content, [], CallValidity.PARSE_ERROR, f"{CLOSE_TAG} before the first {OPEN_TAG}")
    calls: list[ToolCall] = []
    position = first
    while True:
        start = position + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, start)
        if end < 0:
            return ParsedTurn(content, [], CallValidity.PARSE_ERROR, f"{OPEN_TAG} is never closed with {CLOSE_TAG}")
        body = text[start:end]
        if OPEN_TAG in body:
            return ParsedTurn(content, [], CallValidity.PARSE_ERROR, f"{OPEN_TAG} opened again before {CLOSE_TAG}")
        call = parse_call_body(body.strip())
        if isinstance(call, str):
            return ParsedTurn(content, [], CallValidity.PARSE_ERROR, call)
        calls.append(call)
        if len(calls) > MAX_CALLS:
            return ParsedTurn(content, [], CallValidity.PARSE_ERROR, f"more than {MAX_CALLS} tool calls in one turn")
        rest = text[end + len(CLOSE_TAG):]
        following = rest.lstrip()
        if not following:
            return ParsedTurn(content, calls)
        if not following.startswith(OPEN_TAG):
            snippet = following[:40].replace("\n", " ")
            return ParsedTurn(content, [], CallValidity.PARSE_ERROR, f"text after a tool call: {snippet!r}")
        position = end + len(CLOSE_TAG) + (len(rest) - len(following))


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text of one call, as a model should write it."""
    return f"{OPEN_TAG}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{CLOSE_TAG}"

