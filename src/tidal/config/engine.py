"""`rollout.http`: the HTTP rollout engine's settings (rollout/http_engine.py), checked at load.
A section of its own file so that config/schema.py stays one screenful per idea; `RolloutConfig`
(schema.py) holds it."""

from __future__ import annotations

import os
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class HttpEngineConfig(BaseModel):
    """An external OpenAI-compatible server that generates the rollouts (`tidal serve`, vLLM):
    token-id prompts in, token ids and logprobs out, weights published through its reload
    endpoint (docs/design/serve.md, "The HTTP engine")."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    base_url: str = Field(description="the server's OpenAI base URL, e.g. http://gpu-node:8000/v1")
    model: str = Field(min_length=1, description="the model id the server serves (as its /v1/models lists it)")
    api_key_env: str | None = Field(
        None, min_length=1, description="environment variable holding the server's API key (sent as a bearer "
        "token); must be set when the config is loaded. None: no key"
    )
    timeout_s: float = Field(300.0, gt=0, le=86_400, description="seconds one generation request may take")
    reload_timeout_s: float = Field(600.0, gt=0, le=86_400, description="seconds one weight reload may take")
    max_concurrency: int = Field(8, ge=1, le=1024, description="requests in flight at once")
    prompts_per_request: int = Field(
        8, ge=1, le=4096, description="prompts sent in one /v1/completions request (each with its n samples); "
        "keep prompts x group_size within the server's batch limit (tidal serve: --max-batch)"
    )
    retries: int = Field(3, ge=0, le=100, description="retries of a request after a connection error, timeout, 429 or 5xx")
    backoff_s: float = Field(0.5, ge=0, le=60, description="wait before the first retry; doubled for each next one (at most 8x)")
    weight_transfer: Literal["upload", "disk"] = Field(
        "upload", description="how a publication reaches the server: upload (the safetensors bytes in the request "
        "body) | disk (a safetensors folder under weights_dir, which the server must see at the same path)"
    )
    weights_dir: str | None = Field(
        None, description="disk transfer: the folder publications are written to (None: <run folder>/published)"
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{value!r} is not an http(s) URL like http://host:8000/v1")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _key_is_set(cls, value: str | None) -> str | None:
        if value is not None and not os.environ.get(value):
            raise ValueError(f"the environment variable {value} is not set (it should hold the server's API key)")
        return value


class SpeculativeConfig(BaseModel):
    """`rollout.speculative`: speculative decoding inside the embedded engine's batch, drafting with
    no second model (rollout/speculative_batch.py; docs/design/speculative.md). Every emitted token
    keeps the policy's sampling distribution and carries its logprob."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    method: Literal["ngram", "suffix"] = Field(
        "ngram", description="ngram: prompt lookup of the longest earlier n-gram (n = max_n..min_n) | suffix: the "
        "longest earlier repeat of any length, in the row and in earlier completions"
    )
    k: int = Field(4, ge=1, le=64, description="draft tokens per row and engine step at most")
    max_n: int = Field(4, ge=1, le=64, description="ngram: longest n-gram looked up")
    min_n: int = Field(2, ge=1, le=64, description="ngram: shortest n-gram looked up")
    min_match: int = Field(2, ge=1, le=64, description="suffix: shortest repeat that drafts")
    learn: bool = Field(True, description="suffix: add each finished completion to the corpus drafts are matched in")

    @model_validator(mode="after")
    def _n_order(self) -> SpeculativeConfig:
        if self.min_n > self.max_n:
            raise ValueError(f"rollout.speculative: min_n={self.min_n} must be <= max_n={self.max_n}")
        return self
