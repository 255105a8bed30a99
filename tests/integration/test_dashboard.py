"""`tidal dashboard` end to end: a real server process over a smoke training run (with a guard
rollback from an injected NaN loss), a real agent episode and a hostile completion in its store,
and two eval folders; pages driven in headless Chromium (tests/conftest.py), screenshots checked."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tidal.cli import app
from tidal.errors import SandboxUnavailableError
from tidal.storage.run import RunFolder
from tidal.storage.store import TrajectoryStore
from tidal.types import Completion, Episode, Outcome, Score

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "<script>window.__pwned=1</script>zebra-marker"
TRAIN = [
    "trainer.steps=4", "trainer.checkpoint_every=1", "warm_start.enabled=false", "gate.drop_zero_variance=false",
    "gate.drop_truncated=false", "gate.drop_empty=false", "gate.max_repetition=1.0", "eval.samples_per_task=1",
    "algorithm.entropy_coef=0.01", "algorithm.kl_coef=0.05", "guard.nonfinite.actions=[rollback]",
    "guard.max_rollbacks=8", "debug.inject.loss_nan.step=2", "run.progress=false",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tidal.agent.policy import make_policy
    from tidal.agent.runner import run_episode
    from tidal.pipeline.agent_rollout import episode_from_result
    from tidal.sandbox import get_backend
    from tidal.tasks import generate_tasks

    try:
        backend = get_backend("bwrap")
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")
    parent = tmp_path_factory.mktemp("dash")
    trained = runner.invoke(app, ["train", str(ROOT / "configs" / "smoke.yaml"), f"run.dir={parent}", "run.name=smoke", *TRAIN])
    assert trained.exit_code == 0, trained.output
    run = RunFolder.open(parent / "smoke")
    task = generate_tasks("agent", 1, "eval", seed=3, min_difficulty=1, max_difficulty=1)[0]
    agent = episode_from_result(run_episode(task, make_policy("oracle"), backend), "smoke/step-000090/g000/s00",
                                "smoke/step-000090/g000", 0)
    group = "smoke/step-000091/g000"
    hostile = Episode(f"{group}/s00", "math/x", "math", group, Completion([1], [2, 3], [-0.5, -0.5], HOSTILE, "stop", 0),
                      Score(0.25, Outcome.FAILED, {"exact": 0.0, "format": 1.0}, "wrong", {}))
    store = TrajectoryStore.open(str(run.trajectories_dir), run=run.name, writable=True)
    store.write_episodes(90, [agent], {task.id: task}, {"generate_s": 0.5})
    store.write_episodes(91, [hostile])

    tasks = parent / "math.jsonl"
    made = runner.invoke(app, ["tasks", "generate", "--family", "math", "--n", "3", "--split", "eval", "--out", str(tasks)])
    assert made.exit_code == 0, made.output
    evals = []
    for name in ("base", "cand"):
        result = runner.invoke(app, ["eval", "--model", "oracle", "--tasks", str(tasks), "--out", str(parent / name)])
        assert result.exit_code == 0, result.output
        evals.append(parent / name)
    return {"run": run.path, "agent": agent.id, "hostile": hostile.id, "evals": evals}


@pytest.fixture(scope="module")
def server(folders: dict[str, Any]) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    process = subprocess.Popen([sys.executable, "-m", "tidal.cli", "dashboard", str(folders["run"]),
                                *map(str, folders["evals"]), "--port", str(port)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None:
                    pytest.fail(f"dashboard exited: {process.stdout.read().decode() if process.stdout else ''}")
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def _colours(png: bytes) -> int:
    """How many distinct colours a screenshot holds (a blank region has one)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    return len(image.getcolors(maxcolors=1 << 24) or [])


