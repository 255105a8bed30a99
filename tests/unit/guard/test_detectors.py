"""The detectors against a robust baseline, the guard's verdicts and the config's checks."""

from __future__ import annotations

import http.server
import math
import threading
import time

import pytest

from tidal.config import load_config
from tidal.config.guard import DetectorConfig, GuardConfig
from tidal.errors import ConfigError
from tidal.guard import Guard, TaskStat, robust_baseline
from tidal.guard.detectors import moved
from tidal.pipeline.quickstart import find_config


def _rows(guard: Guard, rows: list[dict], tasks: list[TaskStat] | None = None) -> list:
    return [guard.observe(step, row, tasks or []) for step, row in enumerate(rows, start=1)]


def test_the_baseline_is_the_median_and_scaled_mad_so_one_outlier_does_not_move_it() -> None:
    median, sigma = robust_baseline([1.0, 1.1, 0.9, 1.0, 50.0])
    assert median == 1.0 and sigma == pytest.approx(1.4826 * 0.1)


def test_a_rise_must_pass_min_delta_z_and_ratio_and_waits_for_the_warmup() -> None:
    cfg = DetectorConfig(z=3.0, min_delta=0.5, ratio=2.0, warmup=3, window=4)
    assert moved(10.0, [1.0, 1.0], cfg, "rise") is None  # warm-up
    assert moved(1.4, [1.0, 1.0, 1.0], cfg, "rise") is None  # under min_delta
    assert moved(1.9, [1.0, 1.0, 1.0], cfg, "rise") is None  # past min_delta, under ratio 2
    assert moved(2.5, [1.0, 1.0, 1.0], cfg, "rise") == 1.0
    assert moved(2.5, [1.0, 2.0, 3.0, 1.0, 2.4], cfg, "rise") is None  # noisy window: under z sigmas
    assert moved(0.1, [1.0, 1.0, 1.0], DetectorConfig(ratio=0.5, warmup=3), "fall") == 1.0


def test_each_detector_fires_on_its_own_signal_with_a_reason_and_the_blamed_step() -> None:
    guard = Guard(GuardConfig())
    calm = {"reward/math": 0.2, "reward/code": 0.1, "entropy": 2.0, "kl": 0.01, "approx_kl": 0.001, "grad_norm": 1.0,
            "rate/tampered": 0.0, "mean_completion_length": 30.0, "tokens_per_s": 100.0, "rate/infra_error": 0.0,
            "loss": 0.1, "skipped": 0.0}
    for index, row in enumerate([calm] * 8, start=1):
        assert not guard.observe(index, dict(row), []).findings
    bad = {"reward/math": 0.95, "reward/code": 0.1, "entropy": 0.5, "kl": 0.5, "approx_kl": 0.2, "grad_norm": 40.0,
           "rate/tampered": 0.5, "mean_completion_length": 90.0, "tokens_per_s": 5.0, "rate/infra_error": 0.6,
           "loss": math.nan, "skipped": 1.0}
    verdict = guard.observe(9, bad, [])
    fired = {f.detector: f for f in verdict.findings}
    assert set(fired) == {"nonfinite", "reward_spike", "entropy_collapse", "kl_drift", "mismatch_kl", "grad_spike",
                          "tamper_rate", "length_blowup", "throughput_drop", "infra_errors"}
    assert fired["reward_spike"].domain == "math" and fired["reward_spike"].blamed_step == 9  # a data signal
    assert fired["grad_spike"].blamed_step == 8 and fired["grad_spike"].baseline == 1.0  # the weights before
    assert "grad_norm rose to 40" in fired["grad_spike"].reason
    # the defaults: nonfinite and grad_spike roll back (to before the update that row 9 blames), the rest alert
    assert verdict.actions == {"alert", "rollback"} and verdict.rollback_before == 8


def test_reward_collapse_per_domain_and_entropy_explosion() -> None:
    guard = Guard(GuardConfig())
    for step in range(1, 6):
        guard.observe(step, {"reward/math": 0.8 + 0.01 * step, "reward/code": 0.5, "entropy": 1.0}, [])
    verdict = guard.observe(6, {"reward/math": 0.1, "reward/code": 0.5, "entropy": 3.0}, [])
    assert {(f.detector, f.key) for f in verdict.findings} == {("reward_collapse", "reward/math"),
                                                               ("entropy_explosion", "entropy")}


