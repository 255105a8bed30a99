"""The episode runner in a real bwrap session: malformed calls are scored, budgets end episodes,
the acceptance tests judge the workspace the agent left."""

from __future__ import annotations

from tidal.agent import (
    AgentConfig,
    AgentOutcome,
    OraclePolicy,
    ScriptedPolicy,
    Termination,
    format_tool_call,
    run_episode,
)
from tidal.sandbox.base import SandboxBackend
from tidal.types import Task

TEST = "def test_out():\n    assert open('out.txt').read().strip() == 'hello'\n"


def _task(**extra: object) -> Task:
    fields = {"id": "agent/hello", "domain": "agent", "prompt": "Write hello into out.txt",
              "verifier": {"name": "python_tests"}, "tests": {"test_out.py": TEST},
              "reference": "echo hello > out.txt", "max_steps": 8, "files": {"in.txt": "hi\n"}}
    fields.update(extra)
    return Task.model_validate(fields)


def test_malformed_calls_are_scored_and_recovery_is_recorded(bwrap: SandboxBackend) -> None:
    policy = ScriptedPolicy([
        "Thinking.<tool_call>{not json</tool_call>",
        format_tool_call("write_file", {"path": "out.txt", "content": "hello\n"}),  # recovers
        format_tool_call("rm_rf", {}),
        format_tool_call("bash", {"cmd": "ls"}),
        "no call at all",
        format_tool_call("read_file", {"path": "/workspace/in.txt"}),
        format_tool_call("submit", {"answer": "done"}),
    ])
    result = run_episode(_task(), policy, bwrap)
    assert result.outcome is AgentOutcome.PASS and result.termination is Termination.SUBMITTED
    assert result.answer == "done"
    kinds = [s.validity for s in result.steps]
    assert kinds == ["parse_error", "valid", "unknown_tool", "invalid_arguments", "no_call", "valid", "valid"]
    assert [s.recovered for s in result.steps] == [True, None, False, False, True, None, None]
    assert result.steps[5].calls[0].ok
    # The model was told what was wrong (as the user: a malformed turn has no call to answer; a
    # well-formed call with bad arguments is answered as a call), and read the file it asked for.
    messages = result.trace["messages"]
    assert any("parse_error" in m["content"] for m in messages if m["role"] == "user")
    assert any("unknown_tool" in m["content"] for m in messages if m["role"] == "user")
    assert any("invalid_arguments" in m["content"] for m in messages if m["role"] == "tool")
    assert any(m["content"] == "hi\n" for m in messages if m["role"] == "tool")
    totals = result.totals()
    assert totals["calls_invalid"] == 4 and totals["recoveries"] == 2 and totals["failures_followed"] == 4


def test_a_model_that_never_calls_a_tool_hits_the_step_limit(bwrap: SandboxBackend) -> None:
    result = run_episode(_task(max_steps=3), ScriptedPolicy(["I cannot"] * 5), bwrap)
    assert result.termination is Termination.STEP_LIMIT
    assert result.outcome is AgentOutcome.STEP_LIMIT
    assert len(result.steps) == 3 and all(s.validity == "no_call" for s in result.steps)
    assert result.score is not None and result.score.value == 0.0


def test_work_done_without_submit_still_passes(bwrap: SandboxBackend) -> None:
    policy = ScriptedPolicy([format_tool_call("bash", {"command": "echo hello > out.txt"})])
    result = run_episode(_task(max_steps=2), policy, bwrap)
    assert result.termination is Termination.STEP_LIMIT and result.outcome is AgentOutcome.PASS


def test_token_budget_ends_the_episode(bwrap: SandboxBackend) -> None:
    config = AgentConfig()
    opening = sum(len(m["content"]) for m in config.context.messages(_task()))
    config.max_tokens = opening + 4000  # a scripted token is a character; the tools add ~1500
    result = run_episode(_task(), ScriptedPolicy(["x" * 400] * 10), bwrap, config)
    assert result.termination is Termination.TOKEN_LIMIT
    assert result.outcome is AgentOutcome.CONTEXT_EXCEEDED
    assert 0 < len(result.steps) < 8


def test_long_tool_output_is_truncated_for_the_model(bwrap: SandboxBackend) -> None:
    policy = ScriptedPolicy([format_tool_call("python", {"code": "print('a' * 20000)"}), format_tool_call("submit", {})])
    config = AgentConfig()
    config.context.max_observation_chars = 300
    result = run_episode(_task(), policy, bwrap, config)
    call = result.steps[0].calls[0]
    assert call.truncated and call.output_chars > 20000
    observed = next(m["content"] for m in result.trace["messages"] if m["role"] == "tool")
    assert len(observed) <= 300 and "truncated" in observed


def test_tampering_with_the_tests_fails(bwrap: SandboxBackend) -> None:
    conftest = "import pytest\n@pytest.hookimpl(tryfirst=True)\ndef pytest_runtest_call(item):\n    return True\n"
    policy = ScriptedPolicy([format_tool_call("write_file", {"path": "conftest.py", "content": conftest}),
                             format_tool_call("submit", {})])
    result = run_episode(_task(), policy, bwrap)
    assert result.outcome is AgentOutcome.FAIL
    assert result.score is not None and result.score.outcome.value in ("tampered", "failed")


def test_a_task_naming_an_unknown_tool_is_a_verifier_error_not_a_model_failure(bwrap: SandboxBackend) -> None:
    result = run_episode(_task(tools=["bash", "teleport"]), OraclePolicy(), bwrap)
    assert result.outcome is AgentOutcome.VERIFIER_ERROR and "teleport" in result.detail
    assert result.reward is None
