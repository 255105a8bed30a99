import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest

from tidal.errors import CheckpointError
from tidal.storage import RunFolder, TrajectoryWriter
from tidal.types import Completion, Episode, Outcome, Score


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*.tmp")]


# -- run folders ---------------------------------------------------------------------------------


def test_create_makes_layout_and_open_finds_it(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path / "runs")
    assert re.fullmatch(r"\d{8}-\d{6}", run.name)
    for folder in (run.trajectories_dir, run.checkpoints_dir, run.eval_dir):
        assert folder.is_dir()
    assert run.config_path == run.path / "config.yaml"
    assert run.metrics_path.name == "metrics.jsonl"
    assert run.summary_path.name == "summary.json"
    assert run.report_path.name == "report.html"
    opened = RunFolder.open(run.path)
    assert opened.path == run.path


def test_default_names_never_collide(tmp_path: Path) -> None:
    names = {RunFolder.create(tmp_path).name for _ in range(3)}
    assert len(names) == 3


def test_named_run_exists_raises_unless_exist_ok(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path, "exp1")
    assert run.path == tmp_path / "exp1"
    with pytest.raises(CheckpointError, match="already exists"):
        RunFolder.create(tmp_path, "exp1")
    assert RunFolder.create(tmp_path, "exp1", exist_ok=True).path == run.path


