"""Telemetry sinks: every metrics row (warm start, RL steps, held-out evaluations, guard events)
goes, besides metrics.jsonl (always), to the sinks `telemetry:` turns on: TensorBoard event files,
a Prometheus endpoint live while the run lives, Weights & Biases and MLflow (extra `telemetry`).

A row's numbers are its scalars; the tag is the key for an RL row (`reward/math`, `kl`) and
`<phase>/<key>` for the others (`warm_start/loss`), so the phases' keys do not collide. A sink that
fails, at open or on a row, is logged and switched off: telemetry never stops training.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from pathlib import Path
from typing import Any, Protocol

from tidal.config.guard import TelemetryConfig

logger = logging.getLogger(__name__)


class Sink(Protocol):
    name: str

    def write(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def scalars(row: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """(step, finite numeric values by tag) of a metrics row."""
    phase = str(row.get("phase", "rl"))
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in ("step", "phase") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value):
            continue
        tag = key if phase == "rl" or key.startswith(f"{phase}/") else f"{phase}/{key}"
        out[tag] = float(value)
    return int(row.get("step", 0) or 0), out


class TensorBoardSink:
    """Scalars in TensorBoard event files (torch's SummaryWriter) under `folder`."""

    name = "tensorboard"

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder))

    def write(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def prometheus_name(tag: str) -> str:
    return "tidal_" + re.sub(r"[^a-zA-Z0-9_]", "_", tag)


class PrometheusSink:
    """The latest value of every tag as a gauge (`tidal_<tag>`, `/` and other marks as `_`,
    labelled with the run), served over HTTP at `host:port` in a thread of its own."""

    name = "prometheus"

    def __init__(self, host: str, port: int, run_name: str) -> None:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.core import GaugeMetricFamily

        self.values: dict[str, float] = {}
        self.lock = threading.Lock()
        sink = self

        class Latest:
            def collect(self) -> Any:
                with sink.lock:
                    values = dict(sink.values)
                for tag, value in sorted(values.items()):
                    family = GaugeMetricFamily(prometheus_name(tag), f"tidal metric {tag}", labels=["run"])
                    family.add_metric([run_name], value)
                    yield family

        registry = CollectorRegistry()
        registry.register(Latest())
        self.server, self.thread = start_http_server(port, addr=host, registry=registry)
        self.port = int(self.server.server_port)

    def write(self, step: int, values: dict[str, float]) -> None:
        with self.lock:
            self.values.update(values)
            self.values["step"] = float(step)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class WandbSink:
    """A Weights & Biases run (`mode` online or offline: a local run folder under `folder`). W&B
    wants its step to grow, and a rollback redoes steps, so the RL step is logged as `rl_step`."""

    name = "wandb"

    def __init__(self, folder: Path, mode: str, project: str, run_name: str, config: dict[str, Any]) -> None:
        import wandb

        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=run_name, dir=str(folder), mode=mode, config=config, reinit=True)

    def write(self, step: int, values: dict[str, float]) -> None:
        self.run.log({**values, "rl_step": step})

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    """An MLflow run in `experiment` at tracking URI `uri` (e.g. `file:/path/mlruns`, a local store
    that needs no server; MLflow 3 keeps it only when MLFLOW_ALLOW_FILE_STORE is set, which a
    `file:` URI sets unless the environment already says otherwise)."""

    name = "mlflow"

    def __init__(self, uri: str, experiment: str, run_name: str) -> None:
        import os

        from mlflow.tracking import MlflowClient

        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id

    def write(self, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [Metric(re.sub(r"[^\w\-./ ]", "_", tag), value, stamp, step) for tag, value in values.items()]
        for start in range(0, len(metrics), 900):  # log_batch takes at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 900])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Sinks:
    """The sinks of a run, each behind a guard: one that fails is logged and dropped."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = list(sinks)
        self.failed: dict[str, str] = {}  # sink -> its error

    def __call__(self, row: dict[str, Any]) -> None:
        step, values = scalars(row)
        for sink in list(self.sinks):
            try:
                sink.write(step, values)
            except Exception as error:  # a sink's own failure: logged, never the run's
                self._drop(sink, error)

    def _drop(self, sink: Sink, error: Exception) -> None:
        logger.error("telemetry sink %s failed and is switched off: %s", sink.name, error)
        self.failed[sink.name] = repr(error)
        self.sinks.remove(sink)

    def close(self) -> None:
        for sink in list(self.sinks):
            try:
                sink.close()
            except Exception as error:
                self._drop(sink, error)


def open_sinks(cfg: TelemetryConfig, folder: Path, run_name: str, config: dict[str, Any]) -> Sinks:
    """The sinks `cfg` asks for, for the run folder `folder`; one that cannot open (a missing
    package, a port in use) is logged and left out."""
    wanted: list[tuple[str, Any]] = []
    if cfg.tensorboard:
        wanted.append(("tensorboard", lambda: TensorBoardSink(folder / "tensorboard")))
    if cfg.prometheus_port is not None:
        wanted.append(("prometheus", lambda: PrometheusSink(cfg.prometheus_host, cfg.prometheus_port, run_name)))
    if cfg.wandb != "off":
        wanted.append(("wandb", lambda: WandbSink(folder / "wandb", cfg.wandb, cfg.wandb_project, run_name, config)))
    if cfg.mlflow_uri is not None:
        wanted.append(("mlflow", lambda: MlflowSink(cfg.mlflow_uri, cfg.mlflow_experiment, run_name)))
    opened, failed = [], {}
    for name, make in wanted:
        try:
            opened.append(make())
        except Exception as error:  # ImportError (the extra is not installed), OSError (the port), ...
            logger.error("telemetry sink %s could not open and is off: %s", name, error)
            failed[name] = repr(error)
    sinks = Sinks(opened)
    sinks.failed.update(failed)
    return sinks
