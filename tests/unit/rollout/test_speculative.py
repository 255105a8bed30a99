"""Speculative decoding (rollout/speculative.py): greedy output and logprobs equal the embedded
engine's plain decoding; sampled output has the target's distribution (chi-square against the exact
distribution computed from the model, at ALPHA; two deliberately wrong acceptance rules must fail
the same test); logprobs follow the engine's convention; stats are counted.

The statistical tests use a small-vocabulary model with peaked distributions, so that a draft token
often carries much of the mass and a biased rule moves many samples."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor
from transformers import Qwen2Config, Qwen2ForCausalLM

from tidal.models import LoadedModel
from tidal.rollout import EmbeddedEngine, SamplingParams, speculative
from tidal.rollout.drafting import ModelDrafter, NGramDrafter, SuffixDrafter
from tidal.rollout.speculative import Draft, Sampling, SpeculativeDecoder, verify

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


# --------------------------------------------------------------------------- the rule alone


def _target_logits(model: Qwen2ForCausalLM, prefix: list[int]) -> Tensor:
    """Logits (L, V) at every position of `prefix`."""
    with torch.no_grad():
        return model(torch.tensor([prefix])).logits[0].float()


def _wrong_rule(monkeypatch: pytest.MonkeyPatch, bug: str) -> None:
    if bug == "always_accept":
        monkeypatch.setattr(speculative, "accept_probability", lambda p, q: torch.ones_like(p))
    elif bug == "resample_from_p":  # the classic slip: after a rejection, sample p, not the residual
        monkeypatch.setattr(speculative, "residual", lambda p, q: p)
    else:
        assert bug == "none"


def _rule_p_values(peaked: Qwen2ForCausalLM, sampling: Sampling, sampled_draft: bool, rows: int = 20000) -> list[float]:
    """Run `verify` on `rows` copies of one prefix with 1 draft: p-values of the first emitted token
    against the target's distribution, and of the bonus token after an accepted draft against the
    target's distribution after that draft."""
    prefix = [3, 7, 1, 3, 7, 1, 3]
    generator = torch.Generator().manual_seed(1)
    # All VOCAB one-token continuations in one batch: p(. | prefix) and p(. | prefix, v) for every v.
    contexts = torch.tensor([prefix + [v] for v in range(VOCAB)])
    with torch.no_grad():
        logits = peaked(contexts).logits[:, -2:].float()  # (V, 2, V)
    p_first = sampling.probs(logits[0, 0])  # (V,)
    if sampled_draft:
        draft_model = _peaked(5)
        with torch.no_grad():
            q = sampling.probs(draft_model(torch.tensor([prefix])).logits[0, -1].float())  # (V,)
        drafts = torch.multinomial(q, rows, replacement=True, generator=generator)  # (rows,)
        draft_probs = q.expand(rows, 1, VOCAB)
    else:
        drafts = torch.full((rows,), int(p_first.argmax()))  # the likeliest token: a rejection path bias shows
        draft_probs = None
    verdict = verify(logits[drafts], drafts[:, None], torch.ones(rows, dtype=torch.long), draft_probs, sampling,
                     generator)
    first = verdict.tokens[:, 0]
    p_values = [chi_square_p_value(torch.bincount(first, minlength=VOCAB), p_first)]
    # The bonus token after an accepted draft v must follow p(. | prefix, v): the commonest v.
    accepted = verdict.accepted == 1
    common = int(torch.bincount(first[accepted], minlength=VOCAB).argmax())
    bonus = verdict.tokens[accepted & (first == common), 1]
    p_values.append(chi_square_p_value(torch.bincount(bonus, minlength=VOCAB), sampling.probs(logits[common, 1])))
    return p_values


@pytest.mark.parametrize("sampled_draft", [False, True], ids=["point-mass-draft", "sampled-draft"])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.8, 0.7)])
def test_rule_keeps_the_target_distribution(peaked: Qwen2ForCausalLM, temperature: float, top_p: float,
                                            sampled_draft: bool) -> None:
    p_values = _rule_p_values(peaked, Sampling(temperature, top_p), sampled_draft)
    assert min(p_values) > ALPHA, p_values


@pytest.mark.parametrize("bug", ["always_accept", "resample_from_p"])
@pytest.mark.parametrize("sampled_draft", [False, True], ids=["point-mass-draft", "sampled-draft"])
def test_a_wrong_rule_fails_the_same_test(peaked: Qwen2ForCausalLM, monkeypatch: pytest.MonkeyPatch, bug: str,
                                          sampled_draft: bool) -> None:
    _wrong_rule(monkeypatch, bug)
    p_values = _rule_p_values(peaked, Sampling(1.0, 1.0), sampled_draft)
    assert p_values[0] < ALPHA, p_values


