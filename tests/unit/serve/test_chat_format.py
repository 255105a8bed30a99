"""The server's chat rendering and its strict tool-call parser, on crafted model outputs."""

from __future__ import annotations

import json

import pytest

from tidal.models import build_tiny_tokenizer, render_prompt
from tidal.serve.chat import (
    MessageError,
    parse_tool_calls,
    render_messages,
    stop_holdback,
    tool_call_holdback,
)
from tidal.serve.responses import StreamedText

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
KNOWN = ["get_weather", "add"]


def _call(name: str, arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# ---------------------------------------------------------------- parsing


def test_plain_text_is_content_without_error() -> None:
    parsed = parse_tool_calls("The answer is 4.", KNOWN)
    assert (parsed.content, parsed.tool_calls, parsed.error) == ("The answer is 4.", [], "")
    assert parse_tool_calls("  \n", KNOWN).content is None


def test_one_and_several_calls_with_leading_content() -> None:
    text = "Let me check." + _call("get_weather", {"city": "Paris"}) + "\n" + _call("add", {"a": 1, "b": 2}) + "\n"
    parsed = parse_tool_calls(text, KNOWN)
    assert parsed.error == ""
    assert parsed.content == "Let me check."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
    only = parse_tool_calls(_call("add", {}), KNOWN)
    assert only.content is None and only.tool_calls[0].name == "add"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('<tool_call>\n{"name": "add", "arguments": {"a": 1}\n</tool_call>', "not valid JSON"),
        ("<tool_call>\n" + '{"name": "rm", "arguments": {}}' + "\n</tool_call>", "was not offered"),
        ('<tool_call>{"name": "add"}</tool_call>', "exactly the keys name and arguments: missing arguments"),
        ('<tool_call>{"name": "add", "arguments": {}, "id": 3}</tool_call>', "exactly the keys name and arguments: unexpected id"),
        ('<tool_call>{"name": "add", "arguments": "{}"}</tool_call>', "must be a JSON object"),
        ('<tool_call>["add", {}]</tool_call>', "must be a JSON object, got list"),
        (_call("add", {}) + " and then some", "text after a tool call"),
        (_call("add", {}) + "oops" + _call("add", {}), "text after a tool call"),
        ('<tool_call>{"name": "add", "arguments": {}}', "is never closed"),
        (_call("add", {}) + '<tool_call>{"name": "add"', "is never closed"),
        ('<tool_call>{"name": "add", "arguments": {"a": ' + "[" * 40 + "]" * 40 + "}}</tool_call>", "nested deeper"),
        ("".join(_call("add", {}) for _ in range(9)), "more than 8 tool calls"),
    ],
)
def test_malformed_calls_are_plain_content_with_a_reason(text: str, reason: str) -> None:
    parsed = parse_tool_calls(text, KNOWN)
    assert parsed.tool_calls == []
    assert parsed.content == text
    assert reason in parsed.error


# ---------------------------------------------------------------- rendering


def test_plain_messages_render_exactly_as_in_process() -> None:
    tokenizer = build_tiny_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert render_messages(messages, None) == messages
    assert render_prompt(tokenizer, render_messages(messages, None)) == render_prompt(tokenizer, messages)


def test_tools_go_into_the_system_message() -> None:
    alone = render_messages([{"role": "user", "content": "weather?"}], [WEATHER])
    assert alone[0]["role"] == "system"
    assert json.dumps(WEATHER, separators=(",", ":"), sort_keys=True) in alone[0]["content"]
    assert "<tool_call>" in alone[0]["content"] and alone[1] == {"role": "user", "content": "weather?"}
    merged = render_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}], [WEATHER])
    assert len(merged) == 2 and merged[0]["content"].startswith("Be brief.\n\n# Tools")


def test_tool_history_round_trips_through_the_parser() -> None:
    """An assistant turn with tool_calls renders in the very format the parser reads back."""
    history = [
        {"role": "user", "content": "weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "-3C"},
    ]
    rendered = render_messages(history, [WEATHER])
    assistant = rendered[2]
    assert assistant["role"] == "assistant"
    parsed = parse_tool_calls(assistant["content"], ["get_weather"])
    assert parsed.error == "" and parsed.tool_calls[0].arguments == {"city": "Oslo"}
    assert assistant["content"] == '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    # A tool message stays one: the model's own chat template renders it (Qwen's as <tool_response>).
    assert rendered[3] == {"role": "tool", "content": "-3C"}


def test_content_parts_and_developer_role() -> None:
    out = render_messages([{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], None)
    assert out == [{"role": "system", "content": "ab"}]


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        ([{"content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": "x"}, {"role": "user"}], "messages[1].content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
        ([{"role": "assistant", "content": None}], "messages[0].content"),
        (["hello"], "messages[0]"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}],
            "messages[0].tool_calls[0].function.arguments",
        ),
    ],
)
def test_bad_messages_name_the_field(messages: list, param: str) -> None:
    with pytest.raises(MessageError) as caught:
        render_messages(messages, None)
    assert caught.value.param == param


# ---------------------------------------------------------------- streaming hold-back


def test_holdbacks() -> None:
    assert stop_holdback("hello wor", ["world"]) == (6, False)  # "wor" may begin "world"
    assert stop_holdback("hello world!", ["world"]) == (6, True)
    assert stop_holdback("abc", ["x"]) == (3, False)
    assert tool_call_holdback("text <tool") == 5
    assert tool_call_holdback("text <tool_call>{...") == 5
    assert tool_call_holdback("plain") == 5


def _stream(text: str, stop: list[str], tools: bool) -> tuple[str, StreamedText]:
    tokenizer = build_tiny_tokenizer()
    streamed = StreamedText(tokenizer, stop, tools)
    sent = "".join(streamed.feed([token]) for token in tokenizer.encode(text, add_special_tokens=False))
    return sent, streamed


def test_stream_never_sends_a_stop_string_or_a_tool_call() -> None:
    sent, streamed = _stream("Hello STOP and more", ["STOP"], tools=False)
    assert sent == "Hello " and streamed.rest("Hello ") == ""

    text = "Sure." + _call("add", {"a": 1})
    sent, streamed = _stream(text, [], tools=True)
    assert sent == "Sure."
    parsed = parse_tool_calls(text, KNOWN)
    assert streamed.rest(parsed.content) == "" and parsed.tool_calls

    broken = "Sure.<tool_call>{oops"  # not a call after all: the rest is sent at the end
    sent, streamed = _stream(broken, [], tools=True)
    assert sent + streamed.rest(parse_tool_calls(broken, KNOWN).content) == broken


def test_stream_waits_for_whole_utf8_characters() -> None:
    tokenizer = build_tiny_tokenizer()
    streamed = StreamedText(tokenizer, [], False)
    ids = tokenizer.encode("é€", add_special_tokens=False)  # 2 + 3 bytes, one token each
    assert len(ids) == 5
    deltas = [streamed.feed([token]) for token in ids]
    assert deltas == ["", "é", "", "", "€"]
