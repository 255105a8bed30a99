"""LoRA (trainer/lora.py): only the adapter trains and the base stays bit-identical; the KL
reference is the base model; the merged weights and the exported folder are the adapted model's;
a checkpoint resumes to the step an uninterrupted run takes; configs that cannot work are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tidal.config.scale import LoraConfig
from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.errors import CheckpointError
from tidal.trainer import lora
from tidal.trainer.logprobs import token_logprobs
from tidal.trainer.trainer import Trainer

from .tiny import build_model, random_batch

LORA = LoraConfig(enabled=True, r=4, alpha=8.0)
ALGO = AlgorithmConfig(kl_coef=0.1, entropy_coef=0.01)


def _adapted(seed: int = 0, tie: bool = True, cfg: LoraConfig = LORA) -> torch.nn.Module:
    return lora.apply_lora(build_model(seed, tie=tie), cfg, seed=seed)


def _trainer(model: torch.nn.Module, algo: AlgorithmConfig = ALGO) -> Trainer:
    cfg = TrainerConfig(lr=5e-2, micro_batch_size=4, precision="fp32")
    return Trainer(model, cfg, algo, "cpu", total_steps=10, max_tokens=8)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def _base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if ".lora_" not in k}


def test_only_the_adapter_trains_and_the_base_stays_bit_identical() -> None:
    model = _adapted()
    base = _base_state(model)
    trainer = _trainer(model)
    assert trainer.params and all(".lora_" in name for name, p in model.named_parameters() if p.requires_grad)
    adapter_before = {k: v.clone() for k, v in lora.adapter_state_dict(model).items()}
    for step in range(3):
        metrics = trainer.rl_step(random_batch(model, seed=step))
        assert metrics["skipped"] == 0 and metrics["grad_norm"] > 0
    assert all(torch.equal(model.state_dict()[k], v) for k, v in base.items())
    changed = [k for k, v in lora.adapter_state_dict(model).items() if not torch.equal(v, adapter_before[k])]
    assert any("lora_B" in k for k in changed) and any("lora_A" in k for k in changed)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tie is intact
    assert "lm_head" not in " ".join(lora.lora_layers(model))  # all-linear leaves the head out


def test_the_kl_reference_is_the_base_model() -> None:
    plain_base = build_model(0, tie=True)
    model = _adapted()
    trainer = _trainer(model)
    for step in range(2):
        trainer.rl_step(random_batch(model, seed=step))
    batch = trainer._on_device(random_batch(model, seed=9))
    reference = trainer._reference_logprobs(batch)
    assert reference is not None
    expected, _ = token_logprobs(plain_base, batch.input_ids, batch.attention_mask)
    mask = batch.completion_mask > 0
    assert torch.allclose(reference[mask], expected[mask], atol=1e-5)
    adapted, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
    assert (adapted[mask] - expected[mask]).abs().max() > 1e-3  # the adapter is back on after the pass
    assert all(p.requires_grad for n, p in model.named_parameters() if ".lora_" in n)
    assert trainer.rl_step(random_batch(model, seed=5))["kl"] > 0


def test_merged_weights_are_the_adapted_model_without_touching_it(tmp_path: Path) -> None:
    model = _adapted()
    _trainer(model).rl_step(random_batch(model, seed=0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    plain = lora.plain_copy(model)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert set(plain.state_dict()) == set(build_model(0, tie=True).state_dict())
    assert plain.lm_head.weight is plain.model.embed_tokens.weight
    assert torch.allclose(_logits(plain, ids), _logits(model, ids), atol=1e-5)
    # The exported folder: plain transformers, no peft, the adapted model's logits.
    plain.save_pretrained(tmp_path / "policy")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    assert not lora.has_adapter(loaded)
    assert torch.allclose(_logits(loaded, ids), _logits(model, ids), atol=1e-5)
    with lora.adapter_disabled(model):
        assert (_logits(loaded, ids) - _logits(model, ids)).abs().max() > 1e-3


def test_adapter_merge_scales_the_update() -> None:
    model = _adapted()
    _trainer(model).rl_step(random_batch(model, seed=0))
    base = build_model(0, tie=True).state_dict()
    full = lora.merged_state_dict(model)
    with lora.AdapterMerge(0.5).view(model):
        half = lora.merged_state_dict(model)
    assert torch.equal(lora.merged_state_dict(model)["model.layers.0.mlp.up_proj.weight"], full["model.layers.0.mlp.up_proj.weight"])
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        assert torch.allclose(half[name], base[name] + 0.5 * (full[name] - base[name]), atol=1e-6)
        assert not torch.allclose(full[name], base[name])


def test_a_checkpoint_resumes_to_the_uninterrupted_step(tmp_path: Path) -> None:
    model = _adapted()
    trainer = _trainer(model)
    for step in range(2):
        trainer.rl_step(random_batch(model, seed=step))
    folder = trainer.save(tmp_path / "rl" / "step-000002", 2)
    assert sorted(p.name for p in (folder / "model").iterdir()) == [lora.ADAPTER_CONFIG, lora.ADAPTER_WEIGHTS]
    going_on = trainer.rl_step(random_batch(model, seed=2))

    resumed_model = _adapted()
    resumed = _trainer(resumed_model)
    assert resumed.load(folder)[0] == 2
    again = resumed.rl_step(random_batch(resumed_model, seed=2))
    assert again["loss"] == going_on["loss"] and again["kl"] == going_on["kl"]
    for key, tensor in lora.adapter_state_dict(model).items():
        assert torch.equal(lora.adapter_state_dict(resumed_model)[key], tensor), key

    # peft's own format: the base plus the saved adapter is the adapted model at step 2.
    from peft import PeftModel

    stepped = _adapted()
    _trainer(stepped).load(folder)
    ids = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(3))
    with_peft = PeftModel.from_pretrained(build_model(0, tie=True), folder / "model")
    assert torch.allclose(_logits(with_peft, ids), _logits(stepped, ids), atol=1e-5)


def test_checkpoint_and_model_must_agree_on_lora(tmp_path: Path) -> None:
    full = build_model(0)
    Trainer(full, TrainerConfig(), AlgorithmConfig(), "cpu", total_steps=2).save(tmp_path / "full" / "step-1", 1)
    adapted = _trainer(_adapted(tie=False))
    with pytest.raises(CheckpointError, match="LoRA adapter"):
        adapted.load(tmp_path / "full" / "step-1")
    adapted.save(tmp_path / "lora" / "step-1", 1)
    with pytest.raises(CheckpointError, match="model has no adapter"):
        Trainer(build_model(0), TrainerConfig(), AlgorithmConfig(), "cpu", total_steps=2).load(tmp_path / "lora" / "step-1")
    other = _trainer(_adapted(tie=False, cfg=LoraConfig(enabled=True, r=8)))
    with pytest.raises(CheckpointError, match="r=4"):
        other.load(tmp_path / "lora" / "step-1")


def test_targets_are_checked() -> None:
    adapted = _adapted(cfg=LoraConfig(enabled=True, target_modules=["q_proj", "v_proj"]))
    assert sorted({name.rsplit(".", 1)[1] for name in lora.lora_layers(adapted)}) == ["q_proj", "v_proj"]
    with pytest.raises(ValueError, match="tied"):
        lora.apply_lora(build_model(0, tie=True), LoraConfig(enabled=True, target_modules=["lm_head"]))
    with pytest.raises(ValueError, match="target_modules"):
        lora.apply_lora(build_model(0), LoraConfig(enabled=True, target_modules=["no_such_proj"]))
    with pytest.raises(ValueError, match="already"):
        lora.apply_lora(adapted, LORA)
    # Same seed, same adapter: a resumed run starts from the adapter an uninterrupted one had.
    first, second = _adapted(), _adapted()
    assert all(torch.equal(v, lora.adapter_state_dict(second)[k]) for k, v in lora.adapter_state_dict(first).items())

