"""In-flight weight updates: new weights applied between two decode steps of running sequences,
which keep their KV (PipelineRL) or recompute it, every token tagged with its weights' version."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import DynamicCache

from tidal.models import LoadedModel
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.rollout.scheduler import Request
from tidal.types import Completion

SWAP_AFTER = 5  # tokens sampled under the old weights
NEW_TOKENS = 12
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=3, ignore_eos=True)


def _token_logprobs(logits: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """log p of `tokens` under `logits` (len(tokens), V), at temperature 1."""
    return torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


def _teacher_forced(model: torch.nn.Module, completion: Completion) -> torch.Tensor:
    """(len(token_ids),) the completion's logprobs under `model`, in one pass over all its tokens."""
    ids = completion.prompt_ids + completion.token_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, len(completion.prompt_ids) - 1 : -1]
    return _token_logprobs(logits, completion.token_ids)


def _kept_kv(old: torch.nn.Module, new: torch.nn.Module, completion: Completion, computed: int) -> torch.Tensor:
    """The completion's logprobs when positions [0, computed) were computed under `old` and the
    rest under `new`, attending to the old keys and values (what "keep" means), with transformers'
    own cache."""
    ids = completion.prompt_ids + completion.token_ids
    with torch.no_grad():
        cache = DynamicCache()
        first = old(torch.tensor([ids[:computed]]), cache=cache, use_cache=True).logits[0]
        rest = new(torch.tensor([ids[computed:-1]]), cache=cache, use_cache=True).logits[0]
    logits = torch.cat([first, rest])[len(completion.prompt_ids) - 1 :]
    return _token_logprobs(logits, completion.token_ids)


def _swapped_run(engine: EmbeddedEngine, prompt: list[int], new_state: dict[str, torch.Tensor]) -> list[Completion]:
    """Two samples of `prompt`, the weights replaced by `new_state` (version 1) after SWAP_AFTER tokens."""
    handle = engine.submit(Request(list(prompt), PARAMS, n=2))
    for _ in range(SWAP_AFTER):  # the first step prefills and samples the first token
        engine.step()
    assert not handle.done
    engine.update_weights(new_state, version=1)
    while not handle.done:
        engine.step()
    return engine.complete(handle)


@pytest.fixture()
def models(make_tiny: Callable[[int], LoadedModel]) -> tuple[LoadedModel, LoadedModel]:
    return make_tiny(0), make_tiny(1)


@pytest.mark.parametrize("forward", ["llama", "generic"])
def test_keep_mode_samples_later_tokens_with_new_weights_over_old_kv(
    models: tuple[LoadedModel, LoadedModel], make_tiny: Callable[[int], LoadedModel], prompts: list[list[int]],
    forward: str,
) -> None:
    old, new = models
    engine = EmbeddedEngine(make_tiny(0).model, old.tokenizer, forward=forward)  # its own copy: it is overwritten
    completions = _swapped_run(engine, prompts[1], new.model.state_dict())
    for completion in completions:
        assert completion.weight_version == 0  # the oldest
        assert completion.token_versions == [0] * SWAP_AFTER + [1] * (NEW_TOKENS - SWAP_AFTER)
        assert completion.versions() == completion.token_versions
        got = torch.tensor(completion.logprobs)
        old_forced = _teacher_forced(old.model, completion)
        torch.testing.assert_close(got[:SWAP_AFTER], old_forced[:SWAP_AFTER], atol=1e-4, rtol=0)
        # The swap changed the later tokens' logits, and only those.
        assert (got[SWAP_AFTER:] - old_forced[SWAP_AFTER:]).abs().max() > 1e-2
        computed = len(completion.prompt_ids) + SWAP_AFTER - 1  # the last old token is fed after the swap
        torch.testing.assert_close(got, _kept_kv(old.model, new.model, completion, computed), atol=1e-4, rtol=0)
        # Kept KV is not a fresh prefill under the new weights: that is the recompute mode.
        assert (got[SWAP_AFTER:] - _teacher_forced(new.model, completion)[SWAP_AFTER:]).abs().max() > 1e-3


