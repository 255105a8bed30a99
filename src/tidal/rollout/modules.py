"""The engine's generic forward: any decoder-only causal LM that transformers loads, run through
its own modules over the engine's paged KV.

`ModuleDecoder.forward` calls the model itself on the step's packed tokens (one batch row of N
tokens, their true positions as `position_ids`, no transformers cache) with its attention
implementation set to "tidal_paged" (rollout/attention.py). So everything an architecture does
its own way stays its own: norms and their placement, rotary, partial-rotary or learned
positions, QK-norm, embedding scaling, sliding-window layers, logit soft-capping, MoE routing,
fused or Conv1D projections, tied embeddings, LoRA layers; only attention reads and writes the
block pool. The LM head runs only on the rows whose logits the step needs (`logits_to_keep`).

`kv_geometry(model)` is what the pool is sized from; `check_decoder(config)` refuses, with a
typed error naming the architecture, what the engine cannot run (encoder-decoders, models
without a causal-LM head, layers of unequal KV shapes).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tidal.errors import ModelLoadError
from tidal.rollout.attention import PagedAttention, active, register
from tidal.rollout.blocks import BlockPool
from tidal.rollout.paged import PagedDecoder


def kv_geometry(config: Any) -> tuple[int, int, int, int]:
    """(layers, query heads, kv heads, head dim) of a decoder's config, for sizing the pool."""
    config = getattr(config, "text_config", None) or config
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return layers, heads, int(kv_heads), int(head_dim)


def check_decoder(config: Any) -> None:
    """Raise `ModelLoadError` naming the architecture when the engine cannot run a model of `config`."""
    name = ", ".join(getattr(config, "architectures", None) or []) or type(config).__name__
    if getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(f"{name} is an encoder-decoder model; tidal samples from decoder-only causal LMs")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelLoadError(
            f"{name} (model_type {model_type!r}) has no causal-LM head in transformers; tidal samples from "
            "decoder-only causal LMs (Llama, Qwen, Gemma, Phi, GPT-2, OLMo, Mistral, MoE variants, ...)"
        )
    try:
        kv_geometry(config)
    except (AttributeError, TypeError, ValueError) as error:
        raise ModelLoadError(f"{name}: cannot read its attention shape from config.json ({error})") from None


class ModuleDecoder:
    """The packed paged forward through a model's own modules (module docstring)."""

    path = "generic"

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
        check_decoder(model.config)
        own = model.get_input_embeddings().weight.dtype
        if dtype is not None and dtype != own:
            raise ValueError(f"the generic forward computes in the model's own dtype ({own}), not {dtype}")
        self.model = model
        self.dtype = own
        self.num_layers, self.heads, self.kv_heads, self.head_dim = kv_geometry(model.config)
        self.scaling = self.head_dim**-0.5  # what a module passes overrides it
        implementation = register(getattr(model.config, "_attn_implementation", None))
        if model.config._attn_implementation != implementation:
            model.set_attn_implementation(implementation)

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        try:
            check_decoder(model.config)
        except ModelLoadError:
            return False
        return True

    def current(self) -> bool:
        return True  # the model's modules are called as they are now, adapters included

    def forward(self, step: Any, pool: BlockPool, view: Any) -> Tensor:
        """Logits (R, V) float32 at `step.logit_rows`; every token's keys and values are written
        to its pool slot (and decode rows' to `view`)."""
        assert step.logit_rows is not None
        attention = PagedAttention(step, pool, view, self.heads, self.kv_heads, self.head_dim, self.scaling)
        with active(attention):
            tokens = step.tokens[None]
            # a mask of ones: some models warn without one; "tidal_paged" builds none from it
            out = self.model(input_ids=tokens, attention_mask=torch.ones_like(tokens), position_ids=step.positions[None],
                             use_cache=False, logits_to_keep=step.logit_rows)
        return out.logits[0].float()


def pick_forward(model: torch.nn.Module, choice: str = "auto") -> str:
    """The forward `choice` names for `model`: "llama", the hand-written Llama-family forward
    (rollout/paged.py), or "generic", the model's own modules (this file). "auto" takes "llama"
    where it computes the model exactly (it alone samples in bfloat16 from float32 weights and
    replays decode steps from CUDA graphs; in the model's dtype on a CPU the two run at the same
    speed: bench/RESULTS.md, "Rollout"), "generic" for every other causal LM."""
    if choice == "generic" or (choice == "auto" and not PagedDecoder.supports(model)):
        check_decoder(model.config)
        return "generic"
    if not PagedDecoder.supports(model):
        raise ValueError(f"forward='llama' runs Llama-family decoders without sliding windows, not "
                         f"{type(model).__name__}; use forward='auto' or 'generic'")
    return "llama"


def describe_forward(config: Any) -> str:
    """Which forward the engine takes for a model of `config`, decided on an empty (meta-device)
    model, so no weights are read: what `tidal model info` prints."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        path = pick_forward(model)
    except (ModelLoadError, ValueError, TypeError, AttributeError, RuntimeError) as error:
        return f"none: {error}"
    return {"llama": "llama (the hand-written Llama-family forward)",
            "generic": "generic (the model's own modules over paged KV)"}[path]
