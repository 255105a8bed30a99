"""The one outcome taxonomy of evaluation: verifier verdicts of single answers, malformed agent
episodes (format_error) and over-long prompts (context_exceeded), on real verifiers and sandboxes."""

from __future__ import annotations

from typing import Any

import pytest

from tidal.agent import AgentOutcome, ScriptedPolicy, format_tool_call, run_episode
from tidal.agent.protocol import Turn
from tidal.errors import EndpointRequestError, SandboxUnavailableError
from tidal.eval.answers import answer_task, judge
from tidal.reward.scorer import Scorer
from tidal.sandbox import get_backend
from tidal.sandbox.base import SandboxBackend
from tidal.types import Outcome, Score, Task

TEST = "def test_out():\n    assert open('out.txt').read().strip() == 'hello'\n"


@pytest.fixture(scope="module")
def bwrap() -> SandboxBackend:
    try:
        return get_backend("bwrap")
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")


def _math(answer: str = "42") -> Task:
    return Task(id="math/q", domain="math", prompt="6 * 7?", verifier={"name": "math", "answer": answer})


def _code() -> Task:
    return Task(id="code/add", domain="code", prompt="Write add(a, b).", verifier={"name": "python_tests"},
                tests={"test_add.py": "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"})


@pytest.mark.parametrize(("task", "answer", "outcome"), [
    (_math(), "so the answer is \\boxed{42}", AgentOutcome.PASS),
    (_math(), "the answer is 41", AgentOutcome.FAIL),
    (_math(), "I do not know, sorry.", AgentOutcome.FORMAT_ERROR),
    (_math(), "   ", AgentOutcome.FORMAT_ERROR),
    (_math(""), "42", AgentOutcome.VERIFIER_ERROR),  # the task has no usable answer: not the model's
    (_code(), "```python\ndef add(a, b):\n    return a + b\n```", AgentOutcome.PASS),
    (_code(), "```python\ndef add(a, b):\n    return a - b\n```", AgentOutcome.FAIL),
])
def test_single_answers_are_judged_into_the_taxonomy(bwrap: SandboxBackend, task: Task, answer: str,
                                                      outcome: AgentOutcome) -> None:
    with Scorer(backend=bwrap) as scorer:
        score = scorer.score(task, answer)
    assert judge(score) is outcome, score.detail


def test_infra_errors_stay_apart_from_task_problems() -> None:
    assert judge(Score(0.0, Outcome.INFRA_ERROR, detail="sandbox unavailable")) is AgentOutcome.INFRA_ERROR
    assert judge(Score(0.0, Outcome.TIMEOUT, detail="ran 10 s")) is AgentOutcome.FAIL


def test_malformed_tool_calls_end_an_episode_in_format_error(bwrap: SandboxBackend) -> None:
    task = Task(id="agent/hello", domain="agent", prompt="Write hello into out.txt", verifier={"name": "python_tests"},
                tests={"test_out.py": TEST}, max_steps=3)
    broken = ScriptedPolicy(['<tool_call>{"name": "bash", "arguments": {"command": </tool_call>'] * 3)
    result = run_episode(task, broken, bwrap)
    assert result.outcome is AgentOutcome.FORMAT_ERROR and {s.validity for s in result.steps} == {"parse_error"}
    # One valid call among the malformed ones: the model could use the tools, it just did not finish.
    mixed = ScriptedPolicy(['<tool_call>{"name"', format_tool_call("bash", {"command": "echo hi"}), "<tool_call>x"])
    assert run_episode(task, mixed, bwrap).outcome is AgentOutcome.STEP_LIMIT
    # Turns that call nothing at all are not malformed: the model gave up, within the format.
    assert run_episode(task, ScriptedPolicy(["I cannot"] * 3), bwrap).outcome is AgentOutcome.STEP_LIMIT


class _RefusingConversation:
    """An endpoint conversation whose server refuses the prompt, as tidal serve does when it is long."""

    context_tokens = 0

    def __init__(self, message: str) -> None:
        self.message = message

    def generate(self, max_new_tokens: int) -> Turn:
        raise EndpointRequestError(self.message, "http://127.0.0.1:1/v1", 400)

    def observe(self, turn: Turn, results: list[str]) -> None:
        raise AssertionError("a refused turn is never answered")

    def trace(self) -> dict[str, Any]:
        return {}


class _RefusingPolicy:
    name = "refusing"

    def __init__(self, message: str) -> None:
        self.message = message

    def start(self, task: Task, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
              seed: int = 0) -> _RefusingConversation:
        return _RefusingConversation(self.message)


def test_context_refusals_and_long_prompts_are_context_exceeded() -> None:
    never = lambda items: pytest.fail("nothing is scored when nothing was generated")
    refused = answer_task(_RefusingPolicy("HTTP 400: context_length_exceeded: the prompt has 900 tokens"), _math(),
                          never, seed=0, max_new_tokens=8, window=None)
    assert refused.outcome is AgentOutcome.CONTEXT_EXCEEDED and refused.reward == 0.0
    other = answer_task(_RefusingPolicy("HTTP 400: unsupported parameter 'seed'"), _math(), never, seed=0,
                        max_new_tokens=8, window=None)
    assert other.outcome is AgentOutcome.AGENT_ERROR
    # A prompt at the window is not generated at all (scripted "tokens" are characters).
    long = Task(id="math/long", domain="math", prompt="x" * 300 + " 6 * 7?", verifier={"name": "math", "answer": "42"})
    over = answer_task(ScriptedPolicy(["\\boxed{42}"]), long, never, seed=0, max_new_tokens=8, window=256)
    assert over.outcome is AgentOutcome.CONTEXT_EXCEEDED and over.tokens_out == 0 and "256" in over.detail
