"""Speculative decoding inside the paged continuous batch (rollout/speculative_batch.py, the
scheduler's drafting rows): greedy output equals plain decoding token for token, in batches with
joins, leaves, forks and preemption; a seeded sampled row equals its solo run; sampled tokens have
the target's exact distribution (chi-square, ALPHA) and a wrong residual fails the same test; the
logprobs are the target's; `rollout.speculative` is validated at config load."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_speculative import (
    ALPHA,
    VOCAB,
    _exact_three_tokens,
    _peaked,
    _target_logits,
    chi_square_p_value,
)

from tidal.config.schema import ModelConfig, RolloutConfig, TidalConfig
from tidal.models import LoadedModel, load_model
from tidal.rollout import EmbeddedEngine, SamplingParams, speculative_batch
from tidal.rollout.engine import Request
from tidal.rollout.speculative_batch import Speculation
from tidal.types import Completion

NGRAM = Speculation(method="ngram", k=4, max_n=3, min_n=1)


@pytest.fixture(scope="module")
def repeating() -> LoadedModel:
    """The tiny model at its default init: greedy decoding repeats itself, so drafts are kept."""
    return load_model(ModelConfig(path="tiny", device="cpu", seed=0))


def _same(a: list[list[Completion]], b: list[list[Completion]]) -> None:
    for group_a, group_b in zip(a, b, strict=True):
        for ca, cb in zip(group_a, group_b, strict=True):
            assert ca.token_ids == cb.token_ids and ca.finish_reason == cb.finish_reason
            torch.testing.assert_close(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("model_name", ["lively", "repeating"])
@pytest.mark.parametrize("attention", ["view", "gather"])
def test_greedy_equals_plain_decoding_in_a_batch(tiny: LoadedModel, repeating: LoadedModel, prompts: list[list[int]],
                                                 model_name: str, attention: str) -> None:
    """Mixed lengths (rows leave at different steps), groups (forks), blocks of 4 (drafts cross
    block edges); with the repeating model most drafts are kept, with the lively one most are not."""
    loaded = tiny if model_name == "lively" else repeating
    spec = EmbeddedEngine(loaded.model, loaded.tokenizer, kv_block_size=4, decode_attention=attention,
                          speculative=NGRAM)
    plain = EmbeddedEngine(loaded.model, loaded.tokenizer, kv_block_size=4)
    handles = [spec.submit(Request(p, SamplingParams(temperature=0, max_new_tokens=10 + 9 * i, ignore_eos=True), n=2))
               for i, p in enumerate(prompts)]
    while not all(h.done for h in handles):
        spec.step()
    ours = [spec.complete(h) for h in handles]
    theirs = [plain.generate([p], 2, SamplingParams(temperature=0, max_new_tokens=10 + 9 * i, ignore_eos=True))[0]
              for i, p in enumerate(prompts)]
    _same(ours, theirs)
    stats = spec.speculative_stats
    assert stats is not None and stats.drafted > 0
    if model_name == "repeating":
        assert stats.acceptance_rate > 0.5 and stats.tokens_per_pass > 2  # many tokens per verify pass
    metrics = spec.run_metrics()
    assert metrics["spec/drafted"] == stats.drafted and metrics["spec/accepted"] == stats.accepted


def test_greedy_under_preemption_equals_an_unconstrained_run(repeating: LoadedModel, prompts: list[list[int]]) -> None:
    """A pool of 30 blocks of 4 for 6 rows of 40 tokens: drafts get cut where no block is free,
    rows are preempted and recomputed, and the output is still plain decoding's."""
    params = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
    small = EmbeddedEngine(repeating.model, repeating.tokenizer, kv_block_size=4, kv_blocks=30, speculative=NGRAM)
    plain = EmbeddedEngine(repeating.model, repeating.tokenizer, kv_block_size=4)
    _same(small.generate(prompts[:2], 3, params), plain.generate(prompts[:2], 3, params))
    assert small.stats.preemptions > 0


def test_a_seeded_sampled_row_equals_its_solo_run(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    """A seeded request's samples do not depend on what else is in the batch, nor on when it joins."""
    request = Request(prompts[1], SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=24, seed=5), n=3)
    solo = EmbeddedEngine(tiny.model, tiny.tokenizer, speculative=NGRAM)
    (alone,) = solo.run([request])
    busy = EmbeddedEngine(tiny.model, tiny.tokenizer, speculative=NGRAM)
    other = busy.submit(Request(prompts[2], SamplingParams(temperature=1.0, max_new_tokens=30), n=4))
    for _ in range(3):
        busy.step()  # the seeded request joins a running batch
    joined = busy.submit(Request(request.prompt, request.params, request.n))
    while not (joined.done and other.done):
        busy.step()
    _same([solo.complete(alone)], [busy.complete(joined)])


