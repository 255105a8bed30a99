"""Supervised warm start: fine-tune on the reference answers of train-split tasks.

No pretrained weights can be downloaded, so the built-in tiny model starts from random weights.
The warm start teaches it the chat format and the task templates, and is kept short on purpose:
it should leave the model partly competent (held-out pass rates well between 0 and 1) so that RL
has signal to learn from. With a real checkpoint the user turns it off (`warm_start.enabled=false`).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

import torch

from tidal.config.schema import AlgorithmConfig, TrainerConfig, WarmStartConfig
from tidal.models.io import render_prompt
from tidal.tasks import reference_answer
from tidal.trainer.trainer import Trainer
from tidal.types import Task


def split_for_warm_start(tasks: list[Task], share: float) -> tuple[list[Task], list[Task]]:
    """(warm-start tasks, RL tasks): a stable `share` of task contents goes to the warm start.

    A small model fine-tuned on a task memorises it, and RL on memorised prompts has little to
    learn that carries over to held-out tasks (measured: RL then lowered held-out pass rates). So
    RL samples contents the warm start never showed. Content = the family's `key` when the task
    has one (two tasks with one key are the same problem), else the id.
    """
    if share >= 1:
        return list(tasks), list(tasks)
    warm, rest = [], []
    for task in tasks:
        content = str(task.metadata.get("key", task.id))
        digest = hashlib.sha256(f"warm-start\x00{task.domain}\x00{content}".encode()).digest()
        fraction = int.from_bytes(digest[:8], "big") / 2**64
        (warm if fraction < share else rest).append(task)
    return warm, rest


def sft_examples(tokenizer: Any, tasks: list[Task]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids + eos) for every task with a reference."""
    eos = tokenizer.eos_token_id
    examples = []
    for task in tasks:
        if task.reference is None:
            continue
        prompt = render_prompt(tokenizer, task.messages())
        answer = tokenizer.encode(reference_answer(task), add_special_tokens=False) + [eos]
        examples.append((prompt, answer))
    return examples


def pad_batch(
    examples: list[tuple[list[int], list[int]]], pad_id: int, prompt_weight: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, loss_mask), each (B, T).

    The loss covers the answer tokens and, at `prompt_weight`, the prompt tokens: predicting the
    prompt teaches a from-scratch model to read numbers and words, which the answers depend on.
    """
    length = max(len(p) + len(a) for p, a in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(len(examples), length, dtype=torch.long)
    loss_mask = torch.zeros(len(examples), length)
    for row, (prompt, answer) in enumerate(examples):
        sequence = prompt + answer
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention_mask[row, : len(sequence)] = 1
        loss_mask[row, 1 : len(prompt)] = prompt_weight
        loss_mask[row, len(prompt) : len(sequence)] = 1.0
    return input_ids, attention_mask, loss_mask


def warm_start(
    model: torch.nn.Module,
    tokenizer: Any,
    tasks: list[Task],
    cfg: WarmStartConfig,
    device: torch.device,
    seed: int,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Run `cfg.steps` supervised steps on random batches of train-task references."""
    examples = sft_examples(tokenizer, tasks)
    if not examples:
        raise ValueError("warm start needs train tasks with a `reference`; none has one")
    trainer_cfg = TrainerConfig(
        lr=cfg.lr,
        warmup_steps=max(1, cfg.steps // 20),
        schedule="cosine",
        grad_clip=1.0,
        micro_batch_size=cfg.batch_size,
        weight_decay=0.0,
        betas=(0.9, 0.98),
        steps=cfg.steps,
    )
    trainer = Trainer(model, trainer_cfg, AlgorithmConfig(), device, total_steps=cfg.steps)
    rng = random.Random(seed)
    pad_id = tokenizer.pad_token_id
    history = []
    model.train()
    for step in range(cfg.steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(cfg.batch_size)]
        input_ids, attention_mask, loss_mask = pad_batch(batch, pad_id, cfg.prompt_weight)
        metrics = trainer.sft_step(input_ids, attention_mask, loss_mask)
        metrics["step"] = step + 1
        history.append(metrics)
        if on_step:
            on_step(step + 1, metrics)
    model.eval()
    return history
