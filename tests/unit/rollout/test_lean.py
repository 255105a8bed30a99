"""The lean forward (rollout/lean.py): which models it takes, logits equal to the `transformers`
forward (left-padded prefill, then decode steps on its cache, rows reordered), weight updates seen
at once, and the engine's samples unchanged by it."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from tidal.models import LoadedModel
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.rollout.lean import LeanDecoder
from tidal.rollout.static import StaticEngine

VOCAB = 97


def _llama(**extra: object) -> LlamaForCausalLM:
    torch.manual_seed(2)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rope_scaling={"rope_type": "linear", "factor": 2.0}, **extra)
    return LlamaForCausalLM(config).eval()


def _qwen2(**extra: object) -> Qwen2ForCausalLM:
    torch.manual_seed(3)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128, **extra)
    return Qwen2ForCausalLM(config).eval()


def test_it_takes_llama_family_decoders_only() -> None:
    assert LeanDecoder.supports(_qwen2()) and LeanDecoder.supports(_llama())
    assert not LeanDecoder.supports(_qwen2(use_sliding_window=True, sliding_window=8, max_window_layers=0))
    assert not LeanDecoder.supports(_llama(hidden_act="gelu"))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2))
    assert not LeanDecoder.supports(gpt2)
    with pytest.raises(ValueError, match="does not support GPT2LMHeadModel"):
        LeanDecoder(gpt2)


@pytest.mark.parametrize("build", [_qwen2, _llama], ids=["qwen2 (q/k/v biases)", "llama (rope scaling)"])
def test_logits_match_the_transformers_forward(build: object) -> None:
    model = build()  # type: ignore[operator]
    lean = LeanDecoder(model)
    generator = torch.Generator().manual_seed(0)
    lengths, steps = [3, 9, 6], 6
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attention = torch.zeros(len(lengths), width + steps, dtype=torch.long)
    for row, length in enumerate(lengths):  # left-padded, as the engine prefills
        ids[row, width - length:] = torch.randint(1, VOCAB, (length,), generator=generator)
        attention[row, width - length:width] = 1
    positions = (attention[:, :width].cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        reference_cache, cache = DynamicCache(config=model.config), lean.new_cache(width + 2)  # it must grow
        expected = model(input_ids=ids, attention_mask=attention[:, :width], position_ids=positions,
                         cache=reference_cache, use_cache=True).logits[:, -1].float()
        torch.testing.assert_close(lean.last_logits(ids, attention[:, :width], positions, cache), expected,
                                   rtol=0, atol=1e-5)
        # Each prompt's cache row copied to two samples (prefix reuse), then decode steps.
        rows = torch.tensor([0, 0, 1, 1, 2, 2])
        reference_cache.batch_select_indices(rows)
        cache.batch_select_indices(rows)
        attention, following = attention[rows], torch.tensor(lengths)[rows]
        for step in range(steps):
            token = torch.randint(1, VOCAB, (len(rows), 1), generator=generator)
            attention[:, width + step] = 1
            mask = attention[:, : width + step + 1]
            expected = model(input_ids=token, attention_mask=mask, position_ids=following[:, None],
                             cache=reference_cache, use_cache=True).logits[:, -1].float()
            got = lean.last_logits(token, mask, following[:, None], cache)
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
            following = following + 1
        assert cache.get_seq_length() == width + steps


def test_an_unpadded_batch_runs_without_a_mask_and_matches_too() -> None:
    model = _qwen2()
    lean = LeanDecoder(model)
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(7)[None].expand(2, -1)
    generator = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        reference_cache, cache = DynamicCache(config=model.config), lean.new_cache(7)
        expected = model(input_ids=ids, cache=reference_cache, use_cache=True).logits[:, -1].float()
        torch.testing.assert_close(lean.last_logits(ids, None, positions, cache), expected, rtol=0, atol=1e-5)
        for step in range(3):  # decode steps without a mask, past the cache's first capacity
            token = torch.randint(1, VOCAB, (2, 1), generator=generator)
            position = torch.full((2, 1), 7 + step)
            expected = model(input_ids=token, position_ids=position, cache=reference_cache,
                             use_cache=True).logits[:, -1].float()
            torch.testing.assert_close(lean.last_logits(token, None, position, cache), expected, rtol=0, atol=1e-5)


def test_the_engine_samples_what_the_transformers_forward_samples(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    """Same seed, same tokens; logprobs equal to float rounding; new weights seen at once."""
    lean = StaticEngine(tiny.model, tiny.tokenizer, kv_cache="auto")
    plain = StaticEngine(tiny.model, tiny.tokenizer, kv_cache="flat")
    paged = EmbeddedEngine(tiny.model, tiny.tokenizer)
    assert lean._lean is not None and plain._lean is None
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7, stop=["e"])
    a, b = lean.generate(prompts, n=3, params=params), plain.generate(prompts, n=3, params=params)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    for ga, gb in zip(a, b):
        for ca, cb in zip(ga, gb):
            torch.testing.assert_close(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), rtol=0, atol=1e-4)
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    before = [[c.token_ids for c in g] for g in lean.generate(prompts, 1, greedy)]
    saved = {name: t.clone() for name, t in tiny.model.state_dict().items()}
    try:
        changed = {name: t * 1.5 for name, t in saved.items() if name.endswith("mlp.down_proj.weight")}
        lean.update_weights(changed, version=1)  # in place: both engines share this model
        after = [[c.token_ids for c in g] for g in lean.generate(prompts, 1, greedy)]
        assert after != before  # the lean forward read the new weights...
        assert after == [[c.token_ids for c in g] for g in plain.generate(prompts, 1, greedy)]  # ...as HF does
        assert after == [[c.token_ids for c in g] for g in paged.generate(prompts, 1, greedy)]  # ...and the paged forward
    finally:
        tiny.model.load_state_dict(saved)
