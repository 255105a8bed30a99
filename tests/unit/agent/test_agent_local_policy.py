"""Token-in/token-out on the tiny model: the episode's tokens are exactly the sampled ones."""

from __future__ import annotations

import torch

from tidal.agent import AgentConfig, run_episode
from tidal.agent.local import LocalPolicy
from tidal.config.schema import ModelConfig, TinyModelConfig
from tidal.models import load_model
from tidal.rollout import EmbeddedEngine
from tidal.sandbox.base import SandboxBackend
from tidal.types import Task


def _policy() -> LocalPolicy:
    loaded = load_model(ModelConfig(path="tiny", device="cpu", tiny=TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128, max_position=4096)))
    return LocalPolicy(EmbeddedEngine(loaded.model, loaded.tokenizer), loaded.tokenizer, temperature=1.0, seed=3)


def test_the_trained_tokens_are_the_generated_tokens(bwrap: SandboxBackend) -> None:
    task = Task(id="agent/t", domain="agent", prompt="Write hello into out.txt", verifier={"name": "python_tests"},
                tests={"test_out.py": "def test_out():\n    assert open('out.txt').read() == 'hello'\n"},
                max_steps=3)
    policy = _policy()
    generated: list[list[int]] = []
    prompts: list[list[int]] = []
    engine_complete = policy.engine.complete

    def recording(handle):  # the engine itself, with what it saw and made written down
        out = engine_complete(handle)
        prompts.append(list(handle.request.prompt))
        generated.append(list(out[0].token_ids))
        return out

    policy.engine.complete = recording  # type: ignore[method-assign]
    result = run_episode(task, policy, bwrap, AgentConfig(max_new_tokens=24, max_tokens=4000))
    trace = result.trace
    ids, mask, logprobs = trace["token_ids"], trace["mask"], trace["logprobs"]
    assert len(result.steps) == 3 and len(generated) == 3
    assert all(s.validity == "no_call" for s in result.steps)  # a random model calls nothing
    # Every turn's prompt is a prefix of the final list, and the masked tokens are, in order,
    # exactly the sampled ones: nothing was re-tokenised.
    for prompt in prompts:
        assert ids[: len(prompt)] == prompt
    assert [t for t, m in zip(ids, mask) if m] == [t for turn in generated for t in turn]
    assert sum(mask) == sum(s.tokens_out for s in result.steps)
    # The sampler's logprobs match a fresh forward pass over the whole list at the masked positions
    # (temperature 1), so a trainer recomputing them sees the same policy.
    with torch.no_grad():
        logits = policy.engine.model(torch.tensor([ids])).logits[0, :-1].float()
    recomputed = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    positions = [i for i, m in enumerate(mask) if m]
    expected = torch.tensor([logprobs[i] for i in positions])
    assert torch.allclose(recomputed[[i - 1 for i in positions]], expected, atol=1e-4)
    # The observation segments decode to the template's turns: a turn without a call is answered
    # by the user (there is no call for a tool message to answer).
    text = policy.tokenizer.decode(ids)
    assert text.count("<|im_start|>user\nerror (no_call)") == 3