def test_greedy_rule_is_argmax_match() -> None:
    logits = torch.tensor([[[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]]] * 2)  # (2, 3, 3)
    drafts = torch.tensor([[1, 0], [1, 2]])
    verdict = verify(logits, drafts, torch.tensor([2, 2]), None, Sampling(0.0), None)
    assert verdict.accepted.tolist() == [2, 1]
    assert verdict.tokens[0].tolist() == [1, 0, 2]  # both kept, then the bonus argmax
    assert verdict.tokens[1, :2].tolist() == [1, 0]  # draft 2 rejected: the argmax replaces it
    expected = torch.log_softmax(logits[0], -1).gather(-1, verdict.tokens[0][:, None]).squeeze(-1)
    assert torch.allclose(verdict.logprobs[0], expected)


# --------------------------------------------------------------------------- the decoder, sampling


def _exact_three_tokens(model: Qwen2ForCausalLM, prompt: list[int], sampling: Sampling) -> tuple[Tensor, Tensor]:
    """The target's exact distribution of (t1, t2), (V, V), and of t3, (V,), after `prompt`."""
    pairs = torch.tensor([prompt + [a, b] for a in range(VOCAB) for b in range(VOCAB)])
    with torch.no_grad():
        logits = model(pairs).logits[:, -3:].float()  # (V * V, 3, V)
    p1 = sampling.probs(logits[0, 0])  # (V,)
    p2 = sampling.probs(logits[::VOCAB, 1])  # (V, V): p(t2 | t1)
    p3 = sampling.probs(logits[:, 2]).view(VOCAB, VOCAB, VOCAB)  # p(t3 | t1, t2)
    joint = p1[:, None] * p2
    return joint, (joint[..., None] * p3).sum(dim=(0, 1))


def _end_to_end_p_values(model: Qwen2ForCausalLM, drafter: object, sampling: Sampling, samples: int) -> list[float]:
    prompt = [3, 7, 1, 3, 7, 1, 3, 7]
    decoder = SpeculativeDecoder(model, drafter, k=2)  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(2)
    outputs = torch.tensor([
        decoder.generate(prompt, 3, sampling.temperature, sampling.top_p, generator).tokens for _ in range(samples)
    ])  # (samples, 3)
    joint, third = _exact_three_tokens(model, prompt, sampling)
    pair_counts = torch.bincount(outputs[:, 0] * VOCAB + outputs[:, 1], minlength=VOCAB * VOCAB)
    return [chi_square_p_value(pair_counts, joint), chi_square_p_value(torch.bincount(outputs[:, 2], minlength=VOCAB), third)]


@pytest.mark.parametrize("drafter_name", ["ngram", "draft-model"])
def test_generated_tokens_have_the_target_distribution(peaked: Qwen2ForCausalLM, drafter_name: str) -> None:
    """The first three tokens of 1000-1500 generations (k=2: drafts kept, rejected, bonus tokens)
    against the exact joint distribution of the first two and the exact marginal of the third."""
    drafter = NGramDrafter(max_n=3, min_n=1) if drafter_name == "ngram" else ModelDrafter(_peaked(5))
    samples = 1500 if drafter_name == "ngram" else 1000  # a draft model costs k forwards more
    p_values = _end_to_end_p_values(peaked, drafter, Sampling(0.9, 0.9), samples)
    assert min(p_values) > ALPHA, p_values


def test_generated_tokens_with_a_wrong_rule_fail(peaked: Qwen2ForCausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    _wrong_rule(monkeypatch, "resample_from_p")
    p_values = _end_to_end_p_values(peaked, NGramDrafter(max_n=3, min_n=1), Sampling(0.9, 0.9), samples=1500)
    assert min(p_values) < ALPHA, p_values


def test_sampled_logprobs_are_the_targets(peaked: Qwen2ForCausalLM) -> None:
    """Every emitted token's logprob is log_softmax(logits / T) before top-p, teacher-forced."""
    prompt = [3, 7, 1, 3, 7, 1, 3, 7]
    sampling = Sampling(0.7, 0.8)
    decoder = SpeculativeDecoder(peaked, NGramDrafter(max_n=3, min_n=1), k=3)
    result = decoder.generate(prompt, 24, sampling.temperature, sampling.top_p, torch.Generator().manual_seed(3))
    assert result.stats.accepted > 0 and result.stats.accepted < result.stats.drafted  # both paths ran
    logits = _target_logits(peaked, prompt + result.tokens)[len(prompt) - 1 : -1]  # (24, V)
    expected = sampling.log_probs(logits).gather(-1, torch.tensor(result.tokens)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-5)


# --------------------------------------------------------------------------- the decoder, greedy


@pytest.mark.parametrize("drafter_name", ["ngram", "suffix", "draft-model", "same-model"])
def test_greedy_equals_plain_decoding(tiny: LoadedModel, make_tiny: Callable[[int], LoadedModel],
                                      prompts: list[list[int]], drafter_name: str) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    params = SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True)
    drafters = {
        "ngram": lambda: NGramDrafter(max_n=3, min_n=1),
        "suffix": lambda: SuffixDrafter(min_match=1),
        "draft-model": lambda: ModelDrafter(make_tiny(1).model),
        "same-model": lambda: ModelDrafter(tiny.model),
    }
    decoder = SpeculativeDecoder(tiny.model, drafters[drafter_name](), k=4)
    for prompt in prompts[1:]:
        plain = engine.generate([prompt], 1, params)[0][0]
        result = decoder.generate(prompt, 40, temperature=0.0)
        assert result.tokens == plain.token_ids
        assert torch.allclose(torch.tensor(result.logprobs), torch.tensor(plain.logprobs), atol=1e-4)
        assert result.stats.drafted > 0
        if drafter_name == "draft-model":
            assert result.stats.accepted < result.stats.drafted  # rejections rolled the cache back


