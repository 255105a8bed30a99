"""The strict tool-call parser: hostile text never raises, and each defect has its kind."""

from __future__ import annotations

import json

import pytest

from tidal.agent.context import truncate
from tidal.agent.toolcall import CallValidity, format_tool_call, parse_tool_calls
from tidal.agent.tools import TOOLS, check_arguments


def test_one_call_with_reasoning_before_it() -> None:
    turn = parse_tool_calls('Let me look.\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>\n')
    assert turn.validity is CallValidity.VALID
    assert turn.content == "Let me look.\n"
    assert [(c.name, c.arguments) for c in turn.calls] == [("bash", {"command": "ls"})]


def test_format_round_trips_and_two_calls_parse_in_order() -> None:
    text = format_tool_call("write_file", {"path": "a", "content": "é\n"}) + "\n" + format_tool_call("submit", {})
    turn = parse_tool_calls(text)
    assert turn.validity is CallValidity.VALID
    assert [c.name for c in turn.calls] == ["write_file", "submit"]
    assert turn.calls[0].arguments["content"] == "é\n"


@pytest.mark.parametrize("text, kind", [
    ("just prose", CallValidity.NO_CALL),
    ("", CallValidity.NO_CALL),
    ('<tool_call>{"name": "bash", "arguments": {}}', CallValidity.PARSE_ERROR),  # never closed
    ('</tool_call><tool_call>{"name": "a", "arguments": {}}</tool_call>', CallValidity.PARSE_ERROR),
    ("<tool_call>{bad json}</tool_call>", CallValidity.PARSE_ERROR),
    ('<tool_call>["bash"]</tool_call>', CallValidity.PARSE_ERROR),
    ('<tool_call>{"name": "bash"}</tool_call>', CallValidity.PARSE_ERROR),  # no arguments
    ('<tool_call>{"name": "bash", "arguments": "ls"}</tool_call>', CallValidity.PARSE_ERROR),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', CallValidity.PARSE_ERROR),
    ('<tool_call>{"name": "a", "arguments": {}, "x": 1}</tool_call>', CallValidity.PARSE_ERROR),
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call> and then more', CallValidity.PARSE_ERROR),
    ('<tool_call><tool_call>{"name": "a", "arguments": {}}</tool_call>', CallValidity.PARSE_ERROR),
    ("stray </tool_call>", CallValidity.PARSE_ERROR),
])
def test_defects_have_their_kind(text: str, kind: CallValidity) -> None:
    turn = parse_tool_calls(text)
    assert turn.validity is kind
    assert turn.calls == []
    assert turn.error


def test_deep_nesting_and_huge_bodies_are_parse_errors_not_crashes() -> None:
    deep = '{"name": "a", "arguments": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}"
    assert parse_tool_calls(f"<tool_call>{deep}</tool_call>").validity is CallValidity.PARSE_ERROR
    nested = '{"name": "a", "arguments": {"x": ' + "[" * 40 + "]" * 40 + "}}"
    assert "nested" in parse_tool_calls(f"<tool_call>{nested}</tool_call>").error
    huge = json.dumps({"name": "a", "arguments": {"x": "y" * 300_000}})
    assert parse_tool_calls(f"<tool_call>{huge}</tool_call>").validity is CallValidity.PARSE_ERROR


def test_arguments_are_checked_against_the_schema() -> None:
    schema = TOOLS["write_file"].parameters
    assert check_arguments(schema, {"path": "a", "content": "b"}) == []
    problems = check_arguments(schema, {"path": 3, "extra": True})
    assert any("path: must be string" in p for p in problems)
    assert any("content: is required" in p for p in problems)
    assert any("extra: unknown argument" in p for p in problems)
    assert check_arguments({"type": "object", "properties": {"n": {"type": "integer"}}}, {"n": True})


def test_truncation_keeps_head_and_tail_with_a_marker() -> None:
    text = "START" + "x" * 10_000 + "END"
    cut, truncated = truncate(text, 500)
    assert truncated and len(cut) <= 500
    assert cut.startswith("START") and cut.endswith("END") and "characters truncated" in cut
    assert truncate("short", 500) == ("short", False)