@pytest.mark.parametrize("forward", ["llama", "generic"])
def test_recompute_mode_equals_a_fresh_prefill_under_the_new_weights(
    models: tuple[LoadedModel, LoadedModel], make_tiny: Callable[[int], LoadedModel], prompts: list[list[int]],
    forward: str,
) -> None:
    old, new = models
    engine = EmbeddedEngine(make_tiny(0).model, old.tokenizer, forward=forward, inflight_kv="recompute")
    completions = _swapped_run(engine, prompts[1], new.model.state_dict())
    assert engine.stats.recomputed_tokens > 0 and engine.stats.preemptions == 0
    for completion in completions:
        assert completion.token_versions == [0] * SWAP_AFTER + [1] * (NEW_TOKENS - SWAP_AFTER)
        got = torch.tensor(completion.logprobs)
        torch.testing.assert_close(got[:SWAP_AFTER], _teacher_forced(old.model, completion)[:SWAP_AFTER], atol=1e-4, rtol=0)
        torch.testing.assert_close(got[SWAP_AFTER:], _teacher_forced(new.model, completion)[SWAP_AFTER:], atol=1e-4, rtol=0)


def test_without_an_update_nothing_changes(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    """No update while it runs: no per-token list (every token under `weight_version`), and the same
    samples with either mode."""
    runs = [EmbeddedEngine(tiny.model, tiny.tokenizer, inflight_kv=mode).generate(prompts, n=2, params=PARAMS)
            for mode in ("keep", "recompute")]
    assert runs[0] == runs[1]
    for group in runs[0]:
        for completion in group:
            assert completion.token_versions is None
            assert completion.versions() == [completion.weight_version] * len(completion.token_ids)


def test_between_steps_hook_loads_while_generate_runs(
    models: tuple[LoadedModel, LoadedModel], make_tiny: Callable[[int], LoadedModel], prompts: list[list[int]],
) -> None:
    """`between_steps` is where a rollout worker loads a publication during `generate`: the call's
    later tokens carry the new version."""
    old, new = models
    engine = EmbeddedEngine(make_tiny(0).model, old.tokenizer)
    steps = {"n": 0}

    def hook() -> None:
        steps["n"] += 1
        if steps["n"] == SWAP_AFTER + 1:
            engine.update_weights(new.model.state_dict(), version=7)

    engine.between_steps = hook
    (group,) = engine.generate([prompts[0]], n=1, params=PARAMS)
    assert group[0].token_versions == [0] * SWAP_AFTER + [7] * (NEW_TOKENS - SWAP_AFTER)
    assert engine.weight_version == 7


def test_unknown_mode_is_refused(tiny: LoadedModel) -> None:
    with pytest.raises(ValueError, match="inflight_kv='drop' must be one of keep, recompute"):
        EmbeddedEngine(tiny.model, tiny.tokenizer, inflight_kv="drop")


def test_kv_is_cached_under_the_weights_it_was_computed_with(
    models: tuple[LoadedModel, LoadedModel], make_tiny: Callable[[int], LoadedModel], prompts: list[list[int]],
) -> None:
    """A request queued before an in-flight update and admitted after it computes its prompt under the
    new weights (none of the running request's old blocks) and caches it under them: a later request
    of that prompt reuses it."""
    old, new = models
    engine = EmbeddedEngine(make_tiny(0).model, old.tokenizer, kv_block_size=4, max_batch_rows=2)
    prompt = prompts[2]
    running = engine.submit(Request(list(prompt), PARAMS, n=2))
    queued = engine.submit(Request(list(prompt), PARAMS, n=2))  # no rows left: it waits
    for _ in range(SWAP_AFTER):
        engine.step()
    assert not queued.versions and not any(s.blocks for s in queued.live)
    engine.update_weights(new.model.state_dict(), version=1)
    while not (running.done and queued.done):
        engine.step()
    cached = engine.stats.cached_tokens
    (later,) = engine.generate([prompt], n=1, params=PARAMS)
    assert engine.stats.cached_tokens - cached >= len(prompt) - 4  # its full prompt blocks, from `queued`
    for completion in [*engine.complete(queued), *later]:
        assert completion.weight_version == 1 and completion.token_versions is None
        torch.testing.assert_close(torch.tensor(completion.logprobs), _teacher_forced(new.model, completion),
                                   atol=1e-4, rtol=0)
