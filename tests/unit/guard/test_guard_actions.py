"""The guard's pause and lower_lr actions on a real (tiny) run: a pause stops the run cleanly and
it resumes from its checkpoint; lower_lr lowers the rate the next updates use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.config import load_config
from tidal.errors import RunPaused
from tidal.pipeline.quickstart import find_config
from tidal.pipeline.run import Job, run_training, start_run

BASE = ["trainer.steps=4", "trainer.checkpoint_every=1", "gate.drop_zero_variance=false", "gate.drop_truncated=false",
        "gate.drop_empty=false", "gate.max_repetition=1.0", "eval.samples_per_task=1", "algorithm.entropy_coef=0.01"]


def test_a_pause_stops_the_run_cleanly_and_it_resumes_to_the_end(tmp_path: Path) -> None:
    cfg = load_config(find_config("smoke"), [*BASE, "debug.inject.loss_nan.step=1", "guard.nonfinite.actions=[pause]"])
    job = Job(cfg, start_run(cfg, tmp_path, "paused"), [])
    with pytest.raises(RunPaused, match="run paused after step 2: guard: nonfinite"):
        job.execute()
    run = job.run
    assert [json.loads(line)["step"] for line in (run.path / "pauses.jsonl").read_text().splitlines()] == [2]
    assert "rl" not in json.loads((run.path / "state.json").read_text())
    assert not (run.checkpoints_dir / "rl" / "step-000002").exists()  # the paused step is not saved
    run_training(run.path, [])  # the NaN fired once: the resumed run goes on from step 1 and finishes
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert [m["step"] for m in rows] == [1, 2, 3, 4] and json.loads((run.path / "state.json").read_text())["done"]


def test_lower_lr_multiplies_the_rate_of_the_updates_after_the_event(tmp_path: Path) -> None:
    cfg = load_config(find_config("smoke"), [*BASE, "debug.inject.loss_nan.step=1", "guard.nonfinite.actions=[lower_lr]",
                                             "guard.lr_factor=0.25"])
    job = Job(cfg, start_run(cfg, tmp_path, "lowered"), [])
    job.execute()
    lrs = {m["step"]: m["lr"] for m in job.run.read_metrics() if m.get("phase") == "rl"}
    assert lrs[1] == pytest.approx(1e-4) and lrs[3] == pytest.approx(2.5e-5) and lrs[4] == pytest.approx(2.5e-5)
    [event] = [json.loads(line) for line in (job.run.path / "guard.jsonl").read_text().splitlines()
               if '"lower_lr"' in line and '"event":"lower_lr"' in line.replace(" ", "")]
    assert event["step"] == 2 and event["lr"] == pytest.approx(2.5e-5)
