"""`EmbeddedEngine.generate(on_token=...)`: the streaming hook sees exactly the kept tokens, in order."""

from __future__ import annotations

from tidal.models import LoadedModel
from tidal.rollout import EmbeddedEngine, SamplingParams


def test_on_token_sees_every_kept_token_in_order(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer, max_batch_rows=4)  # several passes, compaction
    seen: dict[tuple[int, int], list[int]] = {}
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3, stop=["e"])
    out = engine.generate(prompts, n=3, params=params, on_token=lambda p, s, t: seen.setdefault((p, s), []).append(t))
    for p, group in enumerate(out):
        for s, completion in enumerate(group):
            assert seen[(p, s)] == completion.token_ids
    # The hook observes; it does not change what is sampled.
    assert [[c.token_ids for c in g] for g in engine.generate(prompts, n=3, params=params)] == [
        [c.token_ids for c in g] for g in out
    ]


def test_a_set_cancel_stops_generation_at_the_next_step_and_a_rerun_gives_the_same(
    tiny: LoadedModel, prompts: list[list[int]]
) -> None:
    """Preemption (`cancel`): set partway through, the call raises `PreemptedError` at its next
    decode step and keeps nothing; the same call again, uncancelled, gives what a call that was
    never stopped gives (the engine's state is untouched)."""
    import threading

    import pytest

    from tidal.errors import PreemptedError

    engine = EmbeddedEngine(tiny.model, tiny.tokenizer, max_batch_rows=4)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=5)
    expected = [[c.token_ids for c in g] for g in engine.generate(prompts, n=3, params=params)]
    cancel, seen = threading.Event(), []

    def stop_after_five(prompt: int, sample: int, token: int) -> None:
        seen.append(token)
        if len(seen) == 5:
            cancel.set()

    with pytest.raises(PreemptedError, match="decode step"):
        engine.generate(prompts, n=3, params=params, on_token=stop_after_five, cancel=cancel)
    assert 5 <= len(seen) <= 8  # the rest of that step's 4 rows, then it stopped
    already = threading.Event()
    already.set()
    with pytest.raises(PreemptedError, match="decode step 0"):
        engine.generate(prompts, n=3, params=params, cancel=already)
    assert [[c.token_ids for c in g] for g in engine.generate(prompts, n=3, params=params, cancel=threading.Event())] \
        == expected
