"""What an episode produces: per-step records and the episode's result, with its typed outcome."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from tidal.types import Score


class AgentOutcome(str, enum.Enum):
    """How an evaluated episode or single answer ended: the one taxonomy of evaluation (the eval
    harness and a train run's held-out evaluation). Every outcome but infra and verifier errors
    says something about the model and counts as a failure unless it is `pass`."""

    PASS = "pass"  # the acceptance tests (an answer: its verifier) passed
    FAIL = "fail"  # they did not (the agent submitted, or tampered with the tests; a wrong answer)
    FORMAT_ERROR = "format_error"  # nothing to judge in the required form: no valid tool-call turn
    # among malformed ones in an episode, or an answer without a final answer / code block
    STEP_LIMIT = "step_limit"  # the step budget ran out and the tests did not pass
    CONTEXT_EXCEEDED = "context_exceeded"  # the prompt or history outgrew the context window
    TIMEOUT = "timeout"  # the wall-time budget ran out and the tests did not pass
    AGENT_ERROR = "agent_error"  # the model's conversation could not go on (refused by the endpoint)
    INFRA_ERROR = "infra_error"  # the sandbox or the endpoint failed: retried, never a model failure
    VERIFIER_ERROR = "verifier_error"  # the task's tests could not judge (a broken task)


MODEL_OUTCOMES = (AgentOutcome.PASS, AgentOutcome.FAIL, AgentOutcome.FORMAT_ERROR, AgentOutcome.STEP_LIMIT,
                  AgentOutcome.CONTEXT_EXCEEDED, AgentOutcome.TIMEOUT, AgentOutcome.AGENT_ERROR)


class Termination(str, enum.Enum):
    """Why the episode loop stopped (before the acceptance tests ran)."""

    SUBMITTED = "submitted"
    STEP_LIMIT = "step_limit"
    TOKEN_LIMIT = "token_limit"
    TIMEOUT = "timeout"
    AGENT_ERROR = "agent_error"
    INFRA_ERROR = "infra_error"
    TASK_ERROR = "task_error"  # the task names a tool that does not exist


@dataclass
class CallRecord:
    """One tool call of a step."""

    name: str
    arguments: str  # the JSON arguments, cut to a preview
    ok: bool  # the tool's own success (exit code 0, file found)
    tool_s: float
    output_chars: int  # before truncation
    truncated: bool
    summarized: bool = False  # the model read a summary of the output (context.Compression)


@dataclass
class StepRecord:
    """One model turn and the tools it ran. Times in seconds; overhead = step wall − generation − tools."""

    index: int
    tokens_in: int
    tokens_out: int
    generation_s: float
    tool_s: float
    overhead_s: float
    validity: str  # CallValidity value
    error: str = ""
    recovered: bool | None = None  # for an invalid turn: was the next turn valid (None: there was none)
    finish_reason: str = "stop"
    cpu_s: float = 0.0
    text: str = ""  # the model's turn, cut to a preview
    calls: list[CallRecord] = field(default_factory=list)
    first_token_s: float | None = None  # time to first token (Turn.first_token_s); None: not measured
    context_changes: list[str] = field(default_factory=list)  # what the overflow strategy freed before it


@dataclass
class AgentResult:
    """One episode: its steps, how it stopped, the acceptance verdict and the outcome."""

    task_id: str
    domain: str
    termination: Termination
    outcome: AgentOutcome
    steps: list[StepRecord]
    score: Score | None
    detail: str = ""
    wall_s: float = 0.0
    acceptance_s: float = 0.0
    answer: str | None = None
    trace: dict[str, Any] = field(default_factory=dict)

    @property
    def reward(self) -> float | None:
        """The acceptance score to train on; None for outcomes that say nothing about the model."""
        if self.outcome in (AgentOutcome.INFRA_ERROR, AgentOutcome.VERIFIER_ERROR) or self.score is None:
            return None
        return self.score.value

    def totals(self) -> dict[str, float]:
        steps = self.steps
        return {
            "steps": len(steps),
            "tokens_in": sum(s.tokens_in for s in steps),
            "tokens_out": sum(s.tokens_out for s in steps),
            "generation_s": sum(s.generation_s for s in steps),
            "tool_s": sum(s.tool_s for s in steps),
            "overhead_s": sum(s.overhead_s for s in steps),
            "cpu_s": sum(s.cpu_s for s in steps),
            "calls_valid": sum(s.validity == "valid" for s in steps),
            "calls_invalid": sum(s.validity != "valid" for s in steps),
            "failures_followed": sum(s.recovered is not None for s in steps),
            "recoveries": sum(bool(s.recovered) for s in steps),
        }

    def to_record(self, with_trace: bool = True) -> dict[str, Any]:
        record: dict[str, Any] = {
            "task_id": self.task_id, "domain": self.domain, "termination": self.termination.value,
            "outcome": self.outcome.value, "detail": self.detail, "wall_s": self.wall_s,
            "acceptance_s": self.acceptance_s, "answer": self.answer,
            "score": self.score.to_dict() if self.score else None,
            "totals": self.totals(), "steps": [asdict(s) for s in self.steps],
        }
        if with_trace:
            record["trace"] = self.trace
        return record
