"""A killed `tidal eval` resumes where it stopped: finished (task, epoch) pairs are not redone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidal.errors import SandboxUnavailableError
from tidal.sandbox import get_backend
from tidal.tasks import generate_tasks, write_tasks


def _lines(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def test_killed_eval_resumes_without_redoing_finished_tasks(tmp_path: Path) -> None:
    try:
        get_backend("bwrap")
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")
    tasks = generate_tasks("agent", 5, "eval", seed=11, min_difficulty=1, max_difficulty=2)
    write_tasks(tasks, tmp_path / "tasks.jsonl")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "tidal.cli", "eval", "--model", "oracle", "--tasks", str(tmp_path / "tasks.jsonl"),
               "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(_lines(out / "results.jsonl")) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    before = _lines(out / "results.jsonl")
    assert 2 <= len(before) < 5, "the eval must be killed part-way"

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert rerun.returncode == 0, rerun.stderr
    after = _lines(out / "results.jsonl")
    assert after[: len(before)] == before  # finished records untouched
    pairs = [(r["task_id"], r["epoch"]) for r in after]
    assert len(pairs) == len(set(pairs)) == 5  # each pair once: nothing redone, nothing missing
    assert f"{5 - len(before)} run now, {len(before)} already done" in rerun.stdout
    assert json.loads((out / "summary.json").read_text())["pass_rate"] == 1.0
