"""End-to-end: the CLI's quickstart on the smoke config, resume after a crash, bad input."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tidal.cli import app
from tidal.pipeline import quickstart as qs
from tidal.storage.run import RunFolder
from tidal.storage.trajectories import TrajectoryWriter

runner = CliRunner()


def test_help_is_fast_and_lists_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "from tidal.cli import app"], capture_output=True, text=True
    )
    heavy = [line for line in out.stderr.splitlines() if line.rstrip().endswith(("torch", "transformers"))]
    assert not heavy, "tidal --help must not import torch or transformers"
    result = runner.invoke(app, ["quickstart", "--help"])
    assert result.exit_code == 0 and "--smoke" in result.output


def test_smoke_quickstart_writes_a_complete_run_folder(tmp_path: Path) -> None:
    result = runner.invoke(app, ["quickstart", "--smoke", "--out", str(tmp_path), "--name", "smoke"])
    assert result.exit_code == 0, result.output
    run = RunFolder.open(tmp_path / "smoke")
    assert f"report: {run.report_path}" in result.output
    assert run.config_path.is_file()
    summary = json.loads(run.summary_path.read_text())
    assert {"before", "after", "domains", "overall", "run"} <= set(summary)
    assert summary["overall"]["n"] == 10  # every eval task paired
    rl_rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert [m["step"] for m in rl_rows] == [1, 2]
    assert all("reward/mean" in m and "trained_samples" in m for m in rl_rows)
    writer = TrajectoryWriter(run)
    assert writer.steps() == [0, 1]
    record = next(writer.read_all())
    assert record["token_ids"] and len(record["logprobs"]) == len(record["token_ids"])
    assert record["score"]["outcome"] in {"passed", "failed", "timeout", "crashed", "memory_limit"}
    assert (run.checkpoints_dir / "warm-start" / "config.json").is_file()
    assert "<svg" in run.report_path.read_text()


def test_crashed_run_resumes_without_losing_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tidal.rollout.engine import EmbeddedEngine

    original = EmbeddedEngine.update_weights
    calls = {"n": 0}

    def crash_on_third(self: EmbeddedEngine, state: object, version: int) -> None:
        # Called once per RL step, after the step's trajectories are stored and its update ran.
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash")
        original(self, state, version)

    monkeypatch.setattr(EmbeddedEngine, "update_weights", crash_on_third)
    cfg = qs.find_config("smoke")
    with pytest.raises(RuntimeError, match="simulated crash"):
        qs.run_quickstart(cfg, ["trainer.steps=4"], tmp_path, "crash")
    run = RunFolder.open(tmp_path / "crash")
    writer = TrajectoryWriter(run)
    assert writer.steps() == [0, 1, 2]  # step 2 was stored before its update crashed
    saved_step0 = writer.read_step(0)

    monkeypatch.setattr(EmbeddedEngine, "update_weights", original)
    result = runner.invoke(app, ["train", str(run.path)])
    assert result.exit_code == 0, result.output
    assert writer.steps() == [0, 1, 2, 3]
    assert writer.read_step(0) == saved_step0  # finished work is untouched
    steps = [m["step"] for m in run.read_metrics() if m.get("phase") == "rl"]
    assert steps == [1, 2, 3, 4]  # resumed from the step-2 checkpoint, nothing trained twice
    assert json.loads(run.summary_path.read_text())["overall"]["n"] == 10


def test_invalid_config_is_one_clear_report(tmp_path: Path) -> None:
    result = runner.invoke(app, ["quickstart", "--smoke", "--out", str(tmp_path), "trainer.lr=-1", "rollout.top_p=0"])
    assert result.exit_code == 2
    assert "trainer.lr: must be > 0.0" in result.output and "rollout.top_p: must be > 0.0" in result.output


def test_merged_policy_is_evaluated_and_exported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    # The smoke model earns no reward; keeping its samples and a replay loss make the weights move.
    overrides = ["merge.weight=0.5", "replay.source=base", "algorithm.replay_weight=1",
                 "gate.drop_truncated=false", "gate.drop_zero_variance=false", "gate.max_repetition=1"]
    evaluated: dict[str, dict[str, torch.Tensor]] = {}
    original = qs.Job._evaluate

    def recording(self: qs.Job, tag: str, engine: Any, *args: Any, **kwargs: Any) -> Any:
        evaluated[tag] = {k: v.clone() for k, v in engine.model.state_dict().items()}
        return original(self, tag, engine, *args, **kwargs)

    monkeypatch.setattr(qs.Job, "_evaluate", recording)
    path = qs.run_quickstart(qs.find_config("smoke"), overrides, tmp_path, "merged")
    run = RunFolder.open(tmp_path / "merged")
    assert path == run.report_path
    summary = json.loads(run.summary_path.read_text())
    policy = Path(summary["run"]["policy"])
    assert policy == run.checkpoints_dir / "policy" and summary["run"]["merge_weight"] == 0.5
    AutoModelForCausalLM.from_pretrained(policy)  # plain transformers loads the exported policy
    start = load_file(str(run.checkpoints_dir / "warm-start" / "model.safetensors"))
    trained = load_file(str(run.checkpoints_dir / "rl" / "step-000002" / "model" / "model.safetensors"))
    merged = load_file(str(policy / "model.safetensors"))
    moved = 0
    for name, tensor in merged.items():
        assert torch.allclose(tensor, start[name] + 0.5 * (trained[name] - start[name]), atol=1e-6), name
        moved += int(not torch.equal(trained[name], start[name]))
        assert torch.equal(evaluated["after"][name], tensor), name  # the merged weights were evaluated
    assert moved > 0  # RL did change the weights, so the merge is not trivially equal to either end


def test_unmerged_run_points_at_its_last_rl_checkpoint(tmp_path: Path) -> None:
    qs.run_quickstart(qs.find_config("smoke"), [], tmp_path, "plain")
    run = RunFolder.open(tmp_path / "plain")
    summary = json.loads(run.summary_path.read_text())
    assert Path(summary["run"]["policy"]) == run.checkpoints_dir / "rl" / "step-000002" / "model"
    assert not (run.checkpoints_dir / "policy").exists()
