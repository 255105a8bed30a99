"""The telemetry sinks on a live run: Prometheus scraped over HTTP while it trains, W&B offline and
MLflow file stores read back, TensorBoard through its own EventAccumulator; a sink that fails is
switched off and the run finishes."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tidal.config import load_config
from tidal.pipeline.loop import Rollback, StepContext
from tidal.pipeline.quickstart import find_config
from tidal.pipeline.run import Job, start_run
from tidal.telemetry.sinks import Sinks, TensorBoardSink, prometheus_name, scalars


class Scrape:
    """Scrapes the run's Prometheus endpoint after step 2 (the run is live)."""

    def __init__(self) -> None:
        self.text = ""

    def after_step(self, context: StepContext) -> Rollback | None:
        if context.step == 2:
            where = json.loads((context.parts.run.path / "prometheus.json").read_text())
            with urllib.request.urlopen(f"http://{where['host']}:{where['port']}/metrics", timeout=10) as response:
                self.text = response.read().decode()
            self.row = context.metrics
        return None


def test_scalars_tag_rl_keys_as_they_are_and_other_phases_under_their_name() -> None:
    step, values = scalars({"phase": "warm_start", "step": 3, "loss": 1.5, "ok": True, "name": "x", "nan": float("nan")})
    assert step == 3 and values == {"warm_start/loss": 1.5}
    assert scalars({"phase": "rl", "step": 1, "reward/math": 0.5})[1] == {"reward/math": 0.5}
    assert prometheus_name("reward/math") == "tidal_reward_math"


def test_a_live_run_feeds_prometheus_wandb_mlflow_and_a_failing_sink_does_not_stop_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("WANDB_SILENT", "true")

    def broken(self: TensorBoardSink, step: int, values: dict[str, float]) -> None:
        raise OSError("disk full (test)")

    monkeypatch.setattr(TensorBoardSink, "write", broken)
    opened: list[Sinks] = []
    original = Sinks.__init__

    def keep(self: Sinks, sinks: list) -> None:
        original(self, sinks)
        opened.append(self)

    monkeypatch.setattr(Sinks, "__init__", keep)
    mlruns = tmp_path / "mlruns"
    cfg = load_config(find_config("smoke"), ["trainer.steps=3", "eval.samples_per_task=1", "telemetry.tensorboard=true",
                                             "telemetry.prometheus_port=0", "telemetry.wandb=offline",
                                             f"telemetry.mlflow_uri=file:{mlruns}"])
    scrape = Scrape()
    job = Job(cfg, start_run(cfg, tmp_path, "sinks"), [scrape])
    job.execute()
    assert json.loads((job.run.path / "state.json").read_text())["done"] is True

    [sinks] = opened
    assert "disk full" in sinks.failed["tensorboard"] and {s.name for s in sinks.sinks} == {"prometheus", "wandb", "mlflow"}
    lines = [line for line in scrape.text.splitlines() if line.startswith("tidal_completion_tokens{")]
    assert lines == [f'tidal_completion_tokens{{run="sinks"}} {float(scrape.row["completion_tokens"])}']
    assert 'tidal_step{run="sinks"} 2.0' in scrape.text
    with pytest.raises(OSError):  # closed with the run
        urllib.request.urlopen(f"http://127.0.0.1:{json.loads((job.run.path / 'prometheus.json').read_text())['port']}/metrics",
                               timeout=2)

    offline = list((job.run.path / "wandb" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("*.wandb"))

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{mlruns}")
    [run] = client.search_runs([client.get_experiment_by_name("tidal").experiment_id])
    history = client.get_metric_history(run.info.run_id, "completion_tokens")
    rows = [m for m in job.run.read_metrics() if m.get("phase") == "rl"]
    assert [(h.step, h.value) for h in history] == [(m["step"], float(m["completion_tokens"])) for m in rows]
