"""`tidal train` with trainer ranks, as a user runs it: the command of the issue works as written,
and a rank killed with SIGKILL mid-run fails the run, which resumes from its folder with nothing
lost or trained twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tidal.storage.run import RunFolder
from tidal.storage.store import open_run_store

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
# Keep every sample, so every step trains (the smoke model's groups are mostly flat).
KEEP_ALL = ["gate.drop_zero_variance=false", "gate.drop_truncated=false", "gate.drop_empty=false",
            "gate.max_repetition=1.0"]
TIDAL = [sys.executable, "-m", "tidal.cli"]


def _run_folder(parent: Path) -> Path:
    runs = [p for p in (parent / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def _rl_rows(run: Path) -> list[dict]:
    return [m for m in RunFolder.open(run).read_metrics() if m.get("phase") == "rl"]


def test_the_command_as_written_trains_on_two_fsdp2_ranks(tmp_path: Path) -> None:
    command = [*TIDAL, "train", SMOKE, "trainer.parallel.strategy=fsdp2", "trainer.parallel.world_size=2", *KEEP_ALL]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = _run_folder(tmp_path)
    rows = _rl_rows(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["trained_samples"] > 0 and r["ranks_s"] > 0 for r in rows)
    checkpoint = run / "checkpoints" / "rl" / "step-000002"
    assert (checkpoint / "optimizer" / ".metadata").is_file()  # the sharded optimizer, DCP
    assert (checkpoint / "model" / "model.safetensors").is_file()  # the consolidated weights
    assert json.loads((run / "summary.json").read_text())["overall"]["n"] > 0


def _workers_of(pid: int) -> list[int]:
    """Child processes of `pid` that are trainer ranks."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and "tidal.trainer.parallel.worker" in cmdline:
            found.append(int(entry.name))
    return found


def test_a_rank_killed_mid_run_fails_the_run_and_it_resumes_with_nothing_trained_twice(tmp_path: Path) -> None:
    steps = 6
    command = [*TIDAL, "train", SMOKE, "trainer.parallel.strategy=ddp", "trainer.parallel.world_size=2",
               f"trainer.steps={steps}", "trainer.checkpoint_every=1", *KEEP_ALL]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:
            runs = tmp_path / "runs"
            if runs.is_dir() and any(runs.iterdir()) and len(_rl_rows(_run_folder(tmp_path))) >= 2:
                break
            time.sleep(0.2)
        workers = _workers_of(process.pid)
        assert process.poll() is None and workers, "the run ended before a rank could be killed"
        os.kill(workers[0], signal.SIGKILL)
        _, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0
    assert "trainer rank 1" in stderr and "signal 9" in stderr, stderr[-3000:]
    run = _run_folder(tmp_path)
    assert len(_rl_rows(run)) < steps

    crashed_s = json.loads((run / "state.json").read_text())["elapsed_s"]
    assert crashed_s > 0
    resumed = subprocess.run([*TIDAL, "train", str(run)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())["run"]
    assert summary["duration_s"] > crashed_s  # both attempts count
    rows = _rl_rows(run)
    assert summary["rl_seconds"] == pytest.approx(sum(r["step_s"] for r in rows), abs=0.2)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # nothing lost, no step twice
    trained = open_run_store(RunFolder.open(run)).trained()  # trajectory id -> the update that trained it
    per_update = Counter(trained.values())
    assert sorted(per_update) == list(range(steps))
    assert [per_update[step] for step in range(steps)] == [r["trained_samples"] for r in rows]
    assert not _workers_of(process.pid)


def test_ddp_and_fsdp2_runs_of_the_smoke_config_match_one_process(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from tidal.pipeline import quickstart as qs

    steps = 3
    # The entropy bonus and KL give every step a gradient (the smoke model's rewards are flat).
    overrides = [f"trainer.steps={steps}", "algorithm.entropy_coef=0.05", "algorithm.kl_coef=0.05", *KEEP_ALL]
    runs = {}
    for strategy in ("none", "ddp", "fsdp2"):
        world = [] if strategy == "none" else [f"trainer.parallel.strategy={strategy}", "trainer.parallel.world_size=2"]
        qs.run_quickstart(qs.find_config("smoke"), [*overrides, *world], tmp_path, strategy)
        runs[strategy] = RunFolder.open(tmp_path / strategy)
    rows = {name: _rl_rows(run.path) for name, run in runs.items()}
    start = load_file(str(runs["none"].checkpoints_dir / "warm-start" / "model.safetensors"))
    final = {name: load_file(str(run.checkpoints_dir / "rl" / f"step-{steps:06d}" / "model" / "model.safetensors"))
             for name, run in runs.items()}
    moved = torch.cat([(final["none"][k] - start[k]).flatten() for k in sorted(start)])
    assert all(r["grad_norm"] > 0 for r in rows["none"]) and moved.norm() > 0
    for name in ("ddp", "fsdp2"):
        assert [r["trained_samples"] for r in rows[name]] == [r["trained_samples"] for r in rows["none"]]
        for want, have in zip(rows["none"], rows[name]):
            for key in ("loss", "grad_norm", "entropy", "kl"):
                assert abs(have[key] - want[key]) <= 1e-4 * max(abs(want[key]), 1e-3), (name, want["step"], key)
        assert final[name].keys() == final["none"].keys()
        # The update each made from the same start: equal up to float summation order (AdamW's
        # early steps are near lr * sign(grad), so compare the whole update, not single weights).
        delta = torch.cat([(final[name][k] - start[k]).flatten() for k in sorted(start)])
        assert (delta - moved).norm() <= 1e-3 * moved.norm(), name
