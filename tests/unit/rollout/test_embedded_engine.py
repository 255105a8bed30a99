from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tidal.models import LoadedModel
from tidal.rollout import EmbeddedEngine, RolloutEngine, SamplingParams
from tidal.types import Completion


def _reference_greedy(tiny: LoadedModel, prompt: list[int], max_new: int) -> list[int]:
    """Greedy decoding the slow way: a full forward pass per token, no cache, no batch, no padding."""
    ids = list(prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_new):
            token = int(tiny.model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
            if token == tiny.tokenizer.eos_token_id:
                break
    return out


def _recomputed_logprobs(tiny: LoadedModel, completion: Completion, temperature: float) -> torch.Tensor:
    ids = torch.tensor([completion.prompt_ids + completion.token_ids])
    with torch.no_grad():
        logits = tiny.model(ids).logits[0, len(completion.prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(1, torch.tensor(completion.token_ids)[:, None]).squeeze(1)


ENGINES = {
    "paged": lambda m, t: EmbeddedEngine(m, t),
    "paged-gather": lambda m, t: EmbeddedEngine(m, t, decode_attention="gather"),
    "paged-generic": lambda m, t: EmbeddedEngine(m, t, forward="generic"),
    "paged-generic-gather": lambda m, t: EmbeddedEngine(m, t, decode_attention="gather", forward="generic"),
}


def test_is_a_rollout_engine(tiny: LoadedModel) -> None:
    assert isinstance(EmbeddedEngine(tiny.model, tiny.tokenizer), RolloutEngine)


@pytest.mark.parametrize("kind", list(ENGINES))
def test_greedy_matches_uncached_reference(tiny: LoadedModel, prompts: list[list[int]], kind: str) -> None:
    engine = ENGINES[kind](tiny.model, tiny.tokenizer)
    results = engine.generate(prompts, n=2, params=SamplingParams(temperature=0, max_new_tokens=12))
    assert [len(group) for group in results] == [2, 2, 2]
    for prompt, group in zip(prompts, results):
        expected = _reference_greedy(tiny, prompt, 12)
        for completion in group:
            assert completion.prompt_ids == prompt
            assert completion.token_ids == expected
            assert completion.text == tiny.tokenizer.decode(expected, skip_special_tokens=True)
            assert completion.finish_reason == ("stop" if expected[-1] == tiny.tokenizer.eos_token_id else "length")


def test_chunked_batches_give_the_same_greedy_output(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    params = SamplingParams(temperature=0, max_new_tokens=6)
    whole = EmbeddedEngine(tiny.model, tiny.tokenizer).generate(prompts, n=3, params=params)
    # 2 rows per pass: prompts are split across passes and so are one prompt's 3 samples.
    chunked = EmbeddedEngine(tiny.model, tiny.tokenizer, max_batch_rows=2).generate(prompts, n=3, params=params)
    assert [[c.token_ids for c in g] for g in chunked] == [[c.token_ids for c in g] for g in whole]


def test_each_prompt_is_prefilled_once(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer, prefix_cache=False)
    engine.generate(prompts, n=8, params=SamplingParams(max_new_tokens=3, seed=0))
    total = sum(len(p) for p in prompts)
    assert engine.stats.prompt_tokens == 8 * total
    assert engine.stats.forked_tokens == 7 * total, "one prefill per group: the other 7 samples fork from it"
    assert engine.stats.hit_rate == pytest.approx(7 / 8)
    assert engine.run_metrics()["engine/reuse_rate"] == pytest.approx(7 / 8)  # the run's metrics rows


@pytest.mark.parametrize(("temperature", "top_p", "top_k"),
                         [(1.0, 1.0, None), (0.7, 0.9, None), (0.0, 1.0, None), (1.2, 0.9, 5)])
def test_logprobs_match_a_full_forward_pass(
    tiny: LoadedModel, prompts: list[list[int]], temperature: float, top_p: float, top_k: int | None
) -> None:
    """The behaviour logprob: log_softmax(logits / T) before any truncation (top-k, top-p)."""
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=10, seed=1)
    for group in engine.generate(prompts, n=3, params=params):
        for completion in group:
            assert len(completion.logprobs) == len(completion.token_ids)
            expected = _recomputed_logprobs(tiny, completion, temperature)
            torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


def test_samples_differ_and_the_seed_reproduces_them(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=123)
    first = engine.generate(prompts, n=4, params=params)
    again = engine.generate(prompts, n=4, params=params)
    other = engine.generate(prompts, n=4, params=SamplingParams(temperature=1.0, max_new_tokens=8, seed=124))
    tokens = [[c.token_ids for c in group] for group in first]
    assert tokens == [[c.token_ids for c in group] for group in again]
    assert tokens != [[c.token_ids for c in group] for group in other]
    for group in tokens:
        assert len({tuple(t) for t in group}) > 1, "samples of one prompt must differ at temperature 1"


def test_tiny_top_p_is_greedy(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    greedy = engine.generate(prompts, n=1, params=SamplingParams(temperature=0, max_new_tokens=8))
    nucleus = engine.generate(prompts, n=2, params=SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=8, seed=5))
    for g, group in zip(greedy, nucleus):
        assert all(c.token_ids == g[0].token_ids for c in group)


def test_top_k_keeps_the_k_likeliest_tokens(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    greedy = engine.generate(prompts, n=1, params=SamplingParams(temperature=0, max_new_tokens=8))
    one = engine.generate(prompts, n=2, params=SamplingParams(temperature=1.5, top_k=1, max_new_tokens=8, seed=5))
    for g, group in zip(greedy, one):
        assert all(c.token_ids == g[0].token_ids for c in group)
    params = SamplingParams(temperature=2.0, top_k=3, max_new_tokens=6, seed=6)
    for group in engine.generate(prompts, n=8, params=params):
        for completion in group:
            ids = torch.tensor([completion.prompt_ids + completion.token_ids])
            with torch.no_grad():
                logits = tiny.model(ids).logits[0, len(completion.prompt_ids) - 1 : -1]
            rank = (logits > logits.gather(1, torch.tensor(completion.token_ids)[:, None])).sum(dim=1)
            assert int(rank.max()) < 3, "every sampled token is among the 3 likeliest"
    wide = engine.generate(prompts, n=8, params=SamplingParams(temperature=2.0, max_new_tokens=6, seed=6))
    assert [[c.token_ids for c in g] for g in wide] != [[c.token_ids for c in g] for g in
                                                        engine.generate(prompts, n=8, params=params)]


def test_stop_string_cuts_the_text(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    free = engine.generate(prompts[:1], n=1, params=SamplingParams(temperature=1.0, max_new_tokens=40, seed=7))[0][0]
    # A stop string taken from the middle of what the same seed produces without one.
    text = free.text
    start = next(i for i in range(2, len(text)) if text[i].isascii() and text[i].isprintable())
    stop = text[start]
    cut = text.find(stop)
    params = SamplingParams(temperature=1.0, max_new_tokens=40, seed=7, stop=[stop, "never-produced"])
    stopped = engine.generate(prompts[:1], n=1, params=params)[0][0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == text[:cut]
    assert free.token_ids[: len(stopped.token_ids)] == stopped.token_ids
    # Generation ends with the token that completes the stop string, not later.
    assert stop in tiny.tokenizer.decode(stopped.token_ids)
    assert stop not in tiny.tokenizer.decode(stopped.token_ids[:-1])
    assert len(stopped.logprobs) == len(stopped.token_ids)


def test_eos_and_length_finish_reasons(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    eos = tiny.tokenizer.eos_token_id
    # Enough draws from a near-uniform random model that some samples pick eos (about 5 of 64 per
    # seed; seed 0 happens to draw none); rows that finish early leave the batch while the others go on.
    groups = engine.generate(prompts[:2], n=32, params=SamplingParams(temperature=1.0, max_new_tokens=24, seed=1))
    completions = [c for group in groups for c in group]
    stopped = [c for c in completions if c.finish_reason == "stop"]
    assert stopped, "expected some samples to end with eos"
    for c in stopped:
        assert c.token_ids[-1] == eos and eos not in c.token_ids[:-1] and len(c.token_ids) <= 24
        assert c.text == tiny.tokenizer.decode(c.token_ids[:-1], skip_special_tokens=True)
    for c in completions:
        if c.finish_reason == "length":
            assert len(c.token_ids) == 24 and eos not in c.token_ids
    forced = engine.generate(prompts[:2], n=32, params=SamplingParams(max_new_tokens=24, seed=0, ignore_eos=True))
    assert all(len(c.token_ids) == 24 and c.finish_reason == "length" for g in forced for c in g)


def test_max_new_tokens_gives_length(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    groups = engine.generate(prompts, n=2, params=SamplingParams(temperature=0, max_new_tokens=1))
    assert all(len(c.token_ids) == 1 for g in groups for c in g)
    assert all(c.finish_reason == "length" for g in groups for c in g if c.token_ids[0] != tiny.tokenizer.eos_token_id)


def test_update_weights_changes_outputs_and_version(
    prompts: list[list[int]], make_tiny: Callable[[int], LoadedModel]
) -> None:
    policy = make_tiny(0)
    engine = EmbeddedEngine(policy.model, policy.tokenizer)
    params = SamplingParams(temperature=0, max_new_tokens=8)
    before = engine.generate(prompts, n=1, params=params)
    assert all(c.weight_version == 0 for g in before for c in g)

    trained = make_tiny(1).model
    engine.update_weights({k: v.clone() for k, v in trained.state_dict().items()}, version=3)
    after = engine.generate(prompts, n=1, params=params)
    assert all(c.weight_version == 3 for g in after for c in g)
    assert [g[0].token_ids for g in after] != [g[0].token_ids for g in before]
    assert torch.equal(policy.model.model.embed_tokens.weight, trained.model.embed_tokens.weight)

    # Shared model: the trainer changed it in place; only the version moves.
    with torch.no_grad():
        policy.model.model.norm.weight.mul_(-1.0)
    engine.update_weights(None, version=4)
    shared = engine.generate(prompts, n=1, params=params)
    assert all(c.weight_version == 4 for g in shared for c in g)
    assert [g[0].token_ids for g in shared] != [g[0].token_ids for g in after]

    with pytest.raises(ValueError, match="does not have"):
        engine.update_weights({"not.a.weight": torch.zeros(1)}, version=5)
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights({"model.norm.weight": torch.zeros(3)}, version=5)
    assert engine.weight_version == 4


def test_training_mode_is_restored(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    tiny.model.train()
    try:
        EmbeddedEngine(tiny.model, tiny.tokenizer).generate(prompts[:1], n=1, params=SamplingParams(max_new_tokens=2))
        assert tiny.model.training
    finally:
        tiny.model.eval()


def test_invalid_arguments(tiny: LoadedModel) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[1, 2], []], n=1)
    with pytest.raises(ValueError, match="n=0"):
        engine.generate([[1, 2]], n=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="top_k=0"):
        SamplingParams(top_k=0)
    with pytest.raises(ValueError, match="kv_block_size=0"):
        EmbeddedEngine(tiny.model, tiny.tokenizer, kv_block_size=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="move the model"):
            EmbeddedEngine(tiny.model, tiny.tokenizer, device="cuda")

