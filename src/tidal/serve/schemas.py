"""OpenAI request bodies, validated strictly, and the server's limits and error type.

Requests are pydantic models with `extra="forbid"` and strict types, so a misspelt or mistyped field
is a 400 naming the field instead of being silently ignored. Parameters the engine cannot honour
are accepted only at their neutral value (e.g. `presence_penalty: 0`); purely informational ones
(`user`, `metadata`, ...) are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ApiError(Exception):
    """An error answered to the client in OpenAI's shape: `{"error": {message, type, param, code}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ServeLimits:
    """What one request may ask for, and how much work may wait: these bound the server's memory."""

    max_body_bytes: int = 1 << 20  # larger request bodies get 413
    max_prompt_tokens: int = 4096  # also capped by the model's context length
    max_tokens: int = 1024  # largest max_tokens a request may set
    default_max_tokens: int = 256  # when the request sets none (capped by the context left)
    max_n: int = 16  # completions per prompt
    max_prompts: int = 16  # prompts in one /v1/completions request
    max_batch: int = 32  # rows (prompts x n) per engine call; one request may use at most this many
    max_queue: int = 64  # requests waiting for the engine; more get 503

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 1:
                raise ValueError(f"serve limit {name}={value} must be >= 1")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionSpec(BaseModel):
    """An OpenAI function tool's declaration (extra keys are kept and shown to the model)."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields shared by chat and text completions."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(1 << 63), lt=1 << 64)  # what torch.Generator.manual_seed takes
    # Accepted and ignored: they change nothing about the answer.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # Accepted only at their neutral value (checked in `neutral_only`).
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def stop_list(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4:
            raise ApiError(400, "at most 4 stop sequences", param="stop")
        if any(not s for s in stops):
            raise ApiError(400, "stop sequences must not be empty", param="stop")
        return stops


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    # vLLM's extensions, for token-in/token-out clients (the HTTP rollout engine): each choice's
    # `token_ids` and `prompt_token_ids`, with logprobs covering every id in `token_ids` (a final
    # eos too); tokens in the logprobs as 'token_id:<id>'; logprobs of the prompt's tokens.
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)


def parse_request(model: type[_Sampling], body: Any) -> Any:
    """`body` (decoded JSON) as `model`, or an ApiError(400) naming the first bad field."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        request = model.model_validate(body)
    except ValidationError as error:
        raise _from_validation(error) from None
    neutral_only(request)
    return request


def _from_validation(error: ValidationError) -> ApiError:
    problems = error.errors(include_url=False)
    first = problems[0]
    param = ".".join(str(part) for part in first["loc"]) or None
    if first["type"] == "extra_forbidden":
        return ApiError(400, f"Unrecognized request argument supplied: {param}", param=param)
    if first["type"] == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'", param=param)
    details = "; ".join(f"{'.'.join(str(p) for p in item['loc'])}: {item['msg']}" for item in problems[:5])
    return ApiError(400, f"Invalid request: {details}", param=param)


def neutral_only(request: _Sampling) -> None:
    """Reject parameters the engine cannot honour unless they are at their no-op value."""
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(request, name) not in (None, 0, 0.0):
            raise ApiError(400, f"{name} is not supported by this server (only 0)", param=name)
    if request.logit_bias:
        raise ApiError(400, "logit_bias is not supported by this server", param="logit_bias")
    if isinstance(request, ChatRequest):
        if request.response_format not in (None, {"type": "text"}):
            raise ApiError(400, "response_format is not supported (only {'type': 'text'})", param="response_format")
        if request.top_logprobs and not request.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    if isinstance(request, CompletionRequest):
        if request.echo:
            raise ApiError(400, "echo is not supported by this server", param="echo")
        if request.suffix:
            raise ApiError(400, "suffix is not supported by this server", param="suffix")
        if request.best_of not in (None, request.n):
            raise ApiError(400, "best_of is not supported (only best_of == n)", param="best_of")
        if request.stream and (request.return_token_ids or request.prompt_logprobs is not None):
            param = "return_token_ids" if request.return_token_ids else "prompt_logprobs"
            raise ApiError(400, f"{param} is not supported with stream: true on this server", param=param)