def _first_three(model: torch.nn.Module, tokenizer: object, sampling: SamplingParams, samples: int) -> torch.Tensor:
    """The first three tokens of `samples` seeded completions of one prompt, as one batched request."""
    engine = EmbeddedEngine(model, tokenizer, kv_block_size=4,  # type: ignore[arg-type]
                            speculative=Speculation(method="ngram", k=2, max_n=3, min_n=1))
    params = replace(sampling, max_new_tokens=4, ignore_eos=True, seed=7)
    (group,) = engine.generate([[3, 7, 1, 3, 7, 1, 3, 7]], samples, params)
    stats = engine.speculative_stats
    assert stats is not None and 0 < stats.accepted < stats.drafted  # kept drafts, rejections and bonus tokens
    return torch.tensor([c.token_ids[:3] for c in group])


def _p_values(outputs: torch.Tensor, model: torch.nn.Module, sampling: SamplingParams) -> list[float]:
    joint, third = _exact_three_tokens(model, [3, 7, 1, 3, 7, 1, 3, 7], sampling)  # type: ignore[arg-type]
    pairs = torch.bincount(outputs[:, 0] * VOCAB + outputs[:, 1], minlength=VOCAB * VOCAB)
    return [chi_square_p_value(pairs, joint), chi_square_p_value(torch.bincount(outputs[:, 2], minlength=VOCAB), third)]


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), [(1.0, 1.0, None), (0.9, 0.9, None), (1.0, 1.0, 5)])
def test_batched_speculative_samples_have_the_target_distribution(tiny: LoadedModel, temperature: float,
                                                                  top_p: float, top_k: int | None) -> None:
    """1500 rows of one batch (k=2): the joint distribution of the first two tokens and the
    marginal of the third against the exact ones computed from the model."""
    model, sampling = _peaked(0), SamplingParams(temperature, top_p=top_p, top_k=top_k)
    p_values = _p_values(_first_three(model, tiny.tokenizer, sampling, 1500), model, sampling)
    assert min(p_values) > ALPHA, p_values


def test_a_wrong_residual_fails_the_distribution_test(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: after a rejection, sampling p itself (the rejected draft not removed) is biased."""
    monkeypatch.setattr(speculative_batch, "residual", lambda p, rejected: p)
    model, sampling = _peaked(0), SamplingParams(0.9, top_p=0.9)
    p_values = _p_values(_first_three(model, tiny.tokenizer, sampling, 1500), model, sampling)
    assert min(p_values) < ALPHA, p_values


def test_logprobs_are_the_targets_teacher_forced(tiny: LoadedModel) -> None:
    model = _peaked(0)
    engine = EmbeddedEngine(model, tiny.tokenizer, kv_block_size=4, speculative=NGRAM)  # type: ignore[arg-type]
    prompt = [3, 7, 1, 3, 7, 1, 3, 7]
    params = SamplingParams(temperature=0.7, top_p=0.8, max_new_tokens=24, ignore_eos=True, seed=3)
    for completion in engine.generate([prompt], 4, params)[0]:
        logits = _target_logits(model, prompt + completion.token_ids)[len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-5, rtol=0)
    stats = engine.speculative_stats
    assert stats is not None and stats.accepted > 0


def test_speculative_config_is_validated_at_load() -> None:
    rollout = RolloutConfig.model_validate({"speculative": {"method": "suffix", "k": 6}})
    assert rollout.speculative is not None and rollout.speculative.k == 6
    bad = [
        ({"speculative": {"method": "eagle"}}, "method"),
        ({"speculative": {"k": 0}}, "k"),
        ({"speculative": {"min_n": 5, "max_n": 3}}, "min_n"),
        ({"speculative": {"depth": 3}}, "depth"),
    ]
    for section, word in bad:
        with pytest.raises(ValueError, match=word):
            RolloutConfig.model_validate(section)
    with pytest.raises(ValueError, match="speculative"):
        TidalConfig.model_validate({"rollout": {"engine": "http", "http": {"base_url": "http://h:1/v1", "model": "m"},
                                                "speculative": {}}})


def test_the_config_reaches_the_engine(tiny: LoadedModel) -> None:
    rollout = RolloutConfig.model_validate({"speculative": {"method": "suffix", "k": 3, "min_match": 2}})
    engine = EmbeddedEngine.from_config(tiny.model, tiny.tokenizer, "cpu", rollout)
    assert engine.options["speculative"] == Speculation(method="suffix", k=3, min_match=2)
    assert engine.speculative_stats is not None
    with pytest.raises(ValueError, match="k=0"):
        Speculation(k=0)
