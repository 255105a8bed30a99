"""A tiny Qwen2 model and random RL batches for the trainer tests."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tidal.trainer.logprobs import token_logprobs
from tidal.types import TrainBatch

VOCAB = 300


def build_model(seed: int = 0, dtype: torch.dtype = torch.float32, tie: bool = False) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
    )
    return Qwen2ForCausalLM(config).to(dtype)


def random_batch(model: torch.nn.Module, batch: int = 8, seed: int = 0, noise: float = 0.3) -> TrainBatch:
    """Right-padded prompts + completions of varied lengths; old logprobs near the model's own."""
    generator = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(2, 6, (batch,), generator=generator)
    completion_lengths = torch.randint(1, 8, (batch,), generator=generator)
    length = int((prompt_lengths + completion_lengths).max())
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    attention_mask = torch.zeros(batch, length, dtype=torch.long)
    completion_mask = torch.zeros(batch, length)
    for b in range(batch):
        p, c = int(prompt_lengths[b]), int(completion_lengths[b])
        input_ids[b, : p + c] = torch.randint(1, VOCAB, (p + c,), generator=generator)
        attention_mask[b, : p + c] = 1
        completion_mask[b, p : p + c] = 1.0
    with torch.no_grad():
        current, _ = token_logprobs(model, input_ids, attention_mask)
    dtype = next(model.parameters()).dtype
    old = (current + noise * torch.randn(current.shape, generator=generator).to(dtype)) * completion_mask
    advantages = torch.randn(batch, generator=generator).to(dtype)
    return TrainBatch(input_ids, attention_mask, completion_mask.to(dtype), old.to(dtype), advantages)