def test_a_flagged_value_stays_out_of_the_baseline_and_a_rollback_forgets_the_steps_after_it() -> None:
    guard = Guard(GuardConfig(grad_spike=DetectorConfig(ratio=5.0, warmup=3)))
    _rows(guard, [{"grad_norm": 1.0}] * 4)
    assert guard.observe(5, {"grad_norm": 50.0}, []).findings
    assert not guard.observe(6, {"grad_norm": 50.0}, []).findings  # the same excursion: reported once
    assert not guard.observe(7, {"grad_norm": 1.0}, []).findings
    assert guard.observe(8, {"grad_norm": 50.0}, []).findings  # still against the calm baseline
    guard.forget_after(2)
    assert not guard.observe(3, {"grad_norm": 50.0}, []).findings  # two values left: back in warm-up


def test_heldout_regression_blames_the_updates_since_the_best_evaluation() -> None:
    guard = Guard(GuardConfig(heldout_regression=DetectorConfig(min_delta=0.1, warmup=1, actions=["rollback"])),
                  heldout_before={"math": 0.4})
    assert not guard.observe_heldout(4, {"math": 0.5}).findings
    verdict = guard.observe_heldout(8, {"math": 0.3})
    [finding] = verdict.findings
    assert finding.blamed_step == 5 and finding.baseline == 0.5 and "from its best 0.500 (at step 4)" in finding.reason
    assert verdict.rollback_before == 5


def test_quarantine_picks_the_tasks_behind_a_spike_and_rollbacks_turn_into_a_pause_past_the_limit() -> None:
    cfg = GuardConfig(max_rollbacks=1, reward_spike=DetectorConfig(warmup=2, min_delta=0.3,
                                                                   actions=["rollback", "quarantine"]))
    guard = Guard(cfg)
    _rows(guard, [{"reward/math": 0.0}] * 3)
    tasks = [TaskStat("math/1", "math", 1.0, 0), TaskStat("math/2", "math", 0.0, 0), TaskStat("code/1", "code", 1.0, 0)]
    verdict = guard.observe(4, {"reward/math": 0.5}, tasks)
    assert verdict.quarantine == ["math/1"] and verdict.rollback_before == 4 and guard.quarantined == ["math/1"]
    assert not guard.observe(5, {"reward/math": 0.0}, tasks).findings
    again = guard.observe(6, {"reward/math": 0.5}, tasks)
    assert "pause" in again.actions and again.rollback_before is None  # guard.max_rollbacks=1 was used up


def test_guard_config_errors_are_typed_and_reported_together() -> None:
    with pytest.raises(ConfigError) as error:
        load_config(find_config("smoke"), ["guard.grad_spike.actions=[rollback,pause]", "guard.kl_drift.warmup=30",
                                           "guard.entropy_collapse.actions=[explode]", "guard.lr_factor=2"])
    text = str(error.value)
    assert "4 problem(s)" in text and "pause and rollback exclude each other" in text
    assert "warmup=30 is above window=8" in text and "guard.lr_factor: must be < 1" in text
    assert "guard.entropy_collapse.actions.0" in text
    with pytest.raises(ConfigError, match="reward_hack.domain 'nope' is not in tasks.domains"):
        load_config(find_config("smoke"), ["debug.inject.reward_hack.step=1", "debug.inject.reward_hack.domain=nope"])
    with pytest.raises(ConfigError, match="debug.inject runs with pipeline.mode=sync"):
        load_config(find_config("smoke"), ["debug.inject.loss_nan.step=1", "pipeline.mode=async"])


def test_the_webhook_posts_each_alert_off_the_loop_and_a_slow_endpoint_does_not_hold_it() -> None:
    received: list[bytes] = []
    release = threading.Event()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            release.wait(5)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/hook"
    guard = Guard(GuardConfig(webhook_url=url, webhook_timeout_s=5, grad_spike=DetectorConfig(warmup=2, ratio=5.0)))
    _rows(guard, [{"grad_norm": 1.0}] * 2)
    verdict = guard.observe(3, {"grad_norm": 30.0}, [])
    [event] = guard.events(verdict)  # returns while the endpoint still holds the request
    assert event["detector"] == "grad_spike" and event["actions"] == ["alert"]
    for _ in range(100):
        if received:
            break
        time.sleep(0.05)
    assert received and b'"grad_spike"' in received[0]
    release.set()
    guard.close()
    server.shutdown()
