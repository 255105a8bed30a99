"""One rendering of a tool-calling conversation, for the episode runner and for `tidal serve`.

An episode reaches a local model in process (`LocalPolicy`) or through the OpenAI-compatible
server (`EndpointPolicy` -> `tidal serve`). Both build the prompt with these functions, so the
same conversation is the same text either way (tests/integration/test_serve_eval_equivalence.py):

- `tools_instructions`: the tools' declarations, compact JSON with sorted keys inside
  `<tools></tools>`, and the call format, appended to the first system message;
- `render_messages`: OpenAI chat messages -> chat-template input; an assistant's `tool_calls`
  re-rendered in the canonical call form, `tool` messages left to the model's own template;
- `answer_messages`: one `tool` message per call when the turn's calls are well formed and name
  offered tools (exactly when a server returns `tool_calls`), else the error as a user message.

The roads still differ outside the text: a server re-tokenises the conversation and re-renders
calls from their parsed JSON (docs/design/serve.md, "Tool calls").
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from tidal.agent.toolcall import (
    CLOSE_TAG,
    OPEN_TAG,
    CallValidity,
    ParsedTurn,
    format_tool_call,
)

Message = dict[str, Any]
ROLES = ("system", "developer", "user", "assistant", "tool")

# Short on purpose: byte-level tiny models have contexts of a few hundred tokens.
_TOOLS_PROMPT = (
    "# Tools\nYou may call these functions:\n<tools>\n{tools}\n</tools>\n"
    f"To call one, answer with {OPEN_TAG}{{{{\"name\": <function-name>, \"arguments\": <args-json-object>}}}}"
    f"{CLOSE_TAG}; the result comes back in the next message."
)


class MessageError(ValueError):
    """A chat message that cannot be rendered; `param` names the field (e.g. `messages[2].role`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


def tools_instructions(tools: list[dict[str, Any]]) -> str:
    """The system-prompt block that declares `tools` (OpenAI function declarations) and the format."""
    declared = "\n".join(json.dumps(tool, ensure_ascii=False, separators=(",", ":"), sort_keys=True) for tool in tools)
    return _TOOLS_PROMPT.format(tools=declared)


def render_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, str]]:
    """OpenAI chat messages (and the offered tools) -> `{"role", "content"}` dicts of plain text
    for the chat template. Plain string messages without tools come out unchanged. Raises
    `MessageError` naming the bad field."""
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
        rendered.append({"role": role, "content": content})
    if tools:
        block = tools_instructions(tools)
        if rendered and rendered[0]["role"] == "system":
            rendered[0] = {"role": "system", "content": rendered[0]["content"] + "\n\n" + block}
        else:
            rendered.insert(0, {"role": "system", "content": block})
    return rendered


def calls_offered(parsed: ParsedTurn, offered: Collection[str]) -> bool:
    """Whether a turn holds well-formed calls of offered tools only: the turns a server answers
    with `tool_calls` (its arguments may still break the tool's schema)."""
    return parsed.validity is CallValidity.VALID and all(call.name in offered for call in parsed.calls)


def answer_messages(results: list[str], calls: int, call_ids: list[str] | None = None) -> list[Message]:
    """The messages that answer a turn with `calls` calls (0: not a turn of offered calls).

    Every call gets a `tool` message (with its id when there are ids); a turn whose calls did not
    run answers each with its one error. Without calls, each result is a user message."""
    if not calls:
        return [{"role": "user", "content": result} for result in results]
    answers = results if len(results) == calls else [results[0]] * calls
    ids: list[str | None] = list(call_ids) if call_ids else [None] * calls
    return [{"role": "tool", "content": answer, **({"tool_call_id": i} if i else {})} for i, answer in zip(ids, answers)]


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
    return format_tool_call(function["name"], parsed)
