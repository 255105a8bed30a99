"""The paged engine's scheduler: continuous batching, prefix cache, chunked prefill, preemption,
per-row sampling. Each test compares against a run that cannot share the mechanism under test
(a solo run, a cache-less run, an unconstrained pool), token for token."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from tidal.errors import PreemptedError
from tidal.models import LoadedModel, render_prompt
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.rollout.engine import KVPoolTooSmall, Request
from tidal.types import Completion

SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=16, seed=11)


def _tokens(groups: list[list[Completion]]) -> list[list[list[int]]]:
    return [[c.token_ids for c in group] for group in groups]


def _assert_same(a: list[list[Completion]], b: list[list[Completion]]) -> None:
    assert _tokens(a) == _tokens(b)
    for group_a, group_b in zip(a, b):
        for ca, cb in zip(group_a, group_b):
            assert ca.finish_reason == cb.finish_reason and ca.text == cb.text
            torch.testing.assert_close(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=1e-4, rtol=0)


def _solo(tiny: LoadedModel, request: Request) -> list[Completion]:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer, prefix_cache=False)
    (handle,) = engine.run([Request(request.prompt, request.params, request.n)])
    return engine.complete(handle)


def test_paged_and_contiguous_attention_give_the_same_samples(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    """Decode attention over the blocks gathered at every step equals the contiguous view; and
    greedy decoding equals transformers' `generate` (its own forward and cache), logprobs equal
    its scores."""
    view = EmbeddedEngine(tiny.model, tiny.tokenizer, kv_block_size=4)
    gather = EmbeddedEngine(tiny.model, tiny.tokenizer, kv_block_size=4, decode_attention="gather")
    _assert_same(view.generate(prompts, 3, SAMPLED), gather.generate(prompts, 3, SAMPLED))
    greedy = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    for prompt, group in zip(prompts, view.generate(prompts, 2, greedy)):
        with torch.no_grad():
            out = tiny.model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                      do_sample=False, max_new_tokens=12, min_new_tokens=12, output_logits=True,
                                      return_dict_in_generate=True, pad_token_id=tiny.tokenizer.eos_token_id)
        expected = out.sequences[0, len(prompt):].tolist()
        scores = torch.log_softmax(torch.stack(out.logits)[:, 0].float(), dim=-1)  # (12, V), its raw logits
        for completion in group:
            assert completion.token_ids == expected
            torch.testing.assert_close(torch.tensor(completion.logprobs),
                                       scores.gather(1, torch.tensor(expected)[:, None]).squeeze(1), atol=1e-4, rtol=0)


def test_requests_joining_and_leaving_a_running_batch_equal_solo_runs(
    tiny: LoadedModel, prompts: list[list[int]]
) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    requests = [
        Request(prompts[0], SamplingParams(temperature=1.0, max_new_tokens=20, seed=1), n=3),
        Request(prompts[1], SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=6, seed=2), n=2),
        Request(prompts[2], SamplingParams(temperature=1.0, max_new_tokens=12, seed=3), n=1),
    ]
    handles = [engine.submit(requests[0])]
    together = []
    for step in range(40):
        if step == 3:
            handles.append(engine.submit(requests[1]))  # joins while the first decodes
        if step == 5:
            handles.append(engine.submit(requests[2]))
        if not engine.busy():
            break
        engine.step()
        together.append(len({id(sequence.handle) for sequence in engine._scheduler.decoding}))
    assert len(handles) == 3 and all(handle.done for handle in handles)
    assert 3 in together and 1 in together[together.index(3):], "the three requests shared steps, then left"
    for request, handle in zip(requests, handles):
        _assert_same([engine.complete(handle)], [_solo(tiny, request)])


def test_per_row_parameters_in_one_batch_equal_solo_runs(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    requests = [
        Request(prompts[0], SamplingParams(temperature=0, max_new_tokens=5)),
        Request(prompts[1], SamplingParams(temperature=1.3, max_new_tokens=14, seed=9), n=2),
        Request(prompts[1], SamplingParams(temperature=0.7, top_p=0.5, max_new_tokens=9, seed=4), n=2),
        Request(prompts[2], SamplingParams(temperature=1.0, max_new_tokens=30, seed=5, stop=["e"])),
        Request(prompts[2], SamplingParams(temperature=1.0, max_new_tokens=10, seed=6, ignore_eos=True)),
    ]
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    handles = engine.run(requests)
    for request, handle in zip(requests, handles):
        completions = engine.complete(handle)
        assert all(len(c.token_ids) <= request.params.max_new_tokens for c in completions)
        _assert_same([completions], [_solo(tiny, request)])
    stopped = engine.complete(handles[3])[0]
    assert stopped.finish_reason == "length" or "e" not in stopped.text


def test_a_seeded_call_does_not_depend_on_the_batch(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    """The same seeded call, alone or with max_batch_rows=2 (its groups split across steps)."""
    whole = EmbeddedEngine(tiny.model, tiny.tokenizer).generate(prompts, 3, SAMPLED)
    _assert_same(EmbeddedEngine(tiny.model, tiny.tokenizer, max_batch_rows=2).generate(prompts, 3, SAMPLED), whole)


def test_prefix_cache_reuse_equals_recomputation_and_is_counted(tiny: LoadedModel) -> None:
    system = {"role": "system", "content": "You are a careful assistant. Answer briefly and check the arithmetic."}
    first = render_prompt(tiny.tokenizer, [system, {"role": "user", "content": "What is 2 + 2?"}])
    second = render_prompt(tiny.tokenizer, [system, {"role": "user", "content": "Name a prime number."}])
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    size = 4
    cached = EmbeddedEngine(tiny.model, tiny.tokenizer, kv_block_size=size)
    plain = EmbeddedEngine(tiny.model, tiny.tokenizer, kv_block_size=size, prefix_cache=False)
    turn = cached.generate([first], 2, SAMPLED)
    _assert_same(turn, plain.generate([first], 2, SAMPLED))
    assert cached.stats.cached_tokens == 0
    # A second task with the same system prompt: its full shared blocks come from the cache.
    _assert_same(cached.generate([second], 2, SAMPLED), plain.generate([second], 2, SAMPLED))
    assert cached.stats.cached_tokens == shared // size * size > 0
    # A second turn: the history (prompt + the first completion) is cached but for the completion's
    # last token, whose KV was never computed.
    history = first + turn[0][0].token_ids + first[-3:]
    before = cached.stats.cached_tokens
    _assert_same(cached.generate([history], 1, SAMPLED), plain.generate([history], 1, SAMPLED))
    computed = len(first) + len(turn[0][0].token_ids) - 1
    assert cached.stats.cached_tokens - before == computed // size * size
    assert plain.stats.cached_tokens == 0 and 0 < cached.stats.prefix_hit_rate < cached.stats.hit_rate < 1


def test_update_weights_invalidates_the_prefix_cache(tiny: LoadedModel, make_tiny: Callable[[int], LoadedModel],
                                                     prompts: list[list[int]]) -> None:
    policy = make_tiny(0)
    engine = EmbeddedEngine(policy.model, policy.tokenizer, kv_block_size=4)
    engine.generate(prompts[2:], 1, SAMPLED)
    engine.generate(prompts[2:], 1, SAMPLED)
    hits = engine.stats.cached_tokens
    assert hits > 0, "the same prompt twice: the second prefill comes from the cache"
    new = make_tiny(1).model.state_dict()
    engine.update_weights({k: v.clone() for k, v in new.items()}, version=1)
    after = engine.generate(prompts[2:], 1, SAMPLED)
    assert engine.stats.cached_tokens == hits, "KV of the old weights must not be reused"
    fresh = make_tiny(1)
    _assert_same(after, EmbeddedEngine(fresh.model, fresh.tokenizer).generate(prompts[2:], 1, SAMPLED))
    assert all(c.weight_version == 1 for g in after for c in g)


def test_block_exhaustion_preempts_and_gives_the_unconstrained_output(
    tiny: LoadedModel, prompts: list[list[int]]
) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=8)
    free = EmbeddedEngine(tiny.model, tiny.tokenizer, kv_block_size=4).generate(prompts, 4, params)
    # 30 blocks of 4 positions: the longest sequence (82 + 24 tokens) fits alone, 12 rows do not.
    tight = EmbeddedEngine(tiny.model, tiny.tokenizer, kv_block_size=4, kv_blocks=30)
    _assert_same(tight.generate(prompts, 4, params), free)
    assert tight.stats.preemptions > 0 and tight.stats.recomputed_tokens > 0
    assert tight.pool.available() == 30, "every block is free or evictable after the call"
    with pytest.raises(KVPoolTooSmall, match="kv_blocks"):
        EmbeddedEngine(tiny.model, tiny.tokenizer, kv_block_size=4, kv_blocks=6).generate(prompts[2:], 1, params)


def test_chunked_prefill_equals_unchunked_and_does_not_stall_decoding(
    tiny: LoadedModel, prompts: list[list[int]]
) -> None:
    whole = EmbeddedEngine(tiny.model, tiny.tokenizer, prefill_chunk=512).generate(prompts, 2, SAMPLED)
    chunked = EmbeddedEngine(tiny.model, tiny.tokenizer, prefill_chunk=7, kv_block_size=4)
    _assert_same(chunked.generate(prompts, 2, SAMPLED), whole)
    # A long prompt arriving while a short one decodes: 81 tokens in chunks of 7 take 12 steps,
    # and the decoding row gets a token in every one of them.
    clock, steps = [0], []
    short = chunked.submit(Request(prompts[0], SamplingParams(max_new_tokens=40, seed=1, ignore_eos=True),
                                   on_token=lambda sample, token: steps.append(clock[0])))
    while not steps:
        chunked.step()
        clock[0] += 1
    start = clock[0]
    long = chunked.submit(Request(prompts[2][1:], SamplingParams(max_new_tokens=4, seed=2)))  # not cached
    for _ in range(12):
        assert chunked._scheduler.prefilling or chunked._scheduler.waiting
        chunked.step()
        clock[0] += 1
    assert not chunked._scheduler.prefilling and len(chunked._scheduler.decoding) == 2
    assert steps[-12:] == list(range(start, start + 12)) and not long.done and not short.done


def test_cancel_frees_everything_and_a_rerun_gives_the_same(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer, kv_block_size=4, kv_blocks=200)
    expected = engine.generate(prompts, 3, SAMPLED)
    cancel = threading.Event()
    seen = []

    def stop_soon(prompt: int, sample: int, token: int) -> None:
        seen.append(token)
        if len(seen) == 10:
            cancel.set()

    with pytest.raises(PreemptedError):
        engine.generate(prompts, 3, SAMPLED, on_token=stop_soon, cancel=cancel)
    assert not engine.busy() and engine.pool.available() == 200
    _assert_same(engine.generate(prompts, 3, SAMPLED), expected)

