"""The CUDA code paths: the embedded engine, the trainer's bf16 step, checkpoints and a whole
smoke run on a GPU. Marked `gpu` (deselected by default: `pytest -m gpu tests/gpu` runs them) and
skipped where no CUDA device is present, so CPU machines and CI never run them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tidal.config.schema import (
    AlgorithmConfig,
    ModelConfig,
    TinyModelConfig,
    TrainerConfig,
)
from tidal.models import load_model, render_prompt, save_checkpoint
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.trainer.logprobs import collate
from tidal.trainer.trainer import Trainer
from tidal.types import Episode

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
QUESTIONS = ["hi", "What is 12 + 35?", "Write a function that reverses a list of numbers, then test it."]


def _lively(device: str) -> tuple[torch.nn.Module, object]:
    """The tiny model with its blocks scaled up (at the default init greedy decoding repeats one
    token, which would hide cache bugs), on `device`, in fp32."""
    loaded = load_model(ModelConfig(path="tiny", tiny=SMALL, device="cpu", seed=0))
    with torch.no_grad():
        for name, parameter in loaded.model.named_parameters():
            if name.startswith("model.layers.") and parameter.dim() == 2:
                parameter.mul_(8.0)
    return loaded.model.to(device).eval(), loaded.tokenizer


def test_greedy_generation_on_cuda_matches_the_cpu() -> None:
    cpu_model, tokenizer = _lively("cpu")
    cuda_model, _ = _lively("cuda")
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    params = SamplingParams(temperature=0, max_new_tokens=16)
    on_cpu = EmbeddedEngine(cpu_model, tokenizer, "cpu").generate(prompts, n=2, params=params)
    on_cuda = EmbeddedEngine(cuda_model, tokenizer, "cuda").generate(prompts, n=2, params=params)
    for a, b in zip(on_cpu, on_cuda):
        # TF32 or a different reduction order may flip a near-tie late in a sequence; the start must agree.
        assert [c.token_ids[:8] for c in a] == [c.token_ids[:8] for c in b]
        assert all(c.finish_reason in ("stop", "length") for c in b)


def test_sampled_logprobs_on_cuda_match_a_recomputation() -> None:
    model, tokenizer = _lively("cuda")
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    groups = EmbeddedEngine(model, tokenizer, "cuda").generate(
        prompts, n=4, params=SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
    )
    eos = tokenizer.eos_token_id
    for group in groups:
        for completion in group:
            # The GPU loop looks at finished rows only every few steps: what a row sampled after its
            # end must be cut off, and its finish reason still right.
            assert eos not in completion.token_ids[:-1]
            if completion.finish_reason == "stop":
                assert completion.token_ids[-1] == eos
            else:
                assert len(completion.token_ids) == 12 and eos not in completion.token_ids
            ids = torch.tensor([completion.prompt_ids + completion.token_ids], device="cuda")
            with torch.no_grad():
                logits = model(ids).logits[0, len(completion.prompt_ids) - 1 : -1].float()
            expected = torch.log_softmax(logits, -1).gather(1, ids[0, len(completion.prompt_ids):, None]).squeeze(1)
            assert torch.allclose(torch.tensor(completion.logprobs), expected.cpu(), atol=2e-3)


def test_a_bf16_rl_step_on_cuda_trains_and_its_checkpoint_loads_on_the_cpu(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model, tokenizer = _lively("cuda")
    model.train()
    trainer = Trainer(model, TrainerConfig(lr=1e-3, precision="auto", warmup_steps=0), AlgorithmConfig(),
                      "cuda", total_steps=4)
    prompt = render_prompt(tokenizer, [{"role": "user", "content": "What is 2 + 2?"}])
    groups = EmbeddedEngine(model, tokenizer, "cuda").generate(
        [prompt], n=8, params=SamplingParams(temperature=1.0, max_new_tokens=8, seed=1)
    )
    episodes = []
    for k, completion in enumerate(groups[0]):
        episode = Episode(id=f"e{k}", task_id="t", domain="math", group_id="g", completion=completion)
        episode.advantage = 1.0 if k % 2 else -1.0
        episodes.append(episode)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = trainer.rl_step(collate(episodes, tokenizer.pad_token_id, "cuda"))
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast, not a bf16 copy
    folder = save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    reloaded = AutoModelForCausalLM.from_pretrained(folder)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name].cpu()), name


def test_the_smoke_quickstart_runs_end_to_end_on_cuda(tmp_path: Path) -> None:
    import shutil

    from tidal.pipeline import quickstart as qs

    overrides = ["model.device=cuda"]
    if shutil.which("bwrap") is None:  # a GPU image without bubblewrap: run the code tests unsandboxed
        overrides.append("reward.sandbox.backend=unsafe_local")
    report = qs.run_quickstart(qs.find_config("smoke"), overrides, tmp_path, "gpu")
    summary = json.loads((report.parent / "summary.json").read_text())
    assert summary["after"] and summary["before"]
    metrics = [json.loads(line) for line in (report.parent / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("phase") == "rl" for m in metrics)
