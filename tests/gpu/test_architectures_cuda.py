"""The engine on CUDA for every architecture of the CPU matrix (tidal.models.random_init): fp32
behaviour log-probs equal teacher-forced ones (TF32 off), greedy equals HF `generate`, and in bf16
the log-prob difference is reported. Marked `gpu`: `pytest -m gpu tests/gpu` runs them where a
CUDA device is present (scripts/gpu_architectures.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tidal.models.random_init import random_checkpoint
from tidal.models.tokenizer import build_tiny_tokenizer
from tidal.rollout import EmbeddedEngine, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3", "gpt2", "olmo2", "qwen3_moe", "mixtral"]
PROMPTS = ["hello there, how are", "What is 12 + 35? Answer", "x" * 40]


def _teacher_forced(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens], device="cuda")
    with torch.no_grad():
        logp = model(ids).logits[0].float().log_softmax(-1)
    return logp[len(prompt) - 1 : -1].gather(1, torch.tensor(tokens, device="cuda")[:, None])[:, 0].cpu()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_engine_matches_the_model_on_cuda(arch: str, dtype: torch.dtype, tmp_path: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    folder = random_checkpoint(arch, tmp_path / arch)
    tokenizer = build_tiny_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to("cuda").eval()
    engine = EmbeddedEngine(model, tokenizer, kv_blocks=256, kv_block_size=16)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    out = engine.generate(prompts, n=4, params=SamplingParams(temperature=1.0, max_new_tokens=24, seed=3))
    worst = 0.0
    for prompt, completions in zip(prompts, out):
        for completion in completions:
            reference = _teacher_forced(model, prompt, completion.token_ids)
            worst = max(worst, (reference - torch.tensor(completion.logprobs)).abs().max().item())
    print(f"{arch} {dtype}: forward={engine.forward_path} max |logprob difference| = {worst:.2e}")
    if dtype == torch.float32:
        assert worst <= 1e-4
        greedy = engine.generate(prompts[:1], params=SamplingParams(temperature=0.0, max_new_tokens=24))[0][0]
        ids = torch.tensor([prompts[0]], device="cuda")
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24,
                            eos_token_id=None, pad_token_id=0)[0, len(prompts[0]):].tolist()
        assert greedy.token_ids == hf[: len(greedy.token_ids)]
    else:
        assert worst < 0.5  # bf16 rounding, reported above
