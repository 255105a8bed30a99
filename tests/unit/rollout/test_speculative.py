"""Speculative verification (rollout/speculative_batch.py, `verify_rows`) alone: the acceptance rule
keeps the target's distribution (chi-square against the exact distribution computed from the model,
at ALPHA; a deliberately wrong residual must fail the same test), greedy rows keep exactly the
argmax matches, and the logprobs are plain sampling's. The helpers serve test_speculative_batch.py.

The statistical tests use a small-vocabulary model with peaked distributions, so that a draft token
often carries much of the mass and a biased rule moves many samples."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from transformers import Qwen2Config, Qwen2ForCausalLM

from tidal.rollout import SamplingParams, speculative_batch
from tidal.rollout.sampling import distributions
from tidal.rollout.speculative_batch import verify_rows

ALPHA = 1e-3  # significance of every distribution test; a correct rule fails one about once in 1000 seeds
VOCAB = 12


def _peaked(seed: int) -> Qwen2ForCausalLM:
    """A random 12-token model whose head is scaled up: the most likely token gets 20-50% of the mass."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    return model


@pytest.fixture(scope="module")
def peaked() -> Qwen2ForCausalLM:
    return _peaked(0)


def chi_square_p_value(counts: Tensor, probs: Tensor) -> float:
    """P-value of Pearson's chi-square test of `counts` (C,) against `probs` (C,). Cells expecting
    fewer than 5 samples are pooled into one; a sample in a cell of probability 0 gives 0."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    total = float(counts.sum())
    if bool((counts[probs <= 0] > 0).any()):
        return 0.0
    expected = probs * total
    big = expected >= 5
    observed_cells = torch.cat([counts[big], counts[~big].sum()[None]])
    expected_cells = torch.cat([expected[big], expected[~big].sum()[None]])
    if expected_cells[-1] < 5:  # too small to stand alone: join the smallest kept cell
        smallest = int(expected_cells[:-1].argmin())
        observed_cells[smallest] += observed_cells[-1]
        expected_cells[smallest] += expected_cells[-1]
        observed_cells, expected_cells = observed_cells[:-1], expected_cells[:-1]
    statistic = float(((observed_cells - expected_cells) ** 2 / expected_cells).sum())
    freedom = len(expected_cells) - 1
    # The chi-square survival function: the regularised upper incomplete gamma Q(df/2, x/2).
    return float(torch.special.gammaincc(torch.tensor(freedom / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def test_chi_square_p_value_is_calibrated() -> None:
    generator = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    fair = torch.bincount(torch.multinomial(probs, 4000, replacement=True, generator=generator), minlength=4)
    assert chi_square_p_value(fair, probs) > ALPHA
    skewed = torch.tensor([0.45, 0.33, 0.16, 0.06])
    unfair = torch.bincount(torch.multinomial(skewed, 4000, replacement=True, generator=generator), minlength=4)
    assert chi_square_p_value(unfair, probs) < ALPHA
    assert chi_square_p_value(torch.tensor([10, 0, 0, 1]), torch.tensor([0.5, 0.5, 0.0, 0.0])) == 0.0
    # One degree of freedom: statistic 100 (expected 50 and 50), p = erfc(sqrt(100 / 2)).
    assert math.isclose(chi_square_p_value(torch.tensor([100, 0]), torch.tensor([0.5, 0.5])),
                        math.erfc(math.sqrt(50)), rel_tol=1e-6)


def probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """What `params` samples from at each row of `logits` (..., V), normalised: (..., V)."""
    flat = logits.reshape(-1, logits.shape[-1])
    weights = distributions(flat, [params] * flat.shape[0]).weights
    return (weights / weights.sum(dim=-1, keepdim=True)).view(logits.shape)


def _target_logits(model: Qwen2ForCausalLM, prefix: list[int]) -> Tensor:
    """Logits (L, V) at every position of `prefix`."""
    with torch.no_grad():
        return model(torch.tensor([prefix])).logits[0].float()


def _exact_three_tokens(model: Qwen2ForCausalLM, prompt: list[int], params: SamplingParams) -> tuple[Tensor, Tensor]:
    """The target's exact distribution of (t1, t2), (V, V), and of t3, (V,), after `prompt`."""
    pairs = torch.tensor([prompt + [a, b] for a in range(VOCAB) for b in range(VOCAB)])
    with torch.no_grad():
        logits = model(pairs).logits[:, -3:].float()  # (V * V, 3, V)
    p1 = probs(logits[0, 0][None], params)[0]  # (V,)
    p2 = probs(logits[::VOCAB, 1], params)  # (V, V): p(t2 | t1)
    p3 = probs(logits[:, 2], params).view(VOCAB, VOCAB, VOCAB)  # p(t3 | t1, t2)
    joint = p1[:, None] * p2
    return joint, (joint[..., None] * p3).sum(dim=(0, 1))


