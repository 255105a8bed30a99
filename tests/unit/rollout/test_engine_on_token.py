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
