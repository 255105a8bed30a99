"""CUDA graphs for the engine's decode steps (rollout/cuda_graphs.py) on a real GPU: the replayed
steps give the dynamic forward's tokens (greedy) and logprobs, rows joining and leaving change
the captured buckets, an in-place weight update keeps the graphs valid, and the speculative path
mixes with them. Marked `gpu` and skipped without CUDA (`pytest -m gpu tests/gpu`)."""

from __future__ import annotations

import pytest
import torch

from tidal.config.schema import ModelConfig, TinyModelConfig
from tidal.models import load_model, render_prompt
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.rollout.engine import Request
from tidal.rollout.speculative_batch import Speculation

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
QUESTIONS = ["hi", "What is 12 + 35?", "Write a function that reverses a list of numbers, then test it."]


def _lively() -> tuple[torch.nn.Module, object]:
    loaded = load_model(ModelConfig(path="tiny", tiny=SMALL, device="cpu", seed=0))
    with torch.no_grad():
        for name, parameter in loaded.model.named_parameters():
            if name.startswith("model.layers.") and parameter.dim() == 2:
                parameter.mul_(8.0)
    return loaded.model.to("cuda").eval(), loaded.tokenizer


def _run(engine: EmbeddedEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[list[int]]]:
    first = engine.submit(Request(prompts[0], params, n=3))
    for _ in range(3):
        engine.step()
    later = [engine.submit(Request(p, params, n=2)) for p in prompts[1:]]
    while not all(h.done for h in (first, *later)):
        engine.step()
    # The first 8 tokens: another reduction order (a masked span against a sliced one) may flip a
    # near-tie later in a sequence, as between CPU and CUDA (test_cuda_paths.py).
    return [[c.token_ids[:8] for c in engine.complete(h)] for h in (first, *later)]


@pytest.mark.parametrize("speculative", [None, Speculation(k=3, min_n=1)])
def test_graph_replays_equal_the_dynamic_forward(speculative: Speculation | None) -> None:
    model, tokenizer = _lively()
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]  # type: ignore[arg-type]
    params = SamplingParams(temperature=0, max_new_tokens=24)
    graphs = EmbeddedEngine(model, tokenizer, speculative=speculative)  # type: ignore[arg-type]
    plain = EmbeddedEngine(model, tokenizer, cuda_graphs="off", speculative=speculative)  # type: ignore[arg-type]
    assert _run(graphs, prompts, params) == _run(plain, prompts, params)
    assert graphs.graph_replays > 10 and plain.graph_replays == 0
    with torch.no_grad():  # a trainer's update, in place: the captured graphs read the new values
        for parameter in model.parameters():
            parameter.mul_(0.9)
    graphs.update_weights(None, 1)
    plain.update_weights(None, 1)
    assert _run(graphs, prompts, params) == _run(plain, prompts, params)
    sampled = SamplingParams(temperature=1.0, max_new_tokens=16, seed=4)
    mine = graphs.generate(prompts, 2, sampled)
    theirs = plain.generate(prompts, 2, sampled)
    for group_mine, group_theirs in zip(mine, theirs, strict=True):
        for a, b in zip(group_mine, group_theirs, strict=True):
            n = min(len(a.logprobs), len(b.logprobs), 4)  # the first tokens, before a near-tie could part them
            torch.testing.assert_close(torch.tensor(a.logprobs[:n]), torch.tensor(b.logprobs[:n]), atol=1e-3, rtol=0)