# --------------------------------------------------------------------------- the rule alone


def _rule_p_values(peaked: Qwen2ForCausalLM, params: SamplingParams, rows: int = 20000) -> list[float]:
    """Run `verify_rows` on `rows` copies of one prefix, each drafting the likeliest token (so a
    bias of the rejection path shows): p-values of the first emitted token against the target's
    distribution, and of the bonus token after the accepted draft against the target's
    distribution after it."""
    prefix = [3, 7, 1, 3, 7, 1, 3]
    shared = torch.Generator().manual_seed(1)
    contexts = torch.tensor([prefix + [v] for v in range(VOCAB)])
    with torch.no_grad():
        logits = peaked(contexts).logits[:, -2:].float()  # (V, 2, V): p(. | prefix) and p(. | prefix, v)
    p_first = probs(logits[0, 0][None], params)[0]  # (V,)
    draft = int(p_first.argmax())
    verdicts = verify_rows(logits[draft].expand(rows, 2, VOCAB).contiguous(), [[draft]] * rows, [params] * rows,
                           [None] * rows, shared)
    first = torch.tensor([tokens[0] for tokens in verdicts.tokens])
    p_values = [chi_square_p_value(torch.bincount(first, minlength=VOCAB), p_first)]
    bonus = torch.tensor([tokens[1] for tokens, kept in zip(verdicts.tokens, verdicts.accepted) if kept == 1])
    p_values.append(chi_square_p_value(torch.bincount(bonus, minlength=VOCAB), probs(logits[draft, 1][None], params)[0]))
    return p_values


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.8, top_p=0.7), SamplingParams(1.2, top_k=4)],
                         ids=["plain", "top-p", "top-k"])
def test_rule_keeps_the_target_distribution(peaked: Qwen2ForCausalLM, params: SamplingParams) -> None:
    p_values = _rule_p_values(peaked, params)
    assert min(p_values) > ALPHA, p_values


def test_a_wrong_residual_fails_the_same_test(peaked: Qwen2ForCausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The classic slip: after a rejection, sample p (the rejected draft not removed)."""
    monkeypatch.setattr(speculative_batch, "residual", lambda p, rejected: p)
    p_values = _rule_p_values(peaked, SamplingParams(1.0))
    assert p_values[0] < ALPHA, p_values


def test_greedy_rule_is_argmax_match() -> None:
    logits = torch.tensor([[[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]]] * 2)  # (2, 3, 3)
    greedy = SamplingParams(temperature=0)
    verdicts = verify_rows(logits, [[1, 0], [1, 2]], [greedy] * 2, [torch.Generator().manual_seed(0), None],
                           torch.Generator().manual_seed(1))
    assert verdicts.accepted == [2, 1]
    assert verdicts.tokens[0] == [1, 0, 2]  # both kept, then the bonus argmax
    assert verdicts.tokens[1] == [1, 0]  # draft 2 rejected: the argmax replaces it
    expected = torch.log_softmax(logits[0], -1).gather(-1, torch.tensor(verdicts.tokens[0])[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(verdicts.logprobs[0]), expected)


def test_verified_logprobs_are_plain_samplings() -> None:
    """Every position's reported logprob is the one plain sampling reports for that token: the
    tempered log_softmax before top-k and top-p, whatever was kept."""
    logits = torch.randn(3, 4, VOCAB, generator=torch.Generator().manual_seed(4))
    params = [SamplingParams(0.7, top_p=0.8), SamplingParams(1.3, top_k=3), SamplingParams(0.0)]
    verdicts = verify_rows(logits, [[1, 2, 3], [4], []], params, [None] * 3, torch.Generator().manual_seed(5))
    for row, (tokens, values) in enumerate(zip(verdicts.tokens, verdicts.logprobs)):
        scale = params[row].temperature or 1.0
        expected = torch.log_softmax(logits[row, : len(tokens)] / scale, -1).gather(-1, torch.tensor(tokens)[:, None])
        torch.testing.assert_close(torch.tensor(values), expected.squeeze(-1), atol=1e-6, rtol=0)
