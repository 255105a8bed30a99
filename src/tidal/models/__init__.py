"""models layer: load and save Hugging Face checkpoints, the built-in tiny model and tokenizer."""

from tidal.models.io import LoadedModel, count_parameters, load_model, render_prompt, resolve_device, save_checkpoint
from tidal.models.tiny import build_tiny_model
from tidal.models.tokenizer import CHATML_TEMPLATE, build_tiny_tokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "LoadedModel",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "count_parameters",
    "load_model",
    "render_prompt",
    "resolve_device",
    "save_checkpoint",
]
