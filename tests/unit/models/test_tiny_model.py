from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from tidal.config.schema import TinyModelConfig
from tidal.models import build_tiny_model, count_parameters


def test_default_shape_is_a_few_million_parameters(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    model = build_tiny_model(TinyModelConfig(), tiny_tokenizer, seed=0)
    assert isinstance(model, Qwen2ForCausalLM)
    assert 2_000_000 <= count_parameters(model) <= 6_000_000
    config = model.config
    assert config.vocab_size == len(tiny_tokenizer)
    assert config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.eos_token_id == tiny_tokenizer.eos_token_id == model.generation_config.eos_token_id
    assert config.pad_token_id == tiny_tokenizer.pad_token_id == model.generation_config.pad_token_id
    assert config.bos_token_id is None


def test_seed_decides_the_weights(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    shape = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    before = torch.get_rng_state()
    a, b, c = (build_tiny_model(shape, tiny_tokenizer, seed) for seed in (1, 1, 2))
    assert torch.equal(torch.get_rng_state(), before), "building a model must not consume the global RNG"
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name])
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def _fingerprint_script() -> str:
    return (
        "import hashlib, json, torch\n"
        "from tidal.config.schema import TinyModelConfig\n"
        "from tidal.models import build_tiny_model, build_tiny_tokenizer\n"
        "tok = build_tiny_tokenizer()\n"
        "shape = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)\n"
        "model = build_tiny_model(shape, tok, 7)\n"
        "vocab = json.dumps(sorted(tok.get_vocab().items()))\n"
        "weights = b''.join(t.numpy().tobytes() for t in model.state_dict().values())\n"
        "print(hashlib.sha256(vocab.encode() + weights).hexdigest())\n"
    )


def test_tokenizer_and_weights_are_identical_across_processes(capsys: pytest.CaptureFixture[str]) -> None:
    # A trainer and a rollout worker each build "tiny" and must agree without exchanging files;
    # a fixed hash seed in the child makes sure dict/set ordering plays no part.
    child = subprocess.run(
        [sys.executable, "-c", _fingerprint_script()],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    ).stdout.strip()
    exec(compile(_fingerprint_script(), "<fingerprint>", "exec"), {})
    here = capsys.readouterr().out.strip()
    assert len(here) == 64 and child == here
