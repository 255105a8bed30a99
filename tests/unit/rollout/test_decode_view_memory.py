"""The decode view (rollout/paged.py) holds the decoding rows' keys and values once more: it grows
only the dimension that is short, and no further than the work submitted can reach, so a batch's
view is its rows x (longest prompt + max_new_tokens + 1) positions (issue 42: growing both
dimensions at once made a 256-row evaluation's view 13.7 GiB for 2.3 GiB of keys and values)."""

from __future__ import annotations

import torch

from tidal.models import LoadedModel
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.rollout.paged import DecodeView


def test_only_the_short_dimension_grows_and_never_past_its_bound() -> None:
    view = DecodeView(layers=1, kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))
    view.reserve(4, 10, max_rows=6, max_capacity=30)
    assert (view.rows, view.capacity) == (4, 10)
    view.reserve(5, 10, max_rows=6, max_capacity=30)  # rows short: double, capped at 6; capacity kept
    assert (view.rows, view.capacity) == (6, 10)
    view.reserve(6, 11, max_rows=6, max_capacity=15)  # capacity short: double, capped at 15; rows kept
    assert (view.rows, view.capacity) == (6, 15)
    view.reserve(3, 40)  # asked for more than a bound: what is asked
    assert (view.rows, view.capacity) == (6, 40) and view.keys[0].shape == (6, 1, 40, 2)


def test_a_batch_view_is_its_rows_by_its_longest_sequence(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer, max_batch_rows=64, decode_attention="view")
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3, ignore_eos=True)
    engine.generate(prompts[:5], 4, params)
    view = engine._scheduler.view
    assert view is not None
    assert view.rows <= 5 * 4 and view.capacity <= max(map(len, prompts[:5])) + 12 + 1
