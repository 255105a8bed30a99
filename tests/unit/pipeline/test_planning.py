"""`tidal plan` and the check `tidal train` / `tidal quickstart` run before launching anything: a
config that cannot fit is refused with its numbers before a run folder or the model exists, and
trainer.plan_check false skips the check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tidal.cli import app
from tidal.errors import PlanError
from tidal.pipeline import planning, quickstart, run

runner = CliRunner()
SMOKE = "configs/smoke.yaml"
# 24 layers of width 4096: about 5.9B parameters, whose AdamW state alone no test machine holds.
HUGE = ["model.tiny.hidden_size=4096", "model.tiny.num_layers=24", "model.tiny.intermediate_size=16384",
        "model.tiny.num_heads=32", "model.tiny.num_kv_heads=8"]


def _no_model(*args: object, **kwargs: object) -> None:
    raise AssertionError("the model was loaded before the plan check")


def test_plan_prints_the_table_and_its_json_agrees() -> None:
    result = runner.invoke(app, ["plan", SMOKE, "trainer.micro_batch_size=8", "--gflops", "50"])
    assert result.exit_code == 0, result.output
    for text in ("weights (fp32)", "optimizer state (AdamW, fp32)", "activations", "KV pool (loop engine)", "KV pool of every engine",
                 "peak of rank 0", "fits: yes", "assumptions:", "at 50.0 GFLOP/s (given)"):
        assert text in result.output, text
    result = runner.invoke(app, ["plan", SMOKE, "trainer.micro_batch_size=8", "--json", "--gflops", "50"])
    record = json.loads(result.output)
    assert record["fits"] and record["micro_batch_size"] == 8
    update = sum(p["rank0_bytes"] for p in record["parts"] if "update" in p["phases"])
    assert record["rank0_peak_bytes"] >= update and record["throughput"]["matmul_gflops"] == 50.0


def test_plan_of_a_run_that_cannot_fit_exits_1_with_the_numbers() -> None:
    result = runner.invoke(app, ["plan", SMOKE, *HUGE, "--gflops", "50"])
    assert result.exit_code == 1, result.output
    assert "DOES NOT FIT" in result.output and "fits: no" in result.output


def test_plan_downloads_no_registry_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDAL_MODEL_CACHE", str(tmp_path / "empty-cache"))
    result = runner.invoke(app, ["plan", SMOKE, "model.path=pypi:smollm2", "--gflops", "50"])
    assert result.exit_code == 2
    assert "not in the model cache" in result.output and "tidal model fetch smollm2" in result.output
    assert not (tmp_path / "empty-cache").exists()


def test_train_refuses_before_the_run_folder_or_the_model_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "load_model", _no_model)
    runs = tmp_path / "runs"
    with pytest.raises(PlanError) as refused:
        run.run_training(Path(SMOKE), [*HUGE, f"run.dir={runs}"])
    message = str(refused.value)
    assert "GiB predicted" in message and "GiB available" in message and "optimizer state" in message
    assert "trainer.plan_check=false" in message
    assert refused.value.record["fits"] is False
    assert not runs.exists()
    result = runner.invoke(app, ["train", SMOKE, *HUGE, f"run.dir={runs}"])
    assert result.exit_code == 2 and "does not fit" in result.output and not runs.exists()


def test_a_small_machine_refuses_the_smoke_run_and_plan_check_false_skips(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planning, "available_memory", lambda device: 0)
    monkeypatch.setattr(planning, "_own_resident_set", lambda: 64 << 20)  # 64 MiB: below the runtime alone
    monkeypatch.setattr(run, "load_model", _no_model)
    with pytest.raises(PlanError, match="does not fit"):
        quickstart.run_quickstart(Path(SMOKE), [], tmp_path / "out", "refused")
    assert not (tmp_path / "out").exists()
    started: list[str] = []
    monkeypatch.setattr(run.Job, "execute", lambda job: started.append(job.run.name) or job.run.path)
    run.run_training(Path(SMOKE), ["trainer.plan_check=false", f"run.dir={tmp_path / 'runs'}", "run.name=skipped"])
    assert started == ["skipped"]


def test_the_run_builds_its_engines_with_the_plans_pool_and_refuses_one_too_small(tmp_path: Path) -> None:
    from tidal.config import load_config
    from tidal.pipeline.run import build_tasks
    from tidal.rollout.scheduler import KVPoolTooSmall

    cfg = load_config(SMOKE, [f"run.dir={tmp_path}"])
    sized = planning.check_plan(cfg, build_tasks(cfg))
    plan = planning.plan_config(cfg, build_tasks(cfg), throughput=False)
    assert cfg.rollout.kv_blocks is None and sized.rollout.kv_blocks == plan.kv_blocks >= plan.sequence_blocks
    small = load_config(SMOKE, [f"run.dir={tmp_path}", "rollout.kv_blocks=1"])
    with pytest.raises(KVPoolTooSmall, match="rollout.kv_blocks=1.*needs"):
        planning.check_plan(small, build_tasks(small))
    result = runner.invoke(app, ["train", SMOKE, "rollout.kv_blocks=1", f"run.dir={tmp_path / 'runs'}"])
    assert result.exit_code == 2 and "raise rollout.kv_blocks" in result.output
    assert not (tmp_path / "runs").exists()
