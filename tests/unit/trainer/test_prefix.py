"""Shared-prompt training (trainer/prefix.py): each distinct prompt runs once, and the logprobs,
entropies, gradients and whole RL updates equal those of the plain forward over every row.

Equal up to float32 rounding even in a float64 model: the transformers Qwen2 model computes its
RMSNorm in float32, whose sums round differently for different tensor shapes (about 1e-7
relative). AdamW's first step is about lr * sign(gradient), which that noise can flip for a
gradient element near 0, so the updates are compared by their gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.trainer.logprobs import collate, token_logprobs
from tidal.trainer.prefix import prompt_groups, shared_prefix_logprobs
from tidal.trainer.trainer import Trainer
from tidal.types import Completion, Episode, TrainBatch

from .test_logprobs import _full_size_fills
from .tiny import VOCAB, build_model


def grouped_batch(model: torch.nn.Module, seed: int = 0, groups: tuple[int, ...] = (3, 4, 2)) -> TrainBatch:
    """`len(groups)` prompts of different lengths, each followed by `groups[i]` completions of
    1 to 7 tokens (rows of one prompt not all adjacent), right-padded, with `prompt_lengths`."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, VOCAB, (n,), generator=generator).tolist() for n in (5, 9, 2)[: len(groups)]]
    rows = [(p, torch.randint(1, VOCAB, (int(torch.randint(1, 8, (), generator=generator)),),
                              generator=generator).tolist())
            for p, count in zip(prompts, groups) for _ in range(count)]
    rows = rows[1::2] + rows[::2]  # interleave the groups
    length = max(len(p) + len(c) for p, c in rows)
    input_ids = torch.zeros(len(rows), length, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    completion_mask = torch.zeros(len(rows), length)
    for b, (p, c) in enumerate(rows):
        input_ids[b, : len(p) + len(c)] = torch.tensor(p + c)
        attention_mask[b, : len(p) + len(c)] = 1
        completion_mask[b, len(p) : len(p) + len(c)] = 1.0
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        current, _ = token_logprobs(model, input_ids, attention_mask)
    old = (current + 0.3 * torch.randn(current.shape, generator=generator).to(dtype)) * completion_mask
    advantages = torch.randn(len(rows), generator=generator).to(dtype)
    return TrainBatch(input_ids, attention_mask, completion_mask.to(dtype), old.to(dtype), advantages,
                      prompt_lengths=torch.tensor([len(p) for p, _ in rows]))


def _loss_and_grads(model: torch.nn.Module, logprobs: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor):
    model.zero_grad(set_to_none=True)
    loss = (logprobs * mask).sum() + 0.1 * (entropy * mask).sum()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_logprobs_entropies_and_gradients_equal_the_plain_forward() -> None:
    model = build_model(seed=1, dtype=torch.float64).train()
    batch = grouped_batch(model)
    mask = batch.completion_mask
    plain_lp, plain_ent = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=0.8,
                                         with_entropy=True, entropy_grad=True)
    plain_grads = _loss_and_grads(model, plain_lp, plain_ent, mask)
    shared_lp, shared_ent = shared_prefix_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_lengths,
                                                   temperature=0.8, with_entropy=True, entropy_grad=True)
    shared_grads = _loss_and_grads(model, shared_lp, shared_ent, mask)
    torch.testing.assert_close(shared_lp * mask, plain_lp * mask, rtol=0, atol=1e-6)
    torch.testing.assert_close(shared_ent * mask, plain_ent * mask, rtol=0, atol=1e-6)
    assert float(shared_lp.detach()[mask == 0].abs().sum()) == 0.0  # prompt and padding positions are not computed
    assert shared_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-5, atol=1e-6 * float(grad.abs().max()))


