from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, BertConfig, PreTrainedTokenizerFast

from tidal.config.schema import ModelConfig, TinyModelConfig
from tidal.errors import ModelLoadError
from tidal.models import LoadedModel, load_model, render_prompt, resolve_device, save_checkpoint

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    loaded = load_model(ModelConfig(path="tiny", tiny=SMALL, device="cpu", seed=3))
    loaded.model.eval()
    return loaded


@pytest.fixture(scope="module")
def saved(tiny: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(tiny.model, tiny.tokenizer, tmp_path_factory.mktemp("ckpt") / "step-1")


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_load_tiny(tiny: LoadedModel) -> None:
    assert tiny.source == "tiny"
    assert tiny.model.device.type == "cpu" and tiny.model.dtype == torch.float32
    assert tiny.tokenizer.chat_template


def test_saved_checkpoint_loads_in_plain_transformers(tiny: LoadedModel, saved: Path) -> None:
    names = {p.name for p in saved.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not any(name.endswith(".bin") for name in names)
    model = AutoModelForCausalLM.from_pretrained(saved, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(saved, local_files_only=True)
    messages = [{"role": "user", "content": "Sum the even numbers in [1, 2, 3, 4]. 中文 🎉"}]
    ids = render_prompt(tiny.tokenizer, messages)
    assert render_prompt(tokenizer, messages) == ids
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == tiny.tokenizer.decode(ids)
    assert tokenizer.eos_token_id == tiny.tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == tiny.tokenizer.eos_token_id
    torch.testing.assert_close(_logits(model, ids), _logits(tiny.model, ids), atol=1e-5, rtol=0)


def test_saved_checkpoint_loads_back_through_tidal(tiny: LoadedModel, saved: Path) -> None:
    loaded = load_model(ModelConfig(path=str(saved), device="cpu"))
    assert loaded.source == str(saved.resolve())
    ids = render_prompt(loaded.tokenizer, [{"role": "user", "content": "hi"}])
    torch.testing.assert_close(_logits(loaded.model.eval(), ids), _logits(tiny.model, ids), atol=1e-5, rtol=0)


def test_save_replaces_an_existing_checkpoint_atomically(tiny: LoadedModel, tmp_path: Path) -> None:
    target = tmp_path / "latest"
    save_checkpoint(tiny.model, tiny.tokenizer, target)
    other = load_model(ModelConfig(path="tiny", tiny=SMALL, device="cpu", seed=4))
    save_checkpoint(other.model, other.tokenizer, target)
    assert [p.name for p in tmp_path.iterdir()] == ["latest"], "no staging folders may be left behind"
    reloaded = AutoModelForCausalLM.from_pretrained(target, local_files_only=True)
    assert torch.equal(reloaded.model.embed_tokens.weight, other.model.model.embed_tokens.weight)


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist") as error:
        load_model(ModelConfig(path=str(tmp_path / "nope"), device="cpu"))
    assert str(tmp_path / "nope") in str(error.value) and "model.path" in str(error.value)


def test_file_instead_of_folder(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a folder"):
        load_model(ModelConfig(path=str(file), device="cpu"))


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(ModelConfig(path=str(tmp_path), device="cpu"))


def test_encoder_config_is_not_a_causal_lm(tmp_path: Path) -> None:
    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="not a causal LM") as error:
        load_model(ModelConfig(path=str(tmp_path), device="cpu"))
    assert "config.json" in str(error.value)


def test_architecture_that_is_not_a_causal_lm(saved: Path, tmp_path: Path) -> None:
    config = json.loads((saved / "config.json").read_text())
    config["architectures"] = ["Qwen2ForSequenceClassification"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="no causal-LM class"):
        load_model(ModelConfig(path=str(tmp_path), device="cpu"))


def test_folder_without_tokenizer(tiny: LoadedModel, tmp_path: Path) -> None:
    tiny.model.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="no tokenizer") as error:
        load_model(ModelConfig(path=str(tmp_path), device="cpu"))
    assert "tokenizer.json" in str(error.value)


def test_folder_without_weights(tiny: LoadedModel, tmp_path: Path) -> None:
    tiny.model.config.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="no weights"):
        load_model(ModelConfig(path=str(tmp_path), device="cpu"))


def test_corrupt_weights(saved: Path, tmp_path: Path) -> None:
    for item in saved.iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="cannot load the weights"):
        load_model(ModelConfig(path=str(tmp_path), device="cpu"))


def test_missing_chat_template_falls_back_to_chatml(
    tiny: LoadedModel, saved: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for item in saved.iterdir():
        if item.name != "chat_template.jinja":
            (tmp_path / item.name).write_bytes(item.read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="tidal.models.io"):
        loaded = load_model(ModelConfig(path=str(tmp_path), device="cpu"))
    assert "no chat template" in caplog.text
    messages = [{"role": "user", "content": "hi"}]
    assert render_prompt(loaded.tokenizer, messages) == render_prompt(tiny.tokenizer, messages)


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA device"):
            resolve_device("cuda")
    with pytest.raises(ModelLoadError, match="not a device"):
        resolve_device("tpu9")


def test_render_prompt_without_template(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    bare = tiny_tokenizer.__class__(tokenizer_object=tiny_tokenizer.backend_tokenizer)
    with pytest.raises(ModelLoadError, match="no chat template"):
        render_prompt(bare, [{"role": "user", "content": "hi"}])
