"""The evaluation config: episode budgets, retries, prices and the selection checklist (YAML).

`configs/eval.yaml` is the shipped default; `load_eval_settings(path)` validates a file and
reports every problem at once (`ConfigError`). Prices are matched to the model spec by the
longest key that is a prefix of it, so `openai:gpt-4o` prices `openai:gpt-4o@https://...`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from tidal.errors import ConfigError
from tidal.eval.index import IndexConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Price(_Section):
    """What one model costs: per million tokens for APIs, per hour of compute for local models."""

    input_per_mtok: float = Field(0.0, ge=0, description="currency per 1M prompt tokens")
    output_per_mtok: float = Field(0.0, ge=0, description="currency per 1M completion tokens")
    cpu_hour: float = Field(0.0, ge=0, description="currency per CPU-hour of generation (local models)")


class Budgets(_Section):
    """Per-episode budgets (agent.runner.AgentConfig)."""

    max_steps: int | None = Field(None, ge=1, le=10_000, description="model turns; null: each task's max_steps")
    max_tokens: int = Field(32768, ge=64, description="context tokens an episode may reach")
    max_new_tokens: int = Field(1024, ge=1, description="tokens per turn")
    wall_time_s: float = Field(600.0, gt=0, description="wall time of one episode (tests excluded)")
    max_observation_chars: int = Field(8000, ge=100, description="tool output shown to the model; longer is cut")


def _existing(value: Path | None, info: ValidationInfo, or_folder: bool = False) -> Path | None:
    """A path from the config, relative to the config file's folder (`base` in the validation
    context) or else to the working directory; it must exist now, not when the eval reaches it."""
    if value is None:
        return None
    base = (info.context or {}).get("base")
    path = value if value.is_absolute() or base is None else Path(base) / value
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    if not (path.is_file() or (or_folder and path.is_dir())):
        raise ValueError(f"{path} is not a file" + (" or a folder" if or_folder else ""))
    return path


class Retrieval(_Section):
    """The retrieval layer: the documents most relevant to each task's prompt (BM25)."""

    path: Path = Field(description="a text file (one document per paragraph) or a folder of text files")
    top_k: int = Field(3, ge=1, le=50, description="documents put in each prompt")
    max_chars: int = Field(2000, ge=100, description="of each document; longer is cut head and tail")

    @field_validator("path")
    @classmethod
    def _path_exists(cls, value: Path, info: ValidationInfo) -> Path:
        return _existing(value, info, or_folder=True) or value