def test_the_prompts_are_found_by_content_and_each_runs_once() -> None:
    model = build_model(seed=1)
    batch = grouped_batch(model, groups=(3, 4, 2))
    prompts, source = prompt_groups(batch.input_ids, batch.prompt_lengths)
    assert sorted(len(p) for p in prompts) == [2, 5, 9] and len(source) == 9
    assert sorted(source.count(u) for u in range(3)) == [2, 3, 4]
    calls: list[tuple[int, ...]] = []
    handle = model.model.embed_tokens.register_forward_hook(lambda m, i, o: calls.append(tuple(i[0].shape)))
    try:
        shared_prefix_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_lengths)
    finally:
        handle.remove()
    assert calls[0] == (3, 9)  # the 3 distinct prompts, left-padded to the longest
    assert calls[1][0] == 9  # then the 9 completions on their prompts' cache rows
    distinct = grouped_batch(model, groups=(1, 1, 1))
    prompts, source = prompt_groups(distinct.input_ids, distinct.prompt_lengths)
    assert len(prompts) == len(source) == 3  # nothing to share: the trainer runs the plain forward


def test_prompt_lengths_outside_the_rows_are_refused() -> None:
    model = build_model(seed=1)
    batch = grouped_batch(model)
    with pytest.raises(ValueError, match="prompt lengths"):
        shared_prefix_logprobs(model, batch.input_ids, batch.attention_mask, torch.zeros_like(batch.prompt_lengths))
    with pytest.raises(ValueError, match="prompt lengths"):
        shared_prefix_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_lengths + 100)


@pytest.mark.parametrize("algo", [
    AlgorithmConfig(aggregation="token", kl_coef=0.1, entropy_coef=0.01),
    AlgorithmConfig(loss="decoupled_ppo", aggregation="sequence"),
], ids=["ppo+kl+entropy", "decoupled_ppo"])
def test_an_rl_update_with_shared_prompts_equals_the_plain_one(algo: AlgorithmConfig) -> None:
    """The same metrics and the same accumulated (clipped) gradient at the optimizer step, with
    groups split across micro-batches; a reference model for the KL, the proximal policy's
    logprobs for decoupled PPO."""
    base = build_model(seed=3, dtype=torch.float64)
    batch = grouped_batch(base, seed=5)
    results = {}
    for shared in (False, True):
        model, ref = copy.deepcopy(base), copy.deepcopy(base)
        cfg = TrainerConfig(lr=1e-3, micro_batch_size=4, precision="fp32", shared_prefix=shared)
        trainer = Trainer(model, cfg, algo, "cpu", total_steps=10, temperature=0.9, ref_model=ref, max_tokens=8)
        grads: dict[str, torch.Tensor] = {}

        def record(optimizer, args, kwargs, _model=model, _grads=grads):  # type: ignore[no-untyped-def]
            _grads.update({n: p.grad.clone() for n, p in _model.named_parameters() if p.grad is not None})

        trainer.optimizer.register_step_pre_hook(record)
        results[shared] = (trainer.rl_step(batch), grads)
    (plain, plain_grads), (shared, shared_grads) = results[False], results[True]
    assert plain.keys() == shared.keys() and plain["skipped"] == 0
    for key, value in plain.items():
        assert shared[key] == pytest.approx(value, rel=1e-5, abs=1e-8), key
    assert plain_grads and shared_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-5, atol=1e-6 * float(grad.abs().max()))


def test_collate_records_where_each_completion_starts() -> None:
    episodes = [
        Episode(f"e{i}", "t", "math", "g", Completion(prompt_ids=[1] * n, token_ids=[2, 3], logprobs=[-1.0, -1.0],
                                                       text="", finish_reason="stop", weight_version=0))
        for i, n in enumerate((3, 5))
    ]
    for episode in episodes:
        episode.advantage = 0.5
    assert collate(episodes, pad_id=0).prompt_lengths.tolist() == [3, 5]


def test_the_backward_writes_each_completions_gradient_once() -> None:
    # Each row's scores were `completion_logits[b, :count]`: a whole (B, C, V) gradient zero-filled
    # per row in the backward (see test_logprobs.py).
    model = build_model(seed=4).train()
    batch = grouped_batch(model)
    span = int((batch.attention_mask.sum(dim=1) - batch.prompt_lengths).max())

    def backward() -> None:
        logprobs, _ = shared_prefix_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_lengths)
        (logprobs * batch.completion_mask).sum().backward()

    # A fixed few (2 here: one is the slice that drops the last position), not one per row (9).
    assert _full_size_fills(backward, (batch.input_ids.shape[0], span, VOCAB)) <= 2
