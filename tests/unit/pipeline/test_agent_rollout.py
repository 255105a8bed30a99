"""The agent domain in RL: multi-turn episodes sampled through the episode runner become trainable
episodes whose trained tokens are exactly the generated ones (tool results masked out), and a
smoke run with an agent domain trains on them end to end."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tidal.config.schema import ModelConfig, TidalConfig, TinyModelConfig
from tidal.models import load_model
from tidal.pipeline import quickstart as qs
from tidal.pipeline.stages import Sampler
from tidal.rollout import EmbeddedEngine
from tidal.storage.run import RunFolder
from tidal.trainer.logprobs import collate, token_logprobs
from tidal.types import Outcome, Task, is_multi_turn

TASK = Task(id="agent/t", domain="agent", prompt="Write hello into out.txt", verifier={"name": "python_tests"},
            tests={"test_out.py": "def test_out():\n    assert open('out.txt').read() == 'hello'\n"},
            tools=["bash", "write_file"], max_steps=3)


def test_agent_episodes_train_only_their_generated_tokens() -> None:
    loaded = load_model(ModelConfig(path="tiny", device="cpu", tiny=TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128, max_position=4096)))
    engine = EmbeddedEngine(loaded.model, loaded.tokenizer)
    cfg = TidalConfig.model_validate({
        "tasks": {"domains": {"agent": {"family": "agent"}}},
        "rollout": {"group_size": 2, "max_new_tokens": 12, "agent_max_tokens": 4000},
    })
    plain = Task(id="math/t", domain="math", prompt="1+1?", verifier={"name": "exact_match", "answer": "2"})
    assert is_multi_turn(TASK) and not is_multi_turn(plain)

    [group] = Sampler(cfg, "run", engine).sample([TASK], step=0, positions=[3])
    episodes = group.episodes
    assert group.task is TASK and group.position == 3
    assert [e.id for e in episodes] == ["run/step-000000/g003/s00", "run/step-000000/g003/s01"]
    for episode in episodes:
        c = episode.completion
        assert episode.score is not None and episode.score.outcome is Outcome.FAILED  # judged by its tests
        assert c.loss_mask is not None and len(c.loss_mask) == len(c.token_ids) == len(c.logprobs)
        assert 0 in c.loss_mask and 1 in c.loss_mask  # three turns with the runner's answers between them
        assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.loss_mask) if m == 0)

    batch = collate(episodes, loaded.tokenizer.pad_token_id)
    for row, episode in enumerate(episodes):
        start = len(episode.completion.prompt_ids)
        assert batch.completion_mask[row, start : start + len(episode.completion.loss_mask)].tolist() == \
            [float(m) for m in episode.completion.loss_mask]
    # Token in, token out: the trainer's logprobs of the trained tokens are the sampler's.
    with torch.no_grad():
        logprobs, _ = token_logprobs(loaded.model, batch.input_ids, batch.attention_mask)
    trained = batch.completion_mask > 0
    assert torch.allclose(logprobs[trained], batch.old_logprobs[trained], atol=1e-4)


def test_a_run_with_an_agent_domain_trains_on_its_episodes(tmp_path: Path) -> None:
    overrides = [
        ("tasks.domains={agent: {family: agent, n_train: 4, n_eval: 2, max_difficulty: 1}, "
        "math: {family: math, n_train: 8, n_eval: 2, max_difficulty: 1}}"),
        "tasks.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=12",
        "model.tiny.max_position=4096", "trainer.steps=2", "eval.samples_per_task=1",
        "gate.drop_zero_variance=false", "gate.drop_truncated=false", "gate.drop_empty=false",
        "gate.max_repetition=1.0", "audit.watch.enabled=false",
    ]
    qs.run_quickstart(qs.find_config("smoke"), overrides, tmp_path, "agent")
    run = RunFolder.open(tmp_path / "agent")
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert len(rows) == 2 and all(m["trained_samples"] > 0 for m in rows)
    assert any("reward/agent" in m for m in rows)
    assert all(abs(m["ratio_mean"] - 1.0) < 1e-3 for m in rows)  # on-policy: the trained tokens are the sampled ones
    evaluated = [json.loads(line) for line in (run.path / "eval" / "after.jsonl").read_text().splitlines()]
    agent = [r for r in evaluated if r["domain"] == "agent"]
    assert len(agent) == 2 and all(r["scored"] == 1 for r in agent)  # judged by acceptance, not as text
