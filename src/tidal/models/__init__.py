"""models layer: load and save Hugging Face checkpoints, the built-in tiny model and tokenizer,
GGUF import, model info, and models fetched from the package index."""

from tidal.models.gguf import ImportCheckError, ImportResult, ModelImportError, import_gguf, model_info
from tidal.models.io import LoadedModel, count_parameters, load_model, render_prompt, resolve_device, save_checkpoint
from tidal.models.registry_models import REGISTRY_MODELS, ModelFetchError, RegistryModel, ensure_model
from tidal.models.tiny import build_tiny_model
from tidal.models.tokenizer import CHATML_TEMPLATE, build_tiny_tokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "REGISTRY_MODELS",
    "ImportCheckError",
    "ImportResult",
    "LoadedModel",
    "ModelFetchError",
    "ModelImportError",
    "RegistryModel",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "count_parameters",
    "ensure_model",
    "import_gguf",
    "load_model",
    "model_info",
    "render_prompt",
    "resolve_device",
    "save_checkpoint",
]
