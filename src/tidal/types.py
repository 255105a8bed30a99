"""The records that cross layers: `Task`, `Completion`, `Episode`, `Group`, `Score`, `TrainBatch`.

`Task` is the user-written format of ARCHITECTURE.md (pydantic, so a task file is validated with
field paths). The others are plain dataclasses produced and consumed inside a run.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Role = Literal["system", "user", "assistant", "tool"]
# The built-in domains; a task may name any other identifier (a plugin's `sql`, `finance`, ...).
BUILTIN_DOMAINS = ("code", "agent", "math", "knowledge", "reasoning", "general", "custom")
DOMAINS = BUILTIN_DOMAINS


def is_domain_name(name: str) -> bool:
    """A domain is named by a Python identifier (ASCII, not a keyword-like empty string)."""
    return isinstance(name, str) and name.isascii() and name.isidentifier()


class Message(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="forbid")
    role: Role
    content: str


class VerifierSpec(BaseModel):
    """Which verifier scores the task, plus its arguments (e.g. `answer`, `pattern`, `entrypoint`).

    Extra keys are kept and passed to the verifier, which validates them itself.
    """

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, description="registered verifier name, e.g. python_tests")

    @property
    def args(self) -> dict[str, Any]:
        """The verifier's arguments: every key but `name`."""
        return dict(self.model_extra or {})


class Limits(BaseModel):
    """Resource limits for scoring (and agent steps) in the sandbox."""

    model_config = ConfigDict(extra="forbid")
    timeout_s: float = Field(10.0, gt=0, le=3600, description="wall-clock limit per run")
    memory_mb: int = Field(512, ge=16, le=1 << 20, description="address-space/memory limit")
    pids: int = Field(64, ge=1, le=1 << 16, description="max processes inside the sandbox")
    cpus: float = Field(1.0, gt=0, le=1024, description="CPU bandwidth in cores (cgroup hosts)")
    disk_mb: int = Field(256, ge=1, le=1 << 20, description="workspace size (its own tmpfs on root hosts)")


class Task(BaseModel):
    """A verifiable task (ARCHITECTURE.md, 'A task')."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, description="unique and stable")
    domain: str = Field(description="an identifier: code | agent | math | knowledge | reasoning | general | custom, "
                        "or a domain of your own (sql, finance, ...)")
    prompt: str | list[Message] = Field(description="a string, or a list of chat messages")
    verifier: VerifierSpec
    tests: dict[str, str] = Field(default_factory=dict, description="acceptance tests, hidden")
    files: dict[str, str] = Field(default_factory=dict, description="starting workspace")
    reference: str | None = Field(None, description="known-good solution: code, answer or script")
    tools: list[str] = Field(default_factory=list)
    max_steps: int = Field(1, ge=1, le=10_000)
    limits: Limits = Field(default_factory=Limits)
    image: str = "python3"
    split: Literal["train", "eval"] = "train"
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("domain")
    @classmethod
    def _known_domain(cls, value: str) -> str:
        if not is_domain_name(value):
            raise ValueError(f"{value!r} is not a domain name: an identifier (letters, digits, _; e.g. "
                             f"{', '.join(BUILTIN_DOMAINS)}, or your own such as sql)")
        return value

    @field_validator("prompt")
    @classmethod
    def _nonempty_prompt(cls, value: str | list[Message]) -> str | list[Message]:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be empty")
        if isinstance(value, list) and not value:
            raise ValueError("must hold at least one message")
        return value

    def messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages."""
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return [m.model_dump() for m in self.prompt]

    @property
    def difficulty(self) -> int | None:
        """The generator's difficulty level (1 = easiest), when the task came from a family."""
        value = self.metadata.get("difficulty")
        return int(value) if value is not None else None


class Outcome(str, enum.Enum):
    """How a scoring run ended. Only `passed`/`failed` say something about the answer's quality."""

    PASSED = "passed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    CRASHED = "crashed"
    TAMPERED = "tampered"
    INFRA_ERROR = "infra_error"


@dataclass
class Score:
    """A verifier's verdict. `value` is in [0, 1]; an `infra_error` is never a silent 0 to train on."""

    value: float
    outcome: Outcome
    components: dict[str, float] = field(default_factory=dict)
    detail: str = ""  # human-readable reason, e.g. the failing test or the timeout
    info: dict[str, Any] = field(default_factory=dict)  # verifier-specific extras (test ids, ...)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reward": self.value,
            "outcome": self.outcome.value,
            "components": dict(self.components),
            "detail": self.detail,
            "info": dict(self.info),
        }


FinishReason = Literal["stop", "length"]