def test_stats_count_a_drafter_that_is_always_right(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    """The target drafting for itself greedily: every draft is kept, k + 1 tokens per verify pass."""
    decoder = SpeculativeDecoder(tiny.model, ModelDrafter(tiny.model), k=4)
    stats = decoder.generate(prompts[1], 40, temperature=0.0).stats
    assert (stats.drafted, stats.accepted, stats.emitted, stats.rounds, stats.target_passes) == (32, 32, 40, 8, 9)
    assert stats.acceptance_rate == 1.0 and stats.tokens_per_pass == 5.0
    plain = SpeculativeDecoder(tiny.model, None, k=4).generate(prompts[1], 40, temperature=0.0).stats
    assert (plain.drafted, plain.rounds, plain.target_passes, plain.acceptance_rate) == (0, 40, 41, 0.0)


def test_eos_ends_the_completion_inside_a_draft(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    decoder = SpeculativeDecoder(tiny.model, ModelDrafter(tiny.model), k=4)
    full = decoder.generate(prompts[1], 40, temperature=0.0)
    stop = full.tokens[6]  # the 7th token: inside the second verify pass's kept drafts
    cut = full.tokens.index(stop) + 1
    result = decoder.generate(prompts[1], 40, temperature=0.0, eos_ids=[stop])
    assert result.finish_reason == "stop" and result.tokens == full.tokens[:cut]
    assert result.logprobs == full.logprobs[:cut] and full.finish_reason == "length"


def test_batch_loop_feeds_the_corpus(tiny: LoadedModel) -> None:
    """A group's later samples draft from its first (SuffixDrafter learns finished completions)."""
    prompt = [10, 20, 30, 40]
    decoder = SpeculativeDecoder(tiny.model, SuffixDrafter(min_match=2), k=4)
    results, total = decoder.generate_batch([prompt], 3, 24, temperature=0.0)
    assert [r.tokens for r in results[0]][1:] == [results[0][0].tokens] * 2
    first, later = results[0][0].stats, results[0][1].stats
    assert later.accepted > first.accepted and later.rounds < first.rounds
    assert total.emitted == sum(r.stats.emitted for r in results[0])


def test_a_drafter_proposing_more_than_k_is_cut(peaked: Qwen2ForCausalLM) -> None:
    class Eager:
        def session(self, prompt: list[int]) -> Eager:
            return self

        def finish(self, prompt: list[int], completion: list[int]) -> None:
            pass

        def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
            return Draft([1] * (k + 5))

        def extend(self, tokens: list[int]) -> None:
            pass

    result = SpeculativeDecoder(peaked, Eager(), k=2).generate([1, 2], 7, temperature=0.0)
    assert len(result.tokens) == 7 and result.stats.drafted <= 2 * result.stats.rounds


def test_speculative_engine_serves_the_rollout_protocol(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    """Behind `RolloutEngine`: greedy completions (eos, text, finish reason) equal the embedded engine's."""
    from tidal.errors import PreemptedError
    from tidal.rollout import RolloutEngine
    from tidal.rollout.speculative_engine import SpeculativeEngine

    engine = SpeculativeEngine(tiny.model, tiny.tokenizer, SuffixDrafter(), k=4)
    assert isinstance(engine, RolloutEngine)
    params = SamplingParams(temperature=0.0, max_new_tokens=48)
    engine.update_weights(None, 3)
    ours = engine.generate(prompts, 2, params)
    theirs = EmbeddedEngine(tiny.model, tiny.tokenizer).generate(prompts, 2, params)
    for group, reference in zip(ours, theirs):
        for mine, plain in zip(group, reference):
            assert (mine.token_ids, mine.text, mine.finish_reason) == (plain.token_ids, plain.text, plain.finish_reason)
            assert mine.weight_version == 3
    assert engine.stats.drafted > 0 and engine.stats.emitted >= sum(len(c.token_ids) for g in ours for c in g)
    with pytest.raises(ValueError, match="stop strings"):
        engine.generate(prompts, 1, SamplingParams(stop=["x"]))

    class Set:
        def is_set(self) -> bool:
            return True

    with pytest.raises(PreemptedError):
        engine.generate(prompts, 1, params, cancel=Set())
