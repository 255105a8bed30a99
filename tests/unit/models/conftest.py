from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from tidal.models import build_tiny_tokenizer


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """Ops on a tiny model are too small to split across threads: on a busy two-core machine the
    threads' synchronisation costs more than the work. Restored after each module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    return build_tiny_tokenizer()
