"""Tiny randomly initialised Hugging Face models saved to a folder (the built-in byte tokenizer):
a Qwen2 reward model with a one-logit score head, and a Qwen2 causal LM. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

from tidal.models.tokenizer import build_tiny_tokenizer


def _config(tokenizer, **extra) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **extra,
    )


def save_tiny_reward_model(folder: Path, seed: int = 0) -> Path:
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(_config(tokenizer, num_labels=1))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_tiny_causal_lm(folder: Path, seed: int = 0) -> Path:
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(_config(tokenizer, tie_word_embeddings=True))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
