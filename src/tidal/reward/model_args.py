"""The arguments of the model-scored verifiers (`llm_judge`, `reward_model`), parsed and checked.

Both verifiers read them from `task.verifier.args` (a task file, or a domain's
`verifiers: [{name: llm_judge, args: {...}}]`). The config checks a domain's at load
(`DomainVerifier`), so a bad endpoint or a missing rubric stops a run before any sampling; the
verifiers check them again per task and report a bad one as a task problem, never as a 0.

This module imports nothing from tidal: the config tree calls it, and sits above the verifiers.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

ENDPOINT_SCHEMES = ("http", "https")
DEVICE_PREFIXES = ("auto", "cpu", "cuda", "mps")


class ModelArgsError(ValueError):
    """Arguments of a model verifier that cannot work; `problems` lists each `key: message`."""

    def __init__(self, verifier: str, problems: list[str]) -> None:
        self.verifier, self.problems = verifier, problems
        super().__init__(f"{verifier}: " + "; ".join(problems))


@dataclass(frozen=True)
class JudgeArgs:
    """An LLM judge: `endpoint` (an OpenAI-compatible base URL, `.../v1`), `model`, `rubric`,
    grades from `low` to `high` (the reward is the grade mapped onto [0, 1]; passed from
    `pass_at`), `api_key_env` (the environment variable holding the key; none: no key sent),
    `timeout_s` per request, `retries` after the first try with `backoff_s` doubling, and the
    on-disk `cache_dir` (none: `$TIDAL_JUDGE_CACHE`, else no disk cache)."""

    endpoint: str
    model: str
    rubric: str
    low: int = 0
    high: int = 10
    pass_at: float = 0.5
    api_key_env: str | None = None
    timeout_s: float = 30.0
    retries: int = 2
    backoff_s: float = 0.5
    max_tokens: int = 256
    cache_dir: str | None = None

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


@dataclass(frozen=True)
class RewardModelArgs:
    """A local Hugging Face reward model: `path` (a folder), `kind` (`classifier`: a sequence
    classification head, the reward is sigmoid of the logit, or softmax of label `label`;
    `rubric`: a causal LM asked whether the answer meets `rubric`, the reward is
    P(yes) / (P(yes) + P(no)) of its next token; `auto`: from the folder's architecture),
    `device` (auto | cpu | cuda[:N]), `batch_size`, `max_length` tokens (longer inputs keep their
    end), `pass_at`."""

    path: str
    kind: str = "auto"
    rubric: str | None = None
    device: str = "auto"
    batch_size: int = 8
    max_length: int = 1024
    label: int = -1
    yes: str = "yes"
    no: str = "no"
    pass_at: float = 0.5


def _number(args: dict[str, Any], key: str, default: float, problems: list[str], *, low: float, high: float,
            integer: bool = False) -> Any:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        problems.append(f"{key}: must be {'an integer' if integer else 'a number'}, got {value!r}")
        return default
    if not math.isfinite(value) or not low <= value <= high:
        problems.append(f"{key}: {value!r} is outside [{low}, {high}]")
        return default
    return value


def _text(args: dict[str, Any], key: str, problems: list[str], required: bool) -> str | None:
    value = args.get(key)
    if value is None:
        if required:
            problems.append(f"{key}: missing (a non-empty string)")
        return None
    if not isinstance(value, str) or not value.strip():
        problems.append(f"{key}: must be a non-empty string, got {value!r}")
        return None
    return value


def _unknown(args: dict[str, Any], known: type, problems: list[str]) -> None:
    names = set(known.__dataclass_fields__)  # type: ignore[attr-defined]
    for key in sorted(set(args) - names - {"final_answer"}):
        problems.append(f"{key}: unknown argument; known: {', '.join(sorted(names))}")


def parse_judge_args(args: dict[str, Any]) -> JudgeArgs:
    """`JudgeArgs` from a verifier's arguments; `ModelArgsError` lists every problem at once."""
    problems: list[str] = []
    _unknown(args, JudgeArgs, problems)
    endpoint = _text(args, "endpoint", problems, True) or ""
    if endpoint:
        parts = urlsplit(endpoint)
        if parts.scheme not in ENDPOINT_SCHEMES:
            problems.append(f"endpoint: unknown scheme {parts.scheme or '(none)'!r} in {endpoint!r}; use "
                            f"{' or '.join(ENDPOINT_SCHEMES)}://HOST[:PORT]/v1")
        elif not parts.hostname:
            problems.append(f"endpoint: {endpoint!r} has no host")
    model = _text(args, "model", problems, True) or ""
    rubric = _text(args, "rubric", problems, True) or ""
    low = _number(args, "low", 0, problems, low=-1000, high=1000, integer=True)
    high = _number(args, "high", 10, problems, low=-1000, high=1000, integer=True)
    if low >= high:
        problems.append(f"low/high: the grade range [{low}, {high}] is empty; low must be below high")
    key_env = _text(args, "api_key_env", problems, False)
    if key_env is not None and not key_env.replace("_", "").isalnum():
        problems.append(f"api_key_env: {key_env!r} is not an environment variable name (the key itself never goes "
                        "in a config)")
    cache_dir = _text(args, "cache_dir", problems, False)
    parsed = JudgeArgs(
        endpoint=endpoint.rstrip("/"), model=model, rubric=rubric, low=low, high=high,
        pass_at=_number(args, "pass_at", 0.5, problems, low=0, high=1),
        api_key_env=key_env, timeout_s=_number(args, "timeout_s", 30.0, problems, low=0.01, high=3600),
        retries=_number(args, "retries", 2, problems, low=0, high=20, integer=True),
        backoff_s=_number(args, "backoff_s", 0.5, problems, low=0, high=600),
        max_tokens=_number(args, "max_tokens", 256, problems, low=1, high=1 << 16, integer=True),
        cache_dir=cache_dir if cache_dir is not None else os.environ.get("TIDAL_JUDGE_CACHE") or None,
    )
    if problems:
        raise ModelArgsError("llm_judge", problems)
    return parsed


def parse_reward_model_args(args: dict[str, Any]) -> RewardModelArgs:
    """`RewardModelArgs` from a verifier's arguments; `ModelArgsError` lists every problem."""
    problems: list[str] = []
    _unknown(args, RewardModelArgs, problems)
    path = _text(args, "path", problems, True) or ""
    if path and not os.path.isdir(os.path.expanduser(path)):
        problems.append(f"path: {path!r} is not a folder (a Hugging Face checkpoint: config.json, weights, tokenizer)")
    kind = args.get("kind", "auto")
    if kind not in ("auto", "classifier", "rubric"):
        problems.append(f"kind: {kind!r} is not auto, classifier or rubric")
    rubric = _text(args, "rubric", problems, False)
    if kind == "rubric" and rubric is None:
        problems.append("rubric: kind rubric needs a `rubric` (what a good answer does)")
    device = args.get("device", "auto")
    if not isinstance(device, str) or device.split(":")[0] not in DEVICE_PREFIXES:
        problems.append(f"device: {device!r} is not auto, cpu, cuda, cuda:N or mps")
    parsed = RewardModelArgs(
        path=path, kind=str(kind), rubric=rubric, device=str(device),
        batch_size=_number(args, "batch_size", 8, problems, low=1, high=4096, integer=True),
        max_length=_number(args, "max_length", 1024, problems, low=8, high=1 << 20, integer=True),
        label=_number(args, "label", -1, problems, low=-1024, high=1024, integer=True),
        yes=_text(args, "yes", problems, False) or "yes", no=_text(args, "no", problems, False) or "no",
        pass_at=_number(args, "pass_at", 0.5, problems, low=0, high=1),
    )
    if problems:
        raise ModelArgsError("reward_model", problems)
    return parsed


PARSERS = {"llm_judge": parse_judge_args, "reward_model": parse_reward_model_args}


def check_model_verifier(name: str, args: dict[str, Any]) -> None:
    """Raise `ModelArgsError` when `name` is a model verifier whose `args` cannot work (at config load)."""
    parser = PARSERS.get(name)
    if parser is not None:
        parser(args)