@dataclass
class Completion:
    """One sampled completion from a rollout engine."""

    prompt_ids: list[int]
    token_ids: list[int]  # generated tokens, including the stop token when one was produced
    logprobs: list[float]  # (len(token_ids),) log p of each generated token under the sampler
    text: str  # decoded completion, stop strings/tokens removed
    finish_reason: FinishReason
    weight_version: int
    # Multi-turn (agent) episodes: (len(token_ids),) 1 on tokens the model generated, 0 on the tool
    # results between its turns (their logprobs are 0 and they are never trained); None = all 1.
    loss_mask: list[int] | None = None
    # (len(token_ids),) 1 on the tokens of tool results (the observations appended after a turn);
    # None = all 0. Only recorded (the trajectory store's `tool_mask`), never trained on.
    tool_mask: list[int] | None = None
    # (len(token_ids),) the weight version each token was sampled under, when weights were updated
    # while it was generated (in-flight updates); None = every token under `weight_version`, which
    # is always the oldest of them.
    token_versions: list[int] | None = None

    def versions(self) -> list[int]:
        """(len(token_ids),) the weight version of each generated token."""
        return list(self.token_versions) if self.token_versions is not None else [self.weight_version] * len(self.token_ids)


@dataclass
class Episode:
    """A trajectory: one task, one completion, its score and the gate's verdict."""

    id: str  # stable: run/step/task/sample index
    task_id: str
    domain: str
    group_id: str  # samples of one prompt share a group (GRPO/RLOO baselines)
    completion: Completion
    score: Score | None = None
    keep: bool = True
    drop_reason: str = ""
    advantage: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    # The reward to train on when it differs from score.value (e.g. normalised by the loop);
    # None = score.value. See tidal.algos.advantages.episode_reward.
    reward: float | None = None
    difficulty: float | None = None  # the task's difficulty level when it has one (metrics only)

    def to_record(self) -> dict[str, Any]:
        """A JSON-serialisable record for the trajectory store."""
        c = self.completion
        return {
            "id": self.id,
            "task_id": self.task_id,
            "domain": self.domain,
            "group_id": self.group_id,
            "prompt_ids": c.prompt_ids,
            "token_ids": c.token_ids,
            "logprobs": c.logprobs,
            "loss_mask": c.loss_mask if c.loss_mask is not None else [1] * len(c.token_ids),
            "tool_mask": c.tool_mask if c.tool_mask is not None else [0] * len(c.token_ids),
            "text": c.text,
            "finish_reason": c.finish_reason,
            "weight_version": c.weight_version,
            "score": self.score.to_dict() if self.score else None,
            "keep": self.keep,
            "drop_reason": self.drop_reason,
            "advantage": self.advantage,
            "timings": self.timings,
        }


@dataclass
class Group:
    """One task's samples in one step, from sampling to the update: the task, its completions (as
    episodes, in sample order) and, once scored, their rewards. GRPO-style baselines are taken
    within a group; `position` is the task's index in its step's batch."""

    task: Task
    position: int
    episodes: list[Episode]

    @property
    def id(self) -> str:
        """The stable id its episodes carry as `group_id` (stored with each trajectory)."""
        return self.episodes[0].group_id if self.episodes else f"{self.task.id}/g{self.position:03d}"

    @property
    def kept(self) -> list[Episode]:
        """The episodes the gate let through."""
        return [e for e in self.episodes if e.keep]


def regroup(episodes: list[Episode], tasks: dict[str, Task]) -> list[Group]:
    """Episodes made elsewhere (read back from a store, built by hand) as `Group`s: one per
    `group_id`, in order of first appearance, each with its task from `tasks` (by task id)."""
    members: dict[str, list[Episode]] = {}
    for episode in episodes:
        members.setdefault(episode.group_id, []).append(episode)
    return [Group(tasks[group[0].task_id], position, group) for position, group in enumerate(members.values())]


def flatten(groups: list[Group]) -> list[Episode]:
    """The episodes of `groups`, in group order."""
    return [episode for group in groups for episode in group.episodes]


@dataclass
class TrainBatch:
    """Padded tensors for one update. B = sequences, T = prompt + completion length (right-padded)."""

    input_ids: Any  # Tensor (B, T) long
    attention_mask: Any  # Tensor (B, T) long, 1 for real tokens
    completion_mask: Any  # Tensor (B, T) float, 1 on tokens whose logprob is trained
    old_logprobs: Any  # Tensor (B, T) float, sampler logprobs aligned with completion_mask
    advantages: Any  # Tensor (B,) float, one per sequence; or (B, T) per token
    ref_logprobs: Any | None = None  # Tensor (B, T) float, when a KL term is used
    rewards: Any | None = None  # Tensor (B,) float, each sequence's reward, NaN when it has none (for gae)
    prompt_lengths: Any | None = None  # Tensor (B,) long, where each row's completion starts (shared-prompt training)


def is_multi_turn(task: Task) -> bool:
    """Whether a task is an agent episode (tools, or more than one step) rather than one answer."""
    return task.domain == "agent" or bool(task.tools) or task.max_steps > 1
