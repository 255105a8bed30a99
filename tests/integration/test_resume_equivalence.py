"""Exact resume (issue 4): in deterministic mode (fixed seeds, one rollout engine), a run killed
after step k and resumed from its folder ends with the same weights, the same per-step metrics and
the same held-out results as the run that was never interrupted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tidal.pipeline import quickstart as qs
from tidal.pipeline import run as pipeline_run
from tidal.rollout.engine import EmbeddedEngine
from tidal.storage.run import RunFolder

STEPS = 4
OVERRIDES = [f"trainer.steps={STEPS}", "trainer.checkpoint_every=1", "trainer.keep_checkpoints=8",
             # keep every sample so that every step trains (the smoke model's groups are mostly flat)
             "gate.drop_zero_variance=false", "gate.drop_truncated=false", "gate.drop_empty=false",
             "gate.max_repetition=1.0"]
COMPARED = ("reward/mean", "pass_rate", "kept_fraction", "completion_tokens", "loss", "policy_loss", "grad_norm",
            "entropy", "trained_samples")


def _weights(run: RunFolder, step: int) -> dict:
    return load_file(str(run.checkpoints_dir / "rl" / f"step-{step:06d}" / "model" / "model.safetensors"))


def _rows(run: RunFolder) -> dict[int, dict]:
    return {m["step"]: m for m in run.read_metrics() if m.get("phase") == "rl"}


def test_a_run_killed_at_step_k_and_resumed_equals_the_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    qs.run_quickstart(qs.find_config("smoke"), OVERRIDES, tmp_path, "whole")
    whole = RunFolder.open(tmp_path / "whole")

    original, calls = EmbeddedEngine.update_weights, {"n": 0}

    def crash_on_third(self: EmbeddedEngine, state: object, version: int) -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # after step 3's update, before its checkpoint
            raise RuntimeError("simulated kill")
        original(self, state, version)

    monkeypatch.setattr(EmbeddedEngine, "update_weights", crash_on_third)
    with pytest.raises(RuntimeError, match="simulated kill"):
        qs.run_quickstart(qs.find_config("smoke"), OVERRIDES, tmp_path, "killed")
    monkeypatch.setattr(EmbeddedEngine, "update_weights", original)
    killed = RunFolder.open(tmp_path / "killed")
    assert sorted(_rows(killed)) == [1, 2]
    pipeline_run.run_training(killed.path, [])

    a, b = _rows(whole), _rows(killed)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    for step in a:
        for key in COMPARED:
            assert a[step].get(key) == b[step].get(key), (step, key, a[step].get(key), b[step].get(key))
    final_a, final_b = _weights(whole, STEPS), _weights(killed, STEPS)
    assert final_a.keys() == final_b.keys()
    for name in final_a:
        assert bool((final_a[name] == final_b[name]).all()), name
    summary_a = json.loads(whole.summary_path.read_text())
    summary_b = json.loads(killed.summary_path.read_text())
    assert summary_a["after"] == summary_b["after"] and summary_a["overall"] == summary_b["overall"]