def test_runs_list_and_run_page_with_guard_markers(server: str, open_page: Any, tmp_path: Path) -> None:
    page = open_page(server + "/")
    assert "smoke" in page.inner_text("body") and "base" in page.inner_text("body")
    page.click("text=smoke")
    page.wait_for_load_state("networkidle")
    text = page.inner_text("body")
    for part in ("Metrics per step", "Reward by domain", "Entropy", "KL", "Throughput", "Drops by reason",
                 "Audit and quarantine", "rollbacks", "nonfinite", "non-finite loss", "Held-out: after against before", "Flips"):
        assert part in text, part
    assert page.locator("svg.chart").count() >= 6
    assert page.locator("svg.chart").first.locator("line.guard-marker").count() >= 2  # injected, detected, rollback
    shot = page.locator("svg.chart").first.screenshot(path=str(tmp_path / "reward.png"))
    assert _colours(shot) > 5  # lines, points, markers drawn, not a blank box
    assert _colours(page.screenshot(path=str(tmp_path / "run.png"), full_page=True)) > 10
    assert page.tidal_errors == []


def test_live_run_refreshes_its_metrics(server: str, folders: dict[str, Any], open_page: Any) -> None:
    run = RunFolder.open(folders["run"])
    summary = run.summary_path
    hidden = summary.with_suffix(".hidden")
    summary.rename(hidden)  # without summary.json the run counts as live
    try:
        page = open_page(server + "/run/0")
        steps = len([r for r in run.read_metrics() if r.get("phase") == "rl"])
        assert f"live: {steps} RL steps" in page.inner_text("#run-state")
        row = {**[r for r in run.read_metrics() if r.get("phase") == "rl"][-1], "step": 99}
        run.append_metrics(row)
        for _ in range(150):  # live.js reloads every 3 s (polled from here: the page's CSP forbids eval)
            if f"{steps + 1} RL steps" in page.inner_text("#run-state"):
                break
            page.wait_for_timeout(100)
        assert f"live: {steps + 1} RL steps" in page.inner_text("#run-state")
        assert int(page.get_attribute("#live", "data-reloads")) >= 1
    finally:
        run.drop_metrics_after("rl", 4)
        hidden.rename(summary)


def test_search_replay_and_hostile_text(server: str, folders: dict[str, Any], open_page: Any, tmp_path: Path) -> None:
    page = open_page(server + "/run/0/trajectories")
    page.fill("input[name=q]", "zebra-marker")
    page.click("button[type=submit]")
    page.wait_for_load_state("networkidle")
    assert page.inner_text("#hits") == "1 found"
    assert page.locator("a.traj").all_inner_texts() == [folders["hostile"]]
    page.click("a.traj")
    page.wait_for_load_state("networkidle")
    assert HOSTILE in page.inner_text("pre.completion")  # shown as text
    assert page.evaluate("window.__pwned") is None  # and never run
    assert "format" in page.inner_text("body") and "exact" in page.inner_text("body")

    page.goto(server + "/run/0/trajectories?q=greeting.txt", wait_until="networkidle")  # text only in the turn log
    assert page.locator("a.traj").all_inner_texts() == [folders["agent"]]
    page.click("a.traj")
    page.wait_for_load_state("networkidle")
    text = page.inner_text("body")
    for part in ("Episode, turn by turn", "Turn 1", "Turn 2", "generation", "bash", "greeting.txt", "[exit code 0]",
                 "submit", "Reward by component", "tests", "agent_steps 2"):
        assert part in text, part
    assert _colours(page.screenshot(path=str(tmp_path / "replay.png"), full_page=True)) > 5
    assert page.tidal_errors == []


def test_eval_page_checklist_and_paired_comparison(server: str, open_page: Any) -> None:
    page = open_page(server + "/eval/2")
    text = page.inner_text("body")
    for part in ("Selection checklist", "Outcomes", "Paired comparison against base", "Flips", "no task flipped", "math"):
        assert part in text, part
    assert json.loads(urllib.request.urlopen(server + "/eval/2/results.jsonl").read().splitlines()[0])["model"] == "oracle"