def test_create_refuses_foreign_folders_and_bad_names(tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not a tidal run folder"):
        RunFolder.create(tmp_path, "busy")
    with pytest.raises(CheckpointError, match="plain folder name"):
        RunFolder.create(tmp_path, "a/b")
    (tmp_path / "empty").mkdir()
    assert RunFolder.create(tmp_path, "empty").name == "empty"


def test_open_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such run folder"):
        RunFolder.open(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(CheckpointError, match="not a tidal run folder"):
        RunFolder.open(tmp_path / "plain")
    run = RunFolder.create(tmp_path, "damaged")
    (run.path / "run.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="damaged run marker"):
        RunFolder.open(run.path)
    (run.path / "run.json").write_text('{"format": 99}')
    with pytest.raises(CheckpointError, match="format 99"):
        RunFolder.open(run.path)


# -- metrics -------------------------------------------------------------------------------------


def test_metrics_append_and_read(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path, "m")
    assert run.read_metrics() == []
    run.append_metrics({"step": 1, "loss": np.float32(0.5), "reward/code": 0.25, "note": "a\nb"})
    run.append_metrics({"step": 2, "loss": float("nan")})
    rows = run.read_metrics()
    assert rows[0] == {"step": 1, "loss": 0.5, "reward/code": 0.25, "note": "a\nb"}
    assert rows[1]["step"] == 2 and math.isnan(rows[1]["loss"])
    assert len(run.metrics_path.read_text().splitlines()) == 2


def test_torn_last_line_is_skipped_then_cut_before_next_append(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = RunFolder.create(tmp_path, "torn")
    run.append_metrics({"step": 1})
    run.append_metrics({"step": 2})
    with run.metrics_path.open("ab") as handle:  # a crash in the middle of writing row 3
        handle.write(b'{"step": 3, "lo')
    with caplog.at_level(logging.WARNING, logger="tidal.storage.run"):
        assert run.read_metrics() == [{"step": 1}, {"step": 2}]
    assert "torn last line" in caplog.text
    run.append_metrics({"step": 3})
    assert run.read_metrics() == [{"step": 1}, {"step": 2}, {"step": 3}]
    assert run.metrics_path.read_text().count("\n") == 3


def test_complete_row_without_newline_is_kept(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path, "nl")
    run.metrics_path.write_text('{"step": 1}\n{"step": 2}')
    run.append_metrics({"step": 3})
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3]


def test_a_resume_drops_the_rows_of_the_steps_it_redoes(tmp_path: Path) -> None:
    """Killed after step 5's row, resumed from the checkpoint of step 3: the rows of steps 4 and 5
    (RL, and the held-out eval at 4) go before they are redone; every other row stays as it was."""
    run = RunFolder.create(tmp_path, "resumed")
    run.append_metrics({"phase": "warm_start", "step": 25, "loss": 1.0})
    for step in range(1, 6):
        run.append_metrics({"phase": "rl", "step": step, "loss": float("nan") if step == 2 else 0.1 * step})
        if step % 2 == 0:
            run.append_metrics({"phase": "eval", "step": step, "eval/math": 0.5})
    with run.metrics_path.open("ab") as handle:  # and the crash tore step 6's row
        handle.write(b'{"phase": "rl", "step": 6, "lo')
    before = run.metrics_path.read_text().splitlines()

    assert run.drop_metrics_after("rl", 3) == 2
    assert run.drop_metrics_after("eval", 3) == 1
    assert run.drop_metrics_after("rl", 3) == 0  # nothing left to drop: the file is not rewritten
    after = run.metrics_path.read_text().splitlines()
    assert after == [line for line in before[:-1] if not re.search(r'"step":[45][,}]', line)]  # byte for byte
    assert [(r["phase"], r["step"]) for r in run.read_metrics()] == [
        ("warm_start", 25), ("rl", 1), ("rl", 2), ("eval", 2), ("rl", 3)]
    assert leftovers(run.path) == []

    for step in (4, 5):  # the redone steps: each row once
        run.append_metrics({"phase": "rl", "step": step, "loss": 0.0})
    assert [r["step"] for r in run.read_metrics() if r["phase"] == "rl"] == [1, 2, 3, 4, 5]
    assert RunFolder.create(tmp_path, "fresh").drop_metrics_after("rl", 0) == 0  # no metrics yet


def test_the_alarms_of_redone_evaluations_go_too(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path, "alarms")
    for step in (2, 4, 6):
        run.append_jsonl("alarms.jsonl", {"step": step, "domain": "math", "drop": 0.2})
    assert run.drop_rows_after("alarms.jsonl", 3) == 2
    assert [json.loads(line)["step"] for line in (run.path / "alarms.jsonl").read_text().splitlines()] == [2]
    assert run.drop_rows_after("domain_weights.jsonl", 3) == 0  # no such file yet
    with pytest.raises(ValueError, match="inside the run folder"):
        run.drop_rows_after("../elsewhere.jsonl", 3)


def test_damage_before_the_last_line_raises(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path, "bad")
    run.metrics_path.write_text('{"step": 1}\ngarbage\n{"step": 3}\n')
    with pytest.raises(CheckpointError, match=r"metrics.jsonl:2"):
        run.read_metrics()


# -- JSON documents ------------------------------------------------------------------------------


def test_write_json_is_atomic(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path, "j")
    path = run.write_json("summary.json", {"overall": {"before": 0.25}, "arr": np.arange(3)})
    assert path == run.summary_path
    assert run.read_json("summary.json") == {"overall": {"before": 0.25}, "arr": [0, 1, 2]}
    with pytest.raises(TypeError):
        run.write_json("summary.json", {"bad": object()})
    assert json.loads(run.summary_path.read_text())["overall"] == {"before": 0.25}
    assert leftovers(run.path) == []
    with pytest.raises(ValueError, match="inside the run folder"):
        run.write_json("../escape.json", {})
    with pytest.raises(CheckpointError, match="not written yet"):
        run.read_json("nothing.json")


# -- trajectories --------------------------------------------------------------------------------


def episode(index: int) -> Episode:
    completion = Completion([1, 2], [3, 4, 5], [-0.1, -0.2, float("-inf")], "x = 1", "stop", 7)
    return Episode(
        id=f"run/3/code-1/{index}",
        task_id="code-1",
        domain="code",
        group_id="3/code-1",
        completion=completion,
        score=Score(1.0, Outcome.PASSED, detail="ok"),
        advantage=0.5,
    )


def test_write_step_rewrite_is_idempotent(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path, "t")
    writer = TrajectoryWriter(run)
    first = [{"id": "a", "v": 1}, {"id": "b", "v": 2}]
    path = writer.write_step(123, first)
    assert path.name == "step-000123.jsonl"
    writer.write_step(123, [{"id": "a", "v": 10}])  # a resumed run writes the step again
    assert writer.steps() == [123]
    assert list(writer.read_all()) == [{"id": "a", "v": 10}]
    assert [p.name for p in run.trajectories_dir.iterdir()] == ["step-000123.jsonl"]


def test_failed_write_keeps_the_old_step(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path, "f")
    writer = TrajectoryWriter(run)
    writer.write_step(1, [{"id": "a"}])
    with pytest.raises(TypeError):
        writer.write_step(1, [{"id": "b"}, {"id": "c", "bad": object()}])
    assert writer.read_step(1) == [{"id": "a"}]
    assert leftovers(run.path) == []
    with pytest.raises(ValueError):
        writer.write_step(-1, [])


def test_read_all_is_in_numeric_step_order_and_find(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path, "r")
    writer = TrajectoryWriter(run)
    writer.write_step(1_000_000, [{"id": "late"}])
    writer.write_step(10, [{"id": "a/10"}, {"id": "mid", "text": 'mentions "a/1" in text'}])
    writer.write_step(2, [{"id": "a/1"}])
    (run.trajectories_dir / ".step-000002.jsonl.x.tmp").write_text("leftover of a crash")
    assert writer.steps() == [2, 10, 1_000_000]
    assert [r["id"] for r in writer.read_all()] == ["a/1", "a/10", "mid", "late"]
    assert writer.find("a/10") == {"id": "a/10"}
    assert writer.find("a/1") == {"id": "a/1"}
    assert writer.find("nope") is None


def test_episode_records_round_trip(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path, "e")
    writer = TrajectoryWriter(run)
    records = [episode(i).to_record() for i in range(3)]
    writer.write_step(3, records)
    found = writer.find("run/3/code-1/2")
    assert found is not None
    assert found["score"]["outcome"] == "passed"
    assert found["logprobs"][:2] == [-0.1, -0.2] and found["logprobs"][2] == float("-inf")
    assert writer.read_step(3)[0]["token_ids"] == [3, 4, 5]


def test_eval_records(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path, "ev")
    writer = TrajectoryWriter(run)
    writer.write_eval("before", [{"task_id": "t1", "reward": 0.0}])
    writer.write_eval("after", [{"task_id": "t1", "reward": 1.0}])
    writer.write_eval("after", [{"task_id": "t1", "reward": 0.5}])
    assert (run.eval_dir / "after.jsonl").is_file()
    assert writer.read_eval("after") == [{"task_id": "t1", "reward": 0.5}]
    assert writer.eval_tags() == ["after", "before"]
    with pytest.raises(ValueError, match="eval tag"):
        writer.write_eval("../x", [])
    with pytest.raises(CheckpointError):
        writer.read_eval("missing")