class PromptLayers(_Section):
    """The layers of an agent episode's prompt, in this order: system, memory, task, retrieval
    (agent/context.py). Files are read when the eval starts; a missing one fails at load."""

    system: str | None = Field(None, description="the system layer; null: the built-in agent instructions")
    memory: str = Field("", description="standing notes given to every episode (text)")
    memory_file: Path | None = Field(None, description="a file whose text is appended to memory")
    retrieval: Retrieval | None = Field(None, description="documents retrieved into each prompt")

    @field_validator("memory_file")
    @classmethod
    def _file_exists(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return _existing(value, info)


class Observations(_Section):
    """How a long tool output is shown to the model (agent/context.py)."""

    head_fraction: float = Field(2 / 3, ge=0, le=1, description="share of the kept characters taken from the start")
    summarize_over_chars: int | None = Field(None, ge=100, description=(
        "summarise outputs longer than this with `summarizer` (null: only cut them to max_observation_chars)"))
    summarizer: str = Field("same", description="the model that summarises: same (the evaluated one) or a model spec")
    summary_max_tokens: int = Field(256, ge=16, description="tokens of a summary")
    summary_input_chars: int = Field(16000, ge=100, description="of the output the summariser reads (head and tail)")


class Context(_Section):
    """The context window (agent/window.py)."""

    context_length: int | None = Field(None, ge=64, description=(
        "the window the episodes get, in tokens; null: the model's own (max_position_embeddings)"))
    overflow: list[Literal["elide_observations", "drop_turns"]] = Field(default_factory=list, description=(
        "what frees room, in order, when a turn does not fit; empty: the episode ends context_exceeded"))


class Retries(_Section):
    """Infra errors (sandbox or endpoint down) are retried with exponential backoff."""

    attempts: int = Field(3, ge=1, le=20, description="tries per (task, epoch), the first included")
    backoff_s: float = Field(2.0, ge=0, description="wait before the first retry; doubles each time")
    backoff_max_s: float = Field(60.0, ge=0, description="longest wait between tries")


class Checklist(_Section):
    """Thresholds of the selection checklist; a null threshold leaves its item out."""

    non_inferiority_margin: float | None = Field(0.05, ge=0, le=1, description=(
        "a candidate passes when the lower 95% bound of (its pass rate - the baseline's) is above -margin"))
    cost_cap: float | None = Field(None, ge=0, description="highest mean cost per task")
    format_compliance_floor: float | None = Field(0.9, ge=0, le=1, description="lowest share of valid tool-call turns")
    pass_hat_k_floor: float | None = Field(None, ge=0, le=1, description="lowest pass^k (k = the epochs)")
    min_pass_rate: float | None = Field(None, ge=0, le=1, description="lowest pass rate")
    min_tokens_per_s: float | None = Field(None, gt=0, description="lowest mean output speed per task (tokens/s)")
    max_first_token_s: float | None = Field(None, gt=0, description="highest mean time to first token per task (s)")
    max_context_exceeded_rate: float | None = Field(None, ge=0, le=1, description=(
        "highest share of episodes that ended context_exceeded"))
    max_failed_call_rate: float | None = Field(None, ge=0, le=1, description=(
        "highest share of tool calls that ran and failed (non-zero exit, missing file)"))
    min_recovery_after_failure: float | None = Field(None, ge=0, le=1, description=(
        "lowest share of failed tool calls followed by a successful call in the same episode"))


class EvalSettings(_Section):
    backend: str = Field("bwrap", description="sandbox backend: bwrap, or unsafe_local for development")
    budgets: Budgets = Field(default_factory=Budgets)
    retries: Retries = Field(default_factory=Retries)
    temperature: float = Field(0.0, ge=0, le=2, description="sampling temperature (0 = greedy)")
    stop: list[str] = Field(default_factory=list, description=(
        "stop strings of a local model's turns and answers (a train run's held-out evaluation uses rollout.stop)"))
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the endpoint's key")
    request_timeout_s: float = Field(120.0, gt=0, description="one HTTP request to an endpoint")
    stream: bool = Field(False, description=(
        "stream endpoint replies (SSE) to measure time to first token; the endpoint must support stream=true"))
    prices: dict[str, Price] = Field(default_factory=dict, description="model spec prefix -> price")
    checklist: Checklist = Field(default_factory=Checklist)
    index: IndexConfig = Field(default_factory=IndexConfig, description="intelligence index: categories, weights, bootstrap")
    prompt: PromptLayers = Field(default_factory=PromptLayers)
    observations: Observations = Field(default_factory=Observations)
    context: Context = Field(default_factory=Context)

    def price(self, model: str) -> Price:
        keys = [k for k in self.prices if model.startswith(k)]
        return self.prices[max(keys, key=len)] if keys else Price()


def with_flag_sampling(settings: EvalSettings, temperature: float | None, max_new_tokens: int | None) -> EvalSettings:
    """`settings` with `tidal eval --temperature/--max-new-tokens` over the config's values."""
    if temperature is not None:
        settings = settings.model_copy(update={"temperature": temperature})
    if max_new_tokens is not None:
        budgets = settings.budgets.model_copy(update={"max_new_tokens": max_new_tokens})
        settings = settings.model_copy(update={"budgets": budgets})
    return settings


def load_eval_settings(path: str | Path | None) -> EvalSettings:
    """The settings in `path` (YAML), or the defaults when None."""
    if path is None:
        return EvalSettings()
    path = Path(path)
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError([f"cannot read: {error}"], source=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError(["(root): an eval config is a mapping"], source=str(path))
    try:
        return EvalSettings.model_validate(data, context={"base": path.parent})
    except ValidationError as error:
        from tidal.config.load import format_validation_error

        raise ConfigError(format_validation_error(error, EvalSettings), source=str(path)) from None
