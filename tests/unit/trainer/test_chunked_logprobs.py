"""Chunked log-probs (trainer/logprobs.py): the LM head over chunks of the wanted positions gives
the numbers and gradients of the full logits, plain and shared-prompt, and never makes a tensor
as wide as the vocabulary with more rows than a chunk."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.trainer.logprobs import split_model, token_logprobs
from tidal.trainer.prefix import shared_prefix_logprobs
from tidal.trainer.trainer import Trainer

from .test_prefix import grouped_batch
from .tiny import VOCAB, build_model, random_batch


class VocabRows(TorchDispatchMode):
    """Records the most rows of any tensor an op makes (not a view) whose last dimension is the vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # e.g. the head weight's transpose (H, V): no new memory
            return out
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.dim() >= 1 and tensor.shape[-1] == VOCAB:
                self.most = max(self.most, tensor.numel() // VOCAB)
        return out


def _grads(model: torch.nn.Module, logprobs: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> dict:
    model.zero_grad(set_to_none=True)
    weights = torch.linspace(0.5, 1.5, mask.numel()).view(mask.shape)  # every position counts differently
    ((logprobs * weights * mask).sum() + 0.3 * (entropy * mask).sum()).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _assert_same(chunked: tuple, full: tuple, mask: torch.Tensor) -> None:
    (lp, ent, grads), (lp_full, ent_full, grads_full) = chunked, full
    torch.testing.assert_close(lp * mask, lp_full * mask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent * mask, ent_full * mask, rtol=1e-5, atol=1e-5)
    assert grads.keys() == grads_full.keys() and grads
    for name, grad in grads_full.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max())), name


@pytest.mark.parametrize("chunk", [1, 5, 1024])
@pytest.mark.parametrize("tie", [False, True])
def test_chunks_equal_the_full_logits_with_temperature_entropy_and_gradients(chunk: int, tie: bool) -> None:
    model = build_model(seed=1, tie=tie).train()
    assert split_model(model) is not None
    batch = random_batch(model, batch=6, seed=2)  # right-padded rows of varied lengths
    mask = batch.completion_mask
    results = []
    for chunk_tokens in (chunk, 0):
        lp, ent = token_logprobs(model, batch.input_ids, batch.attention_mask, 0.7, with_entropy=True,
                                 entropy_grad=True, positions=mask, chunk_tokens=chunk_tokens)
        results.append((lp.detach(), ent.detach(), _grads(model, lp, ent, mask)))
    _assert_same(results[0], results[1], mask)
    # Unwanted positions (prompt, padding, position 0) are 0 and were not computed.
    assert float(results[0][0][mask == 0].abs().sum()) == 0.0 and float(results[0][1][mask == 0].abs().sum()) == 0.0


def test_without_positions_every_real_token_is_computed() -> None:
    model = build_model(seed=3).eval()
    batch = random_batch(model, batch=5, seed=4)
    with torch.no_grad():
        chunked, chunked_ent = token_logprobs(model, batch.input_ids, batch.attention_mask, 1.3, True, chunk_tokens=3)
        full, full_ent = token_logprobs(model, batch.input_ids, batch.attention_mask, 1.3, True, chunk_tokens=0)
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked_ent, full_ent, rtol=1e-5, atol=1e-5)
    assert (chunked[:, 0] == 0).all() and (chunked[batch.attention_mask == 0] == 0).all()


def test_shared_prompts_chunked_equal_the_full_logits() -> None:
    model = build_model(seed=5).train()
    batch = grouped_batch(model, seed=6)
    mask = batch.completion_mask
    results = []
    for chunk_tokens in (4, 0):
        lp, ent = shared_prefix_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_lengths, 0.8,
                                         with_entropy=True, entropy_grad=True, positions=mask, chunk_tokens=chunk_tokens)
        results.append((lp.detach(), ent.detach(), _grads(model, lp, ent, mask)))
    _assert_same(results[0], results[1], mask)
    # And both equal the plain forward over every row.
    plain = token_logprobs(model, batch.input_ids, batch.attention_mask, 0.8, chunk_tokens=0)[0].detach()
    torch.testing.assert_close(results[0][0] * mask, plain * mask, rtol=1e-5, atol=1e-5)


def test_no_tensor_over_the_vocabulary_has_more_rows_than_a_chunk() -> None:
    model = build_model(seed=7).train()
    batch = random_batch(model, batch=8, seed=8)
    chunk = 4
    grouped = _grouped(model)
    for run in (
        lambda: token_logprobs(model, batch.input_ids, batch.attention_mask, 0.9, True, True,
                               positions=batch.completion_mask, chunk_tokens=chunk),
        lambda: shared_prefix_logprobs(model, *grouped, 0.9, True, True, chunk_tokens=chunk),
    ):
        with VocabRows() as forward:
            lp, ent = run()
        with VocabRows() as backward:
            (lp.sum() + ent.sum()).backward()
        assert forward.most <= chunk and backward.most <= chunk, (forward.most, backward.most)
    with VocabRows() as full:
        token_logprobs(model, batch.input_ids, batch.attention_mask, chunk_tokens=0)
    assert full.most >= batch.input_ids.numel()  # the check sees full logits when they are made


def _grouped(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch = grouped_batch(model, seed=9)
    return batch.input_ids, batch.attention_mask, batch.prompt_lengths


class Wrapped(torch.nn.Module):
    """A causal LM that exposes only its forward: no decoder/head split to take."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, **kwargs):  # type: ignore[no-untyped-def]
        return self.inner(**kwargs)


def test_a_model_without_a_split_head_takes_the_full_logits() -> None:
    inner = build_model(seed=10)
    wrapped = Wrapped(inner)
    assert split_model(wrapped) is None
    batch = random_batch(inner, batch=4, seed=11)
    with torch.no_grad():
        expected, _ = token_logprobs(inner, batch.input_ids, batch.attention_mask, 0.7, chunk_tokens=2)
        got, _ = token_logprobs(wrapped, batch.input_ids, batch.attention_mask, 0.7, chunk_tokens=2)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    gemma_like = build_model(seed=10)
    gemma_like.config.model_type = "gemma2"  # soft-capped logits: the head alone is not the logits
    assert split_model(gemma_like) is None


def test_bf16_autocast_chunks_match_the_full_logits_in_bf16() -> None:
    model = build_model(seed=12).eval()
    batch = random_batch(model, batch=4, seed=13)
    with torch.no_grad():
        chunked, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, autocast_dtype=torch.bfloat16,
                                    positions=batch.completion_mask, chunk_tokens=3)
        full, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, autocast_dtype=torch.bfloat16,
                                 chunk_tokens=0)
    assert chunked.dtype == torch.float32
    mask = batch.completion_mask
    torch.testing.assert_close(chunked * mask, full * mask, rtol=0, atol=2e-2)


@pytest.mark.parametrize("options", [
    {"logprob_chunk_tokens": 3},
    {"logprob_chunk_tokens": 3, "gradient_checkpointing": True},
    {"logprob_chunk_tokens": 3, "gradient_checkpointing": True, "shared_prefix": False},
], ids=["chunked", "chunked+checkpointing", "chunked+checkpointing+unshared"])
def test_an_rl_update_is_the_same_with_chunks_and_checkpointing(options: dict) -> None:
    """Same metrics and accumulated gradient as the full-logits update without checkpointing,
    with a reference model (KL) and an entropy bonus, groups across micro-batches."""
    base = build_model(seed=14)
    batch = grouped_batch(base, seed=15)
    algo = AlgorithmConfig(aggregation="token", kl_coef=0.1, entropy_coef=0.01)
    results = []
    for extra in ({"logprob_chunk_tokens": 0}, options):
        model, ref = copy.deepcopy(base), copy.deepcopy(base)
        cfg = TrainerConfig(lr=1e-3, micro_batch_size=4, precision="fp32", **extra)
        trainer = Trainer(model, cfg, algo, "cpu", total_steps=10, temperature=0.9, ref_model=ref, max_tokens=8)
        grads: dict[str, torch.Tensor] = {}

        def record(optimizer, args, kwargs, _model=model, _grads=grads):  # type: ignore[no-untyped-def]
            _grads.update({n: p.grad.clone() for n, p in _model.named_parameters() if p.grad is not None})

        trainer.optimizer.register_step_pre_hook(record)
        results.append((trainer.rl_step(batch), grads, trainer.setup))
    (full, full_grads, full_setup), (other, other_grads, setup) = results
    assert full_setup["logprobs"] == "full logits" and setup["logprobs"] == "chunked, 3 tokens"
    assert setup["gradient_checkpointing"] == options.get("gradient_checkpointing", False)
    assert full["skipped"] == 0 and full.keys() == other.keys()
    for key, value in full.items():
        assert other[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for name, grad in full_grads.items():
        torch.testing.assert_close(other_grads[name], grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max()))


def test_gradient_checkpointing_needs_a_model_that_has_it() -> None:
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        Trainer(Wrapped(build_model()), TrainerConfig(gradient_checkpointing=True), AlgorithmConfig(), "cpu", 1)
