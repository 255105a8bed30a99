"""`tidal train configs/smoke.yaml` with every injected fault of `debug.inject`: each is detected
within K steps and rolled back to a checkpoint from before it, the run recovers and finishes, and
the ledger trains every trajectory once (the rolled-back steps' rows voided, then redone)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tidal.storage.run import RunFolder
from tidal.storage.schema import LEDGER
from tidal.storage.store import existing_run_store

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12
K = 2  # steps from a fault to its detection, at most
# Every sample trains (the tiny model's answers are cut and unrewarded), and an entropy bonus and
# a KL term give every update a gradient, so that a learning-rate spike moves the weights.
OVERRIDES = [f"trainer.steps={STEPS}", "trainer.checkpoint_every=1", "gate.drop_zero_variance=false",
             "gate.drop_truncated=false", "gate.drop_empty=false", "gate.max_repetition=1.0", "eval.samples_per_task=1",
             "pipeline.retry_backoff_s=0", "algorithm.entropy_coef=0.01", "algorithm.kl_coef=0.05",
             "guard.nonfinite.actions=[rollback]", "guard.grad_spike.actions=[rollback]",
             "guard.infra_errors.actions=[rollback]", "guard.reward_spike.actions=[rollback,quarantine]",
             "guard.reward_spike.warmup=2", "guard.reward_spike.min_delta=0.3", "guard.reward_spike.z=1",
             "guard.max_rollbacks=8",
             # the hack's two tasks come up at steps 2 and 3 (the mixer's order at tasks.seed)
             "debug.inject.reward_hack.step=1", "debug.inject.reward_hack.domain=math", "debug.inject.reward_hack.tasks=2",
             "debug.inject.loss_nan.step=5", "debug.inject.lr_spike.step=7", "debug.inject.sandbox_failure.step=9",
             "telemetry.tensorboard=true"]
FAULT_DETECTOR = {"loss_nan": "nonfinite", "lr_spike": "grad_spike", "sandbox_failure": "infra_errors",
                  "reward_hack": "reward_spike"}


def test_every_injected_fault_is_detected_rolled_back_and_the_run_finishes(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tidal.cli", "train", str(ROOT / "configs" / "smoke.yaml"), *OVERRIDES,
               f"run.dir={tmp_path}", "run.name=guarded", "run.progress=false"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = RunFolder.open(tmp_path / "guarded")
    events = [json.loads(line) for line in (run.path / "guard.jsonl").read_text().splitlines()]
    injected = {e["fault"]: e["step"] for e in events if e["event"] == "injected"}
    assert set(injected) == {"loss_nan", "lr_spike", "sandbox_failure"}  # the hack is persistent: no 'injected' row

    rollbacks = [e for e in events if e["event"] == "rollback"]
    for fault, step in injected.items():
        detected = [e for e in events if e["event"] == "detected" and e["detector"] == FAULT_DETECTOR[fault]
                    and step + 1 <= e["step"] <= step + 1 + K]
        assert detected, f"{fault} at step {step} was not detected within {K} steps: {events}"
        # rolled back to a checkpoint taken before the faulty update (index `step`, so at most `step` updates)
        assert any(r["step"] == detected[0]["step"] and r["to_step"] <= step for r in rollbacks), (fault, rollbacks)
    hack = [e for e in events if e["event"] == "detected" and e["detector"] == "reward_spike"]
    assert hack and hack[0]["domain"] == "math" and hack[0]["tasks"], events
    quarantined = {t for e in events if e["event"] == "quarantine" for t in e["tasks"]}
    assert quarantined

    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert [m["step"] for m in rows] == list(range(1, STEPS + 1))  # finished, every step once
    assert json.loads((run.path / "state.json").read_text())["done"] is True
    guard_rows = [m for m in run.read_metrics() if m.get("phase") == "guard"]
    assert sum(m["guard/events"] for m in guard_rows) == len([e for e in events if e["event"] == "detected"])

    # The ledger: every id trained at most once once rollbacks are applied, and exactly the kept
    # samples of the final steps; the voided rows are the rolled-back steps' (accounted for).
    store = existing_run_store(run)
    assert store is not None
    trained = store.trained()
    assert len(trained) == sum(m["trained_samples"] for m in rows)
    ledger = [row for _, table in store.files.read_all(LEDGER, True) for row in table.to_pylist()]
    voids = [row["step"] for row in ledger if row["event"] == "rollback"]
    assert sorted(set(voids)) == sorted({r["to_step"] for r in rollbacks if r["voided_trajectories"] > 0})
    raw_trained = [row for row in ledger if row["event"] == "trained"]
    assert len(raw_trained) - len(trained) == sum(r["voided_trajectories"] for r in rollbacks)
    # after the quarantine no quarantined task trains
    last_hack = max(e["step"] for e in hack)
    late = [r for r in store.records() if r["step"] >= last_hack and r["id"] in trained]
    assert not any(r["task_id"] in quarantined for r in late)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run.path / "tensorboard"))
    accumulator.Reload()
    assert "guard/events" in accumulator.Tags()["scalars"]
    kl = {e.step: e.value for e in accumulator.Scalars("kl")}
    # TensorBoard stores float32 scalars; metrics.jsonl keeps the float64 value
    assert kl[STEPS] == pytest.approx(next(m["kl"] for m in rows if m["step"] == STEPS), rel=1e-6)
