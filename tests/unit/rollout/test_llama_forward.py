"""The engine's hand-written "llama" forward (rollout/paged.py, `PagedDecoder`): which models it
takes; on the models it takes, greedy output equal to transformers' `generate` and logprobs equal
to the teacher-forced forward (q/k/v biases, rope scaling); the same samples as the generic
forward for the same seed; weight updates seen at once."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from tidal.models import LoadedModel
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.rollout.engine import pick_forward
from tidal.rollout.paged import PagedDecoder
from tidal.types import Completion

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


def _tokens(groups: list[list[Completion]]) -> list[list[list[int]]]:
    return [[c.token_ids for c in group] for group in groups]


def test_it_takes_llama_family_decoders_only() -> None:
    assert PagedDecoder.supports(_qwen2()) and PagedDecoder.supports(_llama())
    assert pick_forward(_qwen2()) == "llama"
    assert not PagedDecoder.supports(_qwen2(use_sliding_window=True, sliding_window=8, max_window_layers=0))
    assert not PagedDecoder.supports(_llama(hidden_act="gelu"))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2))
    assert not PagedDecoder.supports(gpt2) and pick_forward(gpt2) == "generic"
    with pytest.raises(ValueError, match="not GPT2LMHeadModel"):
        PagedDecoder(gpt2)
    with pytest.raises(ValueError, match="forward='llama'"):
        pick_forward(gpt2, "llama")


@pytest.mark.parametrize("build", [_qwen2, _llama], ids=["qwen2 (q/k/v biases)", "llama (rope scaling)"])
def test_greedy_equals_generate_and_logprobs_the_forwards(tiny: LoadedModel, build: object) -> None:
    model = build()  # type: ignore[operator]
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, VOCAB, (length,), generator=generator).tolist() for length in (3, 9, 6)]
    engine = EmbeddedEngine(model, tiny.tokenizer, kv_block_size=4, forward="llama")
    assert engine.forward_path == "llama"
    greedy = SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)
    for prompt, group in zip(prompts, engine.generate(prompts, 2, greedy)):
        with torch.no_grad():
            expected = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                      do_sample=False, max_new_tokens=10, min_new_tokens=10, pad_token_id=0)
        assert all(c.token_ids == expected[0, len(prompt):].tolist() for c in group)
    params = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=10, seed=4, ignore_eos=True)
    for group in engine.generate(prompts, 3, params):
        for completion in group:
            with torch.no_grad():
                logits = model(torch.tensor([completion.prompt_ids + completion.token_ids])).logits[0].float()
            logits = logits[len(completion.prompt_ids) - 1 : -1] / 0.9
            expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion.token_ids)[:, None]).squeeze(1)
            torch.testing.assert_close(torch.tensor(completion.logprobs), expected, rtol=0, atol=1e-5)


def test_the_llama_forward_samples_what_the_generic_forward_samples(tiny: LoadedModel,
                                                                     prompts: list[list[int]]) -> None:
    """Same seed, same tokens; logprobs equal to float rounding; new weights seen at once."""
    llama = EmbeddedEngine(tiny.model, tiny.tokenizer, forward="llama")
    generic = EmbeddedEngine(tiny.model, tiny.tokenizer, forward="generic")
    assert (llama.forward_path, generic.forward_path) == ("llama", "generic")
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7, stop=["e"])
    a, b = llama.generate(prompts, n=3, params=params), generic.generate(prompts, n=3, params=params)
    assert _tokens(a) == _tokens(b)
    for ga, gb in zip(a, b):
        for ca, cb in zip(ga, gb):
            torch.testing.assert_close(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), rtol=0, atol=1e-4)
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    before = _tokens(llama.generate(prompts, 1, greedy))
    saved = {name: t.clone() for name, t in tiny.model.state_dict().items()}
    try:
        changed = {name: t * 1.5 for name, t in saved.items() if name.endswith("mlp.down_proj.weight")}
        llama.update_weights(changed, version=1)  # in place: both engines share this model
        generic.update_weights(None, version=1)
        after = _tokens(llama.generate(prompts, 1, greedy))
        assert after != before  # the llama forward read the new weights...
        assert after == _tokens(generic.generate(prompts, 1, greedy))  # ...as the model's own modules do
    finally:
        tiny.model.load_state_dict(saved)
