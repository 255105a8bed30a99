"""A preempted `generate` keeps its work: finished requests as they are, unfinished sequences with
their tokens, resumed where they stopped (KV recomputed) to what an uninterrupted call gives."""

from __future__ import annotations

import threading

import pytest
import torch

from tidal.errors import PreemptedError
from tidal.models import LoadedModel
from tidal.rollout import EmbeddedEngine, SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12, seed=11, ignore_eos=True)


@pytest.mark.parametrize("forward", ["llama", "generic"])
def test_a_preempted_call_resumes_where_it_stopped(tiny: LoadedModel, prompts: list[list[int]], forward: str) -> None:
    expected = EmbeddedEngine(tiny.model, tiny.tokenizer, max_batch_rows=2, forward=forward).generate(prompts, 2, PARAMS)

    # Two rows at a time: prompt 0 finishes before prompt 2 starts; stop once prompt 2 has 3 tokens.
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer, max_batch_rows=2, forward=forward)
    cancel = threading.Event()
    seen: dict[int, int] = {}

    def on_token(prompt: int, sample: int, token: int) -> None:
        seen[prompt] = seen.get(prompt, 0) + (sample == 0)
        if seen.get(2, 0) == 3:
            cancel.set()

    with pytest.raises(PreemptedError) as stopped:
        engine.generate(prompts, 2, PARAMS, on_token=on_token, cancel=cancel)
    handles = stopped.value.handles
    assert handles[0].done and not handles[2].done
    assert [len(s.generated) for s in handles[2].live if s.sample == 0] == [3]
    assert engine.pool.available() == engine.pool.num_blocks  # nothing held while suspended
    prompt_tokens, before = engine.stats.prompt_tokens, dict(seen)

    resumed = engine.generate(prompts, 2, PARAMS, on_token=on_token, resume=handles)
    assert engine.stats.prompt_tokens == prompt_tokens  # no prompt admitted afresh
    # Prompt 2 re-prefilled with its 3 tokens, its full blocks from the prefix cache where still there.
    assert 0 < engine.stats.recomputed_tokens <= len(prompts[2]) + 3
    assert seen[0] == before[0] == PARAMS.max_new_tokens  # the finished group was not sampled again
    assert seen[2] == PARAMS.max_new_tokens  # prompt 2 went on from its 3 tokens, not from its start
    for got_group, want_group in zip(resumed, expected):
        for got, want in zip(got_group, want_group):
            assert got.token_ids == want.token_ids
            torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-4, rtol=0)
            assert got.weight_version == want.weight_version and got.token_versions is None


def test_resume_with_other_prompts_is_refused(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(PreemptedError) as stopped:
        engine.generate(prompts, 1, PARAMS, cancel=cancel)
    with pytest.raises(ValueError, match="other prompts"):
        engine.generate(prompts[::-1], 1, PARAMS, resume=stopped.value.handles)


def test_an_aborted_handle_is_not_resumed(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(PreemptedError) as stopped:
        engine.generate(prompts, 1, PARAMS, cancel=cancel)
    engine.abort(stopped.value.handles[0])
    with pytest.raises(ValueError, match="aborted"):
        engine.generate(prompts, 1, PARAMS, resume=stopped.value.handles)
