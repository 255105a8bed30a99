"""The loop's rollout engine, as `rollout.engine` picks it: `embedded` samples with the trainer's
own model in this process; `http` drives an external OpenAI-compatible server (`rollout.http`),
which holds its own copy of the policy and is sent each version through its reload endpoint
(`LoopParts.sync_engine`). Everything after this choice talks to the `RolloutEngine` protocol."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tidal.config.schema import TidalConfig
from tidal.errors import UnknownNameError
from tidal.rollout.protocol import RolloutEngine


def embedded_engine(cfg: TidalConfig, model: torch.nn.Module, tokenizer: Any, device: torch.device, run_path: Path) -> RolloutEngine:
    from tidal.rollout.engine import EmbeddedEngine

    return EmbeddedEngine.from_config(model, tokenizer, device, cfg.rollout)  # type: ignore[arg-type]


def http_engine(cfg: TidalConfig, model: torch.nn.Module, tokenizer: Any, device: torch.device, run_path: Path) -> RolloutEngine:
    from tidal.rollout.http_engine import HttpEngine, eos_ids_for

    http = cfg.rollout.http
    assert http is not None  # RolloutConfig checks it at load
    folder = Path(http.weights_dir) if http.weights_dir else run_path / "published"
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    return HttpEngine(http, tokenizer, vocab_size=vocab, eos_ids=eos_ids_for(model, tokenizer), weights_dir=folder)


ENGINES: dict[str, Callable[..., RolloutEngine]] = {"embedded": embedded_engine, "http": http_engine}


def build_engine(cfg: TidalConfig, model: torch.nn.Module, tokenizer: Any, device: torch.device, run_path: Path) -> RolloutEngine:
    """The engine `rollout.engine` names, for the policy `model` (which an http engine's server
    must serve the same architecture and tokenizer of)."""
    if cfg.rollout.engine not in ENGINES:
        raise UnknownNameError("rollout engine", cfg.rollout.engine, list(ENGINES))
    return ENGINES[cfg.rollout.engine](cfg, model, tokenizer, device, run_path)


def holds_copy(cfg: TidalConfig) -> bool:
    """Whether the engine keeps its own copy of the policy, to be sent every version."""
    return cfg.rollout.engine != "embedded"
