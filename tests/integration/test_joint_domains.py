"""Joint training over several domains with the issue-7 machinery on: per-domain running reward
normalisation, a difficulty curriculum and replay of the warm start's data. Every domain's mean
train reward must rise, and the normaliser's and curricula's state must be in the checkpoint and
come back on resume. Sandbox-free verifiers (exact match, regex) keep it fast."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tidal.pipeline import quickstart as qs
from tidal.pipeline import run as pipeline_run
from tidal.storage.run import RunFolder
from tidal.trainer.checkpoint import latest_checkpoint

DOMAINS = ("knowledge", "general")
CURRICULUM = "{min_observations: 8, suspect_after: 24, retire_after: 24, band_start: [0.05, 0.95], band_end: [0.05, 0.95]}"
OVERRIDES = [
    "model.tiny.hidden_size=64",
    "model.tiny.num_layers=2",
    "model.tiny.num_heads=4",
    "model.tiny.num_kv_heads=2",
    "model.tiny.intermediate_size=192",
    "rollout.group_size=8",
    "rollout.max_new_tokens=16",
    "tasks.tasks_per_step=64",
    ("tasks.domains={knowledge: {family: knowledge, n_train: 300, n_eval: 20, max_difficulty: 2}, "
    "general: {family: general, n_train: 300, n_eval: 20, max_difficulty: 1}}"),
    *[f"tasks.domains.{d}.normaliser={{kind: running}}" for d in DOMAINS],
    *[f"tasks.domains.{d}.curriculum={CURRICULUM}" for d in DOMAINS],
    "replay.source=base",
    "replay.batch_size=16",
    "algorithm.replay_weight=0.05",
    "algorithm.advantage=dr_grpo",  # normalised rewards reach the advantages unscaled
    "warm_start.steps=300",
    "warm_start.batch_size=32",
    "warm_start.lr=3e-3",
    "warm_start.share=1.0",
    "trainer.steps=30",
    "trainer.lr=3e-4",
    "trainer.warmup_steps=3",
    "trainer.checkpoint_every=24",  # checkpoints at 24 and 30: the resume below replays 6 steps
    "eval.samples_per_task=2",
    "run.progress=false",
    "run.seed=3",
]


def test_joint_run_raises_every_domains_reward_and_resumes_its_state(tmp_path: Path) -> None:
    qs.run_quickstart(qs.find_config("smoke"), OVERRIDES, tmp_path, "joint")
    run = RunFolder.open(tmp_path / "joint")
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert len(rows) == 30
    for domain in DOMAINS:
        rewards = [m[f"reward/{domain}"] for m in rows]
        first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
        assert last > first + 0.03, f"{domain}: train reward did not rise ({first:.2f} -> {last:.2f})"
    assert any(m.get("replay_loss", 0) > 0 for m in rows)
    assert all(f"norm/{d}/count" in rows[-1] for d in DOMAINS)

    # The state in the last checkpoint is the state the run ended with.
    checkpoint = latest_checkpoint(run.checkpoints_dir / "rl")
    assert checkpoint is not None and checkpoint.name.endswith("000030")
    saved = json.loads((checkpoint / "state.json").read_text())["extra"]["domains"]
    assert set(saved["curricula"]) == set(DOMAINS)
    assert saved["normaliser"]["domains"]["knowledge"]["state"]["count"] == rows[-1]["norm/knowledge/count"]

    # Resuming from the step-24 checkpoint continues with the state it saved, not a fresh one.
    state = json.loads(run.path.joinpath("state.json").read_text())
    state.pop("rl"), state.pop("eval_after"), state.pop("done")
    run.path.joinpath("state.json").write_text(json.dumps(state))
    for step in sorted((run.checkpoints_dir / "rl").iterdir())[1:]:
        shutil.rmtree(step)
    pipeline_run.run_training(run.path, [])
    resumed = [m for m in RunFolder.open(run.path).read_metrics() if m.get("phase") == "rl"]
    assert resumed[-1]["step"] == 30
    assert resumed[-1]["norm/knowledge/count"] == rows[-1]["norm/knowledge/count"]
