"""Config of the stability guard (`guard:`), its fault injection (`debug.inject`) and the
telemetry sinks (`telemetry:`). docs/design/guard.md says what each detector reads and does."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Action = Literal["alert", "pause", "rollback", "lower_lr", "tighten_staleness", "quarantine"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DetectorConfig(_Section):
    """One detector: a metric against a baseline of its last `window` unflagged values (their median
    and MAD; for a domain's reward, their pooled mean and the binomial noise of the tasks behind
    it), firing when the value has moved by more than `min_delta`, more than `z` standard
    deviations (robust: 1.4826 * MAD; or binomial) and, when `ratio` is set, past `ratio` times the
    baseline. A run of `settle` flagged values becomes the new baseline: a sustained shift alerts
    once. Fixed bounds where they make sense: `nonfinite` has no baseline."""

    enabled: bool = Field(True, description="run this detector")
    actions: list[Action] = Field(
        default_factory=lambda: ["alert"],
        description="what an event does besides its log line, metric and guard.jsonl row: alert (the webhook, when "
        "set) | pause (stop cleanly, resumable) | rollback (to the last checkpoint before the blamed step) | lower_lr "
        "(times guard.lr_factor, then go on) | tighten_staleness (max_staleness - 1) | quarantine (the tasks behind it)",
    )
    window: int = Field(8, ge=2, le=10_000, description="values in the rolling baseline")
    warmup: int = Field(3, ge=1, le=10_000, description="values the baseline needs before the detector may fire")
    z: float = Field(6.0, gt=0, le=1000, description="least move, in standard deviations of the baseline (robust: 1.4826 * MAD; rewards: binomial)")
    min_delta: float = Field(0.0, ge=0, description="least absolute move from the median")
    ratio: float | None = Field(
        None, gt=0, description="rise: fire only above ratio * median; fall: only below ratio * median; null = no ratio"
    )
    settle: int = Field(
        3, ge=1, le=10_000, description="flagged values in a row after which the baseline re-settles on them (a "
        "sustained shift is a new level: it alerts once, at its first value, not on every later step)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> DetectorConfig:
        if self.warmup > self.window:
            raise ValueError(f"warmup={self.warmup} is above window={self.window}: the baseline never holds that many")
        if "pause" in self.actions and "rollback" in self.actions:
            raise ValueError("actions: pause and rollback exclude each other (a paused run resumes from its latest checkpoint)")
        if len(set(self.actions)) != len(self.actions):
            raise ValueError(f"actions: an action appears twice in {self.actions}")
        return self


def _detector(**defaults: object) -> object:
    return Field(default_factory=lambda: DetectorConfig(**defaults))  # type: ignore[arg-type]


class GuardConfig(_Section):
    """The stability guard (guard/): detectors over each RL step's metrics row and the held-out
    evaluations, and what each one's events do. On by default: a non-finite loss or gradient and a
    gradient spike roll back to the last good checkpoint, every other detector alerts."""

    enabled: bool = Field(True, description="run the detectors after every RL step")
    webhook_url: str | None = Field(None, description="alert: POST each event as JSON here (null = no webhook)")
    webhook_timeout_s: float = Field(2.0, gt=0, le=60, description="alert: a webhook POST, at most (it runs off the loop)")
    keep_checkpoints: int = Field(
        4, ge=2, le=1000, description="with a rollback action: RL checkpoints kept (at least trainer.keep_checkpoints), "
        "so that one from before the blamed step is still there"
    )
    max_rollbacks: int = Field(5, ge=1, le=1000, description="rollbacks in one run, at most; the next one pauses instead")
    lr_factor: float = Field(0.5, gt=0, lt=1, description="lower_lr: the learning rate is multiplied by this")
    # Defaults tuned so that healthy reference runs (tests/unit/guard/fixtures) replay with no
    # finding, and the injected faults of the README's demo are still caught (docs/design/guard.md).
    nonfinite: DetectorConfig = _detector(warmup=1, actions=["rollback"])  # type: ignore[assignment]
    reward_collapse: DetectorConfig = _detector(z=4.5, min_delta=0.3, warmup=4)  # type: ignore[assignment]
    reward_spike: DetectorConfig = _detector(z=4.5, min_delta=0.5, warmup=4)  # type: ignore[assignment]
    entropy_collapse: DetectorConfig = _detector(z=6.0, ratio=0.5, window=16, warmup=5)  # type: ignore[assignment]
    entropy_explosion: DetectorConfig = _detector(z=6.0, ratio=2.0, window=16, warmup=5)  # type: ignore[assignment]
    kl_drift: DetectorConfig = _detector(z=6.0, min_delta=0.1)  # type: ignore[assignment]
    mismatch_kl: DetectorConfig = _detector(z=6.0, min_delta=0.05)  # type: ignore[assignment]
    grad_spike: DetectorConfig = _detector(z=6.0, ratio=5.0, window=16, warmup=5, actions=["rollback"])  # type: ignore[assignment]
    heldout_regression: DetectorConfig = _detector(min_delta=0.1, warmup=1)  # type: ignore[assignment]
    tamper_rate: DetectorConfig = _detector(z=4.0, min_delta=0.1)  # type: ignore[assignment]
    length_blowup: DetectorConfig = _detector(z=6.0, ratio=2.0)  # type: ignore[assignment]
    throughput_drop: DetectorConfig = _detector(z=6.0, ratio=0.1, window=16, warmup=8)  # type: ignore[assignment]
    infra_errors: DetectorConfig = _detector(z=4.0, min_delta=0.2)  # type: ignore[assignment]

    def detectors(self) -> dict[str, DetectorConfig]:
        """Detector name -> its config, the enabled ones."""
        return {name: value for name, value in self if isinstance(value, DetectorConfig) and value.enabled}

    def rolls_back(self) -> bool:
        return self.enabled and any("rollback" in d.actions for d in self.detectors().values())


class LrSpike(_Section):
    step: int = Field(ge=1, description="the update (0-based step) whose learning rate is multiplied")
    factor: float = Field(1000.0, gt=1, description="the multiplier")


class RewardHack(_Section):
    step: int = Field(ge=0, description="from this step on, the poisoned tasks' verifier passes any answer (reward 1)")
    domain: str = Field(min_length=1, description="the domain whose tasks are poisoned")
    tasks: int = Field(2, ge=1, le=10_000, description="poisoned tasks: the first this many train tasks of the domain by id")


class LossNan(_Section):
    step: int = Field(ge=0, description="the update whose loss is NaN")


class SandboxFailure(_Section):
    step: int = Field(ge=0, description="the first step whose every score is an infra error")
    steps: int = Field(1, ge=1, le=10_000, description="steps it lasts")


class InjectConfig(_Section):
    """Faults injected on purpose (guard/inject.py), for tests and the demo. Each fires once per
    run (a rolled-back step redone does not see it again), except the reward hack, which stays
    until its tasks are quarantined. Sync mode, one trainer process."""

    lr_spike: LrSpike | None = Field(None, description="a learning-rate spike at one step")
    reward_hack: RewardHack | None = Field(None, description="a verifier that a family of tasks games")
    loss_nan: LossNan | None = Field(None, description="a NaN loss at one step")
    sandbox_failure: SandboxFailure | None = Field(None, description="a sandbox that fails every answer for a while")

    def any(self) -> bool:
        return any(value is not None for _, value in self)


class DebugConfig(_Section):
    inject: InjectConfig = Field(default_factory=InjectConfig, description="fault injection")


class TelemetryConfig(_Section):
    """Where each metrics row goes besides metrics.jsonl (always): telemetry/sinks.py. A sink that
    fails is logged and switched off; the run goes on."""

    tensorboard: bool = Field(False, description="TensorBoard event files in <run folder>/tensorboard")
    prometheus_port: int | None = Field(
        None, ge=0, le=65535, description="serve the latest row's numbers as Prometheus gauges on this port while the "
        "run lives (0 = any free port, written to <run folder>/prometheus.json); null = off"
    )
    prometheus_host: str = Field("127.0.0.1", description="the Prometheus endpoint's address")
    wandb: Literal["off", "online", "offline"] = Field(
        "off", description="Weights & Biases (extra `telemetry`): offline writes a local run folder under the run"
    )
    wandb_project: str = Field("tidal", min_length=1, description="the W&B project")
    mlflow_uri: str | None = Field(
        None, description="MLflow tracking URI (extra `telemetry`), e.g. file:/path/mlruns; null = off"
    )
    mlflow_experiment: str = Field("tidal", min_length=1, description="the MLflow experiment")
