"""Single-turn tasks in evaluation: one answer per sample, judged by the task's verifier, in the
one outcome taxonomy of evaluation (`AgentOutcome`, agent/records.py).

The eval harness (`tidal eval`, harness.py) and a train run's held-out evaluation (heldout.py)
both judge answers here, so the same model on the same tasks gets the same outcomes either way:

- the prompt is the task's messages as they are (no system layer, no tools), rendered by the
  model's chat template;
- a prompt of at least the model's context window (`context_window`) is `context_exceeded`, not
  generated;
- the answer is scored by `Scorer.score_many` (the verifier the task names) and `judge` maps the
  verifier's `Score` to the outcome: passed -> pass; a task the verifier cannot judge
  (`task_problem`) -> verifier_error; any other infra error -> infra_error; an answer with nothing
  to judge in the required form (`format_failed`: no final answer, no code block, empty) ->
  format_error; every other verdict (wrong, failing tests, timeout, crash, tampering) -> fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidal.agent.policy import Policy
from tidal.agent.records import AgentOutcome
from tidal.agent.runner import is_context_refusal
from tidal.errors import (
    EndpointAuthError,
    EndpointConfigError,
    EndpointRequestError,
    EndpointUnavailableError,
)
from tidal.reward.base import FORMAT_ERROR, TASK_PROBLEM
from tidal.types import Outcome, Score, Task

ScoreMany = Callable[[list[tuple[Task, str]]], list[Score]]


def judge(score: Score) -> AgentOutcome:
    """The evaluation outcome of a verifier's verdict on one answer (see the module docstring)."""
    if score.outcome is Outcome.PASSED:
        return AgentOutcome.PASS
    if score.outcome is Outcome.INFRA_ERROR:
        return AgentOutcome.VERIFIER_ERROR if score.info.get(TASK_PROBLEM) else AgentOutcome.INFRA_ERROR
    if score.info.get(FORMAT_ERROR):
        return AgentOutcome.FORMAT_ERROR
    return AgentOutcome.FAIL


def context_window(model: Any) -> int | None:
    """The context window of a local model (or of a policy or engine holding one), from its
    config's `max_position_embeddings` as `tidal serve` reads it; None when it is not known."""
    for name in ("engine", "model"):
        while hasattr(model, name) and not hasattr(model, "config"):
            model = getattr(model, name)
    value = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def over_window(prompt_tokens: int, window: int | None) -> bool:
    """Whether a prompt leaves no room for one generated token in the context window."""
    return window is not None and prompt_tokens >= window


@dataclass
class Answer:
    """One sampled answer to a single-turn task and its judgement."""

    outcome: AgentOutcome
    score: Score | None  # None when nothing was scored (context exceeded, endpoint failure)
    text: str
    detail: str
    tokens_in: int
    tokens_out: int
    generation_s: float
    cpu_s: float
    finish_reason: str
    wall_s: float
    first_token_s: float | None = None  # Turn.first_token_s; None: not measured

    @property
    def reward(self) -> float | None:
        if self.outcome in (AgentOutcome.INFRA_ERROR, AgentOutcome.VERIFIER_ERROR):
            return None
        return self.score.value if self.score is not None else 0.0


def answer_task(policy: Policy, task: Task, score_many: ScoreMany, *, seed: int, max_new_tokens: int,
                window: int | None) -> Answer:
    """Sample one answer to `task` from `policy` and judge it. EndpointAuthError and
    EndpointConfigError propagate (no later answer would work either)."""
    started = time.monotonic()
    conversation = policy.start(task, task.messages(), [], seed=seed)
    prompt_tokens = conversation.context_tokens

    def unscored(outcome: AgentOutcome, detail: str) -> Answer:
        return Answer(outcome, None, "", detail, prompt_tokens, 0, 0.0, 0.0, "", time.monotonic() - started)

    if over_window(prompt_tokens, window):
        return unscored(AgentOutcome.CONTEXT_EXCEEDED,
                        f"the prompt has {prompt_tokens} tokens; the model's context window is {window}")
    try:
        turn = conversation.generate(max_new_tokens)
    except (EndpointAuthError, EndpointConfigError):
        raise
    except EndpointUnavailableError as error:
        return unscored(AgentOutcome.INFRA_ERROR, str(error))
    except EndpointRequestError as error:
        return unscored(AgentOutcome.CONTEXT_EXCEEDED if is_context_refusal(error) else AgentOutcome.AGENT_ERROR,
                        str(error))
    (score,) = score_many([(task, turn.text)])
    outcome = judge(score)
    return Answer(outcome, score, turn.text, "" if outcome is AgentOutcome.PASS else score.detail, turn.tokens_in,
                  turn.tokens_out, turn.generation_s, turn.cpu_s, turn.finish_reason, time.monotonic() - started,
                  turn.first_token_s)
