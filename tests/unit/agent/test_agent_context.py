"""Context management: the window rule and overflow steps, layered prompts, BM25 retrieval, and
compression of long tool output (cut with a marker, or summarised by a model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.agent.context import ContextPolicy, truncate
from tidal.agent.policy import ScriptedPolicy
from tidal.agent.records import AgentOutcome
from tidal.agent.retrieval import DocumentIndex
from tidal.agent.runner import AgentConfig, run_episode
from tidal.agent.toolcall import format_tool_call
from tidal.agent.tools import get_tools, tool_schemas
from tidal.agent.window import fits, shrink
from tidal.errors import ConfigError
from tidal.eval.layers import agent_config
from tidal.eval.settings import load_eval_settings
from tidal.sandbox.base import SandboxBackend
from tidal.types import Task


def test_the_window_rule_is_the_servers() -> None:
    # serve/app.py: refuse when the prompt leaves no room, or prompt + max_tokens is over the window.
    assert fits(100, 28, 128) and not fits(100, 29, 128) and not fits(128, 1, 128) and fits(10**6, 10, None)


def test_overflow_steps_elide_oldest_observations_then_drop_oldest_turns() -> None:
    opening = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    messages = [*opening, {"role": "assistant", "content": "a1"}, {"role": "tool", "content": "x" * 500},
                {"role": "assistant", "content": "a2"}, {"role": "user", "content": "y" * 300}]
    strategy = ("elide_observations", "drop_turns")
    assert "message 3" in (shrink(messages, 2, strategy) or "")
    assert messages[3]["content"] == "[earlier tool output elided: 500 characters]"
    assert "message 5" in (shrink(messages, 2, strategy) or "")
    assert "dropped 2" in (shrink(messages, 2, strategy) or "")  # a1 and its answer
    assert messages[2]["content"] == "a2"
    assert shrink(messages, 2, strategy) is not None and messages == opening
    assert shrink(messages, 2, strategy) is None  # nothing left: the episode ends context_exceeded
    assert shrink(list(opening), 2, ()) is None


def test_a_turn_that_does_not_fit_ends_context_exceeded_or_frees_room(bwrap: SandboxBackend) -> None:
    task = Task(id="w", domain="agent", prompt="write hello", verifier={"name": "python_tests"},
                tests={"test_x.py": "def test_x():\n    assert False\n"}, tools=["bash"], max_steps=3)
    policy = ScriptedPolicy([format_tool_call("bash", {"command": "seq 1 400"})] * 3)
    start = policy.start(task, ContextPolicy().messages(task), tool_schemas(get_tools(task.tools))).context_tokens
    # A scripted token is a character: the window holds the opening and one turn, not the output.
    window = start + 300
    strict = run_episode(task, policy, bwrap, AgentConfig(max_new_tokens=100, context_window=window))
    assert strict.outcome is AgentOutcome.CONTEXT_EXCEEDED and len(strict.steps) == 1
    freeing = AgentConfig(max_new_tokens=100, context_window=window,
                          context=ContextPolicy(overflow=("elide_observations", "drop_turns")))
    freed = run_episode(task, policy, bwrap, freeing)
    assert freed.outcome is AgentOutcome.STEP_LIMIT and len(freed.steps) == 3
    assert any(step.context_changes for step in freed.steps)


def test_layers_render_in_order_with_markers(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "csv.md").write_text("To sum a CSV column use awk -F, '{s+=$2} END {print s}'.")
    (docs / "git.md").write_text("Commit often with git commit -am.")
    index = DocumentIndex.load(docs)
    assert [d.name for d in index.search("sum the second CSV column", 2)] == ["csv.md"]
    policy = ContextPolicy(system="SYS", memory="the repo uses tabs", retrieval=index, retrieval_k=2)
    task = Task(id="t", domain="agent", prompt="Sum the CSV column", verifier={"name": "python_tests"},
                files={"data.csv": "a,1\n"}, tools=["bash"], max_steps=2)
    system, user = policy.messages(task)
    assert system == {"role": "system", "content": "SYS"}
    text = user["content"]
    assert text.index("## Memory\nthe repo uses tabs") < text.index("## Task\nSum the CSV column") \
        < text.index("Files in the workspace: data.csv.") < text.index("## Retrieved documents\n### [1] csv.md")
    assert "git.md" not in text
    plain = ContextPolicy().messages(task)[1]["content"]
    assert plain == "Sum the CSV column\n\nFiles in the workspace: data.csv."  # no other layer: no markers


def test_layers_come_from_the_eval_config_and_missing_files_fail_at_load(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("Never delete data.csv.")
    (tmp_path / "docs.txt").write_text("awk sums columns.\n\nsed edits streams.")
    config = tmp_path / "eval.yaml"
    config.write_text("prompt:\n  system: Be brief.\n  memory: Tabs, not spaces.\n  memory_file: notes.md\n"
                      "  retrieval: {path: docs.txt, top_k: 1}\n"
                      "observations: {head_fraction: 0.5}\ncontext: {overflow: [drop_turns]}\n")
    agent = agent_config(load_eval_settings(config))
    task = Task(id="t", domain="agent", prompt="use awk", verifier={"name": "python_tests"}, tools=["bash"],
                max_steps=2)
    system, user = agent.context.messages(task)
    assert system["content"] == "Be brief."
    assert "## Memory\nTabs, not spaces.\n\nNever delete data.csv." in user["content"]
    assert "### [1] docs.txt#1\nawk sums columns." in user["content"] and "sed" not in user["content"]
    assert agent.context.overflow == ("drop_turns",) and agent.context.head_fraction == 0.5
    config.write_text("prompt:\n  memory_file: gone.md\n  retrieval: {path: nowhere}\n"
                      "context: {overflow: [forget]}\n")
    with pytest.raises(ConfigError) as caught:
        load_eval_settings(config)
    text = str(caught.value)
    assert f"prompt.memory_file: {tmp_path / 'gone.md'} does not exist" in text
    assert f"prompt.retrieval.path: {tmp_path / 'nowhere'} does not exist" in text and "context.overflow.0" in text


def test_long_output_is_cut_by_ratio_with_a_marker_or_summarised(bwrap: SandboxBackend) -> None:
    text = "".join(f"line {i}\n" for i in range(1000))
    cut, was_cut = truncate(text, 400, head_fraction=0.25)
    assert was_cut and len(cut) <= 400 and cut.startswith("line 0\n") and cut.endswith("line 999\n")
    marker = cut[cut.index("[..."):cut.index("...]") + 4]
    head = cut[:cut.index("\n[...")]
    assert int(marker.split()[1]) == len(text) - (len(cut) - len(marker) - 2)
    assert len(head) < (len(cut) - len(head)) / 2  # a quarter of the room at the head
    seen: list[str] = []

    def summarize(output: str) -> str:
        seen.append(output)
        return "1000 numbered lines, 0 to 999"

    task = Task(id="s", domain="agent", prompt="count", verifier={"name": "python_tests"},
                tests={"test_x.py": "def test_x():\n    assert False\n"}, tools=["bash"], max_steps=1)
    policy = ScriptedPolicy([format_tool_call("bash", {"command": "seq 0 999 | sed 's/^/line /'"})])
    context = ContextPolicy(summarizer=summarize, summarize_over_chars=1000)
    result = run_episode(task, policy, bwrap, AgentConfig(context=context))
    (call,) = result.steps[0].calls
    assert call.summarized and seen and seen[0].startswith("line 0\n")
    shown = result.trace["messages"][-1]["content"]
    assert shown.startswith("[summary of a ") and "1000 numbered lines" in shown


def test_the_summariser_is_a_fresh_single_turn_conversation_of_a_policy() -> None:
    from tidal.eval.layers import summarizer

    policy = ScriptedPolicy(outputs_for=lambda task: ["  3 files, one error: x.py line 2  "])
    summarize = summarizer(policy, max_tokens=64, input_chars=200)
    assert summarize("a" * 5000) == "3 files, one error: x.py line 2"
