"""The built-in tiny model: a standard Qwen2 architecture, randomly initialised from a seed.

Being a stock `transformers` class, it saves to a checkpoint that `transformers` and vLLM load
without tidal, and everything that works on it works on any Qwen2/Llama-style checkpoint.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from tidal.config.schema import TinyModelConfig


def build_tiny_model(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int) -> Qwen2ForCausalLM:
    """A fresh Qwen2 model of `cfg`'s shape for `tokenizer` (vocab = len(tokenizer)), tied embeddings.

    The initialisation depends only on `seed` and the shape; the global torch RNG is left untouched.
    """
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    # A bos-less tokenizer (the tiny one) gets no bos id: nothing is prepended to prompts.
    bos_id = tokenizer.bos_token_id
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    return model
