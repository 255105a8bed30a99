"""The decode-graph path (rollout/cuda_graphs.py) on a CPU: where CUDA is missing, `auto` falls
back to the dynamic forward; the padded, tensor-only step that a CUDA graph captures, run eagerly
(`cuda_graphs="eager"`), gives the dynamic forward's tokens and logprobs, with rows joining and
leaving (row buckets change), prefills between decode steps and speculative steps mixed in."""

from __future__ import annotations

import pytest
import torch

from tidal.config.schema import RolloutConfig
from tidal.models import LoadedModel
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.rollout.cuda_graphs import bucket, graphs_available
from tidal.rollout.engine import Request
from tidal.rollout.speculative_batch import Speculation
from tidal.types import Completion


def _same(a: list[Completion], b: list[Completion]) -> None:
    for ca, cb in zip(a, b, strict=True):
        assert ca.token_ids == cb.token_ids and ca.finish_reason == cb.finish_reason
        torch.testing.assert_close(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=1e-4, rtol=0)


def test_auto_falls_back_to_the_dynamic_forward_without_cuda(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    assert not graphs_available(torch.device("cpu"))
    auto = EmbeddedEngine(tiny.model, tiny.tokenizer)  # cuda_graphs="auto" by default
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    off = EmbeddedEngine(tiny.model, tiny.tokenizer, cuda_graphs="off")
    for mine, theirs in zip(auto.generate(prompts, 2, params), off.generate(prompts, 2, params), strict=True):
        _same(mine, theirs)
    assert auto.graph_replays == 0


@pytest.mark.parametrize("speculative", [None, Speculation(k=3, min_n=1)])
def test_the_captured_step_run_eagerly_equals_the_dynamic_forward(tiny: LoadedModel, prompts: list[list[int]],
                                                                   speculative: Speculation | None) -> None:
    """Requests join a running batch and leave at different lengths, so the row bucket and the key
    span change; padding rows write a scratch block, never a real sequence's."""
    def run(mode: str) -> tuple[list[list[Completion]], EmbeddedEngine]:
        engine = EmbeddedEngine(tiny.model, tiny.tokenizer, kv_block_size=4, cuda_graphs=mode, speculative=speculative)
        first = engine.submit(Request(prompts[0], SamplingParams(temperature=1.0, max_new_tokens=30, seed=1), n=3))
        for _ in range(4):
            engine.step()
        later = [engine.submit(Request(p, SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=5 + 7 * i, seed=i),
                                       n=2)) for i, p in enumerate(prompts[1:])]
        while not all(h.done for h in (first, *later)):
            engine.step()
        return [engine.complete(h) for h in (first, *later)], engine

    eager, engine = run("eager")
    dynamic, _ = run("off")
    for mine, theirs in zip(eager, dynamic, strict=True):
        _same(mine, theirs)
    assert engine.graph_replays > 10


def test_graph_modes_are_checked() -> None:
    assert [bucket(n) for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]
    with pytest.raises(ValueError, match="cuda_graphs='always'"):
        EmbeddedEngine.__init__(object.__new__(EmbeddedEngine), None, None, cuda_graphs="always")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cuda_graphs"):
        RolloutConfig.model_validate({"cuda_graphs": "eager"})
    assert RolloutConfig().cuda_graphs == "auto"
