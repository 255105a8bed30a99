"""Random checkpoints of any transformers decoder architecture, for trying a path before the real
weights are at hand (`tidal model init --arch qwen3 --out DIR`), and for the architecture test
matrix.

`random_checkpoint` builds the architecture's config at a given size (the size fields each
architecture names its own way are set through one table), initialises it from a seed, scales the
blocks' matrices up so greedy decoding does not collapse onto one token (which would hide cache
bugs), and saves it with a tokenizer: tidal's built-in byte-level tokenizer, or any tokenizer folder
(the vocabulary is sized to it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
)

from tidal.errors import ModelLoadError
from tidal.models.io import save_checkpoint
from tidal.models.tokenizer import CHATML_TEMPLATE, build_tiny_tokenizer

# Per architecture: what its config needs beyond the common size fields (a small MoE, sliding
# windows on some layers, ...). Any other causal-LM model_type gets the common fields only.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": 16},
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "gemma3_text": {"head_dim": 16, "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]},
    "gemma2": {"head_dim": 16, "sliding_window": 16},
    "phi3": {},
    "olmo2": {},
    "gpt2": {},
    "qwen3_moe": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "decoder_sparse_step": 1},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
}


def random_config(model_type: str, vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 4,
                  kv_heads: int = 2, intermediate: int = 128, context: int = 2048,
                  special: dict[str, int | None] | None = None) -> Any:
    """The transformers config of `model_type` at this size."""
    special = {key: value for key, value in (special or {}).items() if value is not None}
    extra = dict(ARCHITECTURES.get(model_type, {}))
    if "layer_types" in extra:
        pattern = extra["layer_types"]
        extra["layer_types"] = [pattern[i % len(pattern)] for i in range(layers)]
    if model_type == "gpt2":
        fields: dict[str, Any] = {"n_embd": hidden, "n_layer": layers, "n_head": heads, "n_positions": context,
                                  "n_inner": intermediate}
    else:
        fields = {"hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
                  "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": context}
    try:
        return AutoConfig.for_model(model_type, vocab_size=vocab_size, **fields, **extra, **special)
    except ValueError as error:
        raise ModelLoadError(f"model_type {model_type!r}: {error}") from None


def random_checkpoint(model_type: str, out: str | os.PathLike[str], tokenizer: str | None = None, seed: int = 0,
                      scale: float = 4.0, **size: int) -> Path:
    """Save a random `model_type` checkpoint with a tokenizer (None: the built-in one) to `out`."""
    tok = _tokenizer(tokenizer)
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    special = {"bos_token_id": bos, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    config = random_config(model_type, len(tok), special=special, **size)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            embedding = "embed" in name or name.startswith(("transformer.wte", "transformer.wpe"))
            if parameter.dim() == 2 and not embedding:
                parameter.mul_(scale)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return save_checkpoint(model, tok, out)


def _tokenizer(folder: str | None) -> PreTrainedTokenizerBase:
    if folder is None:
        return build_tiny_tokenizer()
    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(f"{folder}: cannot load a tokenizer ({error})") from error
    if not getattr(tok, "chat_template", None):
        tok.chat_template = CHATML_TEMPLATE
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok
