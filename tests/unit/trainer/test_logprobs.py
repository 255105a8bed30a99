"""token_logprobs against a naive per-position computation; sequence_logprobs' two paths and
what their backward allocates; collate layout."""

from __future__ import annotations

import pytest
import torch

from tidal.algos.losses import entropy_from_logits
from tidal.trainer.logprobs import collate, sequence_logprobs, token_logprobs
from tidal.types import Completion, Episode, Outcome, Score

from .tiny import build_model


def test_token_logprobs_matches_naive_per_position() -> None:
    model = build_model(seed=1).eval()
    input_ids = torch.tensor([[5, 17, 42, 99, 7, 3], [11, 250, 4, 0, 0, 0]])  # (2, 6), row 1 padded
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    temperature = 0.7
    with torch.no_grad():
        logprobs, entropy = token_logprobs(model, input_ids, attention_mask, temperature, with_entropy=True)
        assert logprobs.shape == entropy.shape == (2, 6)
        for b in range(2):
            length = int(attention_mask[b].sum())
            assert logprobs[b, 0] == 0.0 and entropy[b, 0] == 0.0
            for t in range(1, length):
                # The model sees only the prefix: its last logits predict token t.
                logits = model(input_ids[b : b + 1, :t]).logits[0, -1] / temperature  # (V,)
                expected = torch.log_softmax(logits, dim=-1)[input_ids[b, t]]
                assert logprobs[b, t].item() == pytest.approx(expected.item(), abs=1e-5)
                expected_entropy = entropy_from_logits(logits.view(1, 1, -1)).item()
                assert entropy[b, t].item() == pytest.approx(expected_entropy, abs=1e-5)
            assert (logprobs[b, length:] == 0).all() and (entropy[b, length:] == 0).all()


def test_token_logprobs_gradient_flows_and_entropy_is_detached_by_default() -> None:
    model = build_model(seed=2)
    ids = torch.tensor([[1, 2, 3, 4]])
    logprobs, entropy = token_logprobs(model, ids, torch.ones_like(ids), with_entropy=True)
    assert logprobs.requires_grad and not entropy.requires_grad
    _, entropy = token_logprobs(model, ids, torch.ones_like(ids), with_entropy=True, entropy_grad=True)
    assert entropy.requires_grad
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, ids, torch.ones_like(ids), temperature=0.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_scores_row_by_row_equal_the_batch_in_fp32(dtype: torch.dtype) -> None:
    # Narrow (autocast) scores go one row at a time; their values, entropies and gradients are
    # those of the whole batch upcast to fp32 and computed at once.
    generator = torch.Generator().manual_seed(0)
    base = (torch.randn(3, 5, 11, generator=generator) * 3).to(dtype)
    targets = torch.randint(0, 11, (3, 5), generator=generator)
    weights = torch.randn(3, 5, generator=generator)
    results = []
    for scores, upcast in ((base.clone().requires_grad_(), False), (base.clone().requires_grad_(), True)):
        logprobs, entropy = sequence_logprobs(scores.float() if upcast else scores, targets, 0.8,
                                              with_entropy=True, entropy_grad=True)
        assert logprobs.dtype == entropy.dtype == torch.float32 and logprobs.shape == entropy.shape == (3, 5)
        ((logprobs + entropy) * weights).sum().backward()
        results.append((logprobs.detach(), entropy.detach(), scores.grad))
    (lp_rows, ent_rows, grad_rows), (lp_batch, ent_batch, grad_batch) = results
    torch.testing.assert_close(lp_rows, lp_batch)
    torch.testing.assert_close(ent_rows, ent_batch)
    torch.testing.assert_close(grad_rows, grad_batch)
    empty = sequence_logprobs(base[:0], targets[:0], with_entropy=True)
    assert empty[0].shape == empty[1].shape == (0, 5)  # type: ignore[union-attr]


def _full_size_fills(run: object, shape: tuple[int, ...]) -> int:
    """How many zero fills of a tensor of `shape` `run()` makes."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        run()  # type: ignore[operator]
    return sum(1 for event in prof.events() if event.name in ("aten::fill_", "aten::zero_")
               and event.input_shapes and tuple(event.input_shapes[0]) == shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_backward_writes_each_rows_gradient_once(dtype: torch.dtype) -> None:
    # Taking row b as `scores[b]` made autograd zero-fill a whole (B, T, V) gradient per row and
    # add the B of them up: B times the work of the loss's own backward.
    rows, length, vocab = 8, 6, 50
    scores = torch.randn(rows, length, vocab).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (rows, length))

    def backward() -> None:
        logprobs, _ = sequence_logprobs(scores, targets)
        logprobs.sum().backward()

    assert _full_size_fills(backward, (rows, length, vocab)) <= 1
    model = build_model(seed=3)
    ids = torch.randint(1, 200, (rows, length))

    def through_the_model() -> None:
        logprobs, _ = token_logprobs(model, ids, torch.ones_like(ids))
        logprobs.sum().backward()

    vocab_size = model.config.vocab_size
    assert _full_size_fills(through_the_model, (rows, length, vocab_size)) <= 1


def _episode(prompt: list[int], tokens: list[int], logprobs: list[float], advantage: float) -> Episode:
    completion = Completion(prompt, tokens, logprobs, "text", "stop", 3)
    return Episode("run/0/t/0", "t", "math", "g", completion, advantage=advantage)


def test_collate_aligns_completion_tokens_and_sampler_logprobs() -> None:
    episodes = [
        _episode([10, 11, 12], [20, 21], [-0.5, -1.5], 1.0),
        _episode([10], [30, 31, 32], [-0.1, -0.2, -0.3], -0.5),
    ]
    batch = collate(episodes, pad_id=0, device="cpu")
    assert batch.input_ids.tolist() == [[10, 11, 12, 20, 21], [10, 30, 31, 32, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch.completion_mask.tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 0]]
    torch.testing.assert_close(
        batch.old_logprobs, torch.tensor([[0, 0, 0, -0.5, -1.5], [0, -0.1, -0.2, -0.3, 0]])
    )
    assert batch.advantages.tolist() == [1.0, -0.5]
    assert batch.ref_logprobs is None


def test_collate_fills_the_sequence_rewards() -> None:
    """The score's value, a reward the loop set in its place, NaN without a valid reward."""
    scored = [_episode([1], [2], [-0.1], 0.0) for _ in range(4)]
    scored[0].score = Score(1.0, Outcome.PASSED)
    scored[1].score = Score(1.0, Outcome.PASSED)
    scored[1].reward = 0.3
    scored[2].score = Score(0.0, Outcome.INFRA_ERROR)
    rewards = collate(scored, pad_id=0).rewards  # the last one is not scored
    assert rewards.shape == (4,) and rewards[:2].tolist() == pytest.approx([1.0, 0.3])
    assert torch.isnan(rewards[2:]).all()


def test_collate_rejects_mismatched_logprobs() -> None:
    with pytest.raises(ValueError, match="run/0/t/0"):
        collate([_episode([1], [2, 3], [-0.1], 0.0)], pad_id=0)
