from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from tidal.config.schema import ModelConfig, TinyModelConfig
from tidal.models import LoadedModel, load_model, render_prompt


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """Ops on a tiny model are too small to split across threads: on a busy two-core machine the
    threads' synchronisation costs more than the work. Restored after each module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Small enough for quick tests, but with grouped-query attention and more than one layer.
SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


def _lively_tiny(seed: int) -> LoadedModel:
    """A small random model whose blocks are scaled up: at the default init the tied embeddings make
    greedy decoding repeat the prompt's last token forever, which would hide cache bugs."""
    loaded = load_model(ModelConfig(path="tiny", tiny=SMALL, device="cpu", seed=seed))
    with torch.no_grad():
        for name, parameter in loaded.model.named_parameters():
            if name.startswith("model.layers.") and parameter.dim() == 2:
                parameter.mul_(8.0)
    loaded.model.eval()
    return loaded


@pytest.fixture(scope="session")
def make_tiny() -> Callable[[int], LoadedModel]:
    return _lively_tiny


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return _lively_tiny(0)


@pytest.fixture(scope="session")
def prompts(tiny: LoadedModel) -> list[list[int]]:
    """Chat prompts of clearly different lengths, so a batch of them is left-padded."""
    questions = ["hi", "What is 12 + 35?", "Write a function that reverses a list of numbers, then test it."]
    return [render_prompt(tiny.tokenizer, [{"role": "user", "content": q}]) for q in questions]
