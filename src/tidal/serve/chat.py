"""Chat messages and tools to prompt text, and the model's text back to content and tool calls.

The tool-call format is Qwen2.5's (Hermes-style), so a Qwen checkpoint already speaks it and the
built-in ChatML template needs nothing new:

- the tools' JSON schemas go into the system message, one compact JSON object per line inside
  `<tools></tools>`, with a one-line instruction (shorter than Qwen's: tiny models have small
  contexts);
- the model calls a tool by writing, after any plain text,
  `<tool_call>\\n{"name": "<function>", "arguments": {...}}\\n</tool_call>`, one block per call;
- an assistant message with `tool_calls` is rendered back in that same form, and a `tool` message as a
  user turn holding `<tool_response>\\n...\\n</tool_response>` (as Qwen's template does).

Parsing is strict (`parse_tool_calls`): every block must be whole, hold a JSON object with exactly a
known tool `name` and an object `arguments`, and nothing but whitespace may follow the last block.
Anything else is plain content, and the reason is returned so the server can record it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tidal.agent import toolcall

TOOL_CALL_OPEN = toolcall.OPEN_TAG
TOOL_CALL_CLOSE = toolcall.CLOSE_TAG

# Short on purpose: byte-level tiny models have contexts of a few hundred tokens.
_TOOLS_PROMPT = """# Tools
You may call these functions:
<tools>
{tools}
</tools>
To call one, answer with <tool_call>{{"name": <function-name>, "arguments": <args-json-object>}}</tool_call>"""

ROLES = ("system", "developer", "user", "assistant", "tool")


class MessageError(ValueError):
    """A chat message the server cannot render; `param` names the field (e.g. `messages[2].role`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


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


def render_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, str]]:
    """OpenAI chat messages -> `{"role", "content"}` dicts of plain text for the chat template.

    Plain string messages without tools come out unchanged, so a prompt built here equals
    `render_prompt(tokenizer, messages)` in process. Raises `MessageError` naming the bad field.
    """
    rendered: list[dict[str, str]] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise MessageError(where, "must be an object with 'role' and 'content'")
        role = message.get("role")
        if role not in ROLES:
            raise MessageError(f"{where}.role", f"{role!r} is not a role; use one of {', '.join(ROLES)}")
        content = _text_content(message.get("content"), f"{where}.content", allow_none=role == "assistant")
        if role == "developer":
            role = "system"
        if role == "assistant" and message.get("tool_calls"):
            content += "".join(_render_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(message["tool_calls"]))
        elif role == "assistant" and message.get("content") is None:
            raise MessageError(f"{where}.content", "an assistant message needs content or tool_calls")
        if role == "tool":
            role, content = "user", f"<tool_response>\n{content}\n</tool_response>"
        rendered.append({"role": role, "content": content})
    if tools:
        declared = "\n".join(json.dumps(tool, ensure_ascii=False, separators=(",", ":")) for tool in tools)
        system = _TOOLS_PROMPT.format(tools=declared)
        if rendered and rendered[0]["role"] == "system":
            rendered[0] = {"role": "system", "content": rendered[0]["content"] + "\n\n" + system}
        else:
            rendered.insert(0, {"role": "system", "content": system})
    return rendered


def _text_content(content: Any, where: str, allow_none: bool) -> str:
    if content is None:
        if allow_none:
            return ""
        raise MessageError(where, "is required")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise MessageError(f"{where}[{index}]", "only text parts ({'type': 'text', 'text': ...}) are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise MessageError(where, "must be a string or a list of text parts")


def _render_call(call: Any, where: str) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise MessageError(f"{where}.function", "must be an object with a string 'name'")
    arguments = function.get("arguments", "{}")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError as error:
        raise MessageError(f"{where}.function.arguments", f"is not JSON ({error.msg})") from None
    body = json.dumps({"name": function["name"], "arguments": parsed}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


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
