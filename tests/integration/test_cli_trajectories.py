"""`tidal trajectories query|show|migrate`, and exactly-once through the real loop across a crash."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from typer.testing import CliRunner

from tidal.cli import app
from tidal.pipeline import quickstart as qs
from tidal.storage.query import run_query
from tidal.storage.run import RunFolder
from tidal.storage.segments import CorruptSegmentWarning
from tidal.storage.store import TrajectoryStore, existing_run_store
from tidal.storage.trajectories import TrajectoryWriter
from tidal.types import Completion, Episode, Outcome, Score

runner = CliRunner()

# Every sample kept (the random-init tiny model's answers would all be dropped otherwise), no warm start.
KEEP_ALL = [
    "warm_start.enabled=false", "gate.drop_zero_variance=false", "gate.drop_truncated=false",
    "gate.drop_empty=false", "gate.max_repetition=1", "eval.samples_per_task=1", "trainer.steps=3",
]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunFolder]:
    """A smoke run that crashes after step 2's update (trajectories stored, ledger written, no
    checkpoint yet), then is resumed from its folder with `tidal train`."""
    from tidal.rollout.engine import EmbeddedEngine

    original = EmbeddedEngine.update_weights
    calls = {"n": 0}

    def crash_on_third(self: EmbeddedEngine, state: object, version: int) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash")
        original(self, state, version)

    parent = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EmbeddedEngine, "update_weights", crash_on_third)
        with pytest.raises(RuntimeError, match="simulated crash"):
            qs.run_quickstart(qs.find_config("smoke"), KEEP_ALL, parent, "crash")
    run = RunFolder.open(parent / "crash")
    result = runner.invoke(app, ["train", str(run.path)])
    assert result.exit_code == 0, result.output
    yield run


def test_loop_trains_every_kept_trajectory_exactly_once_across_a_crash(resumed_run: RunFolder) -> None:
    store = existing_run_store(resumed_run)
    assert store is not None and store.steps() == [0, 1, 2]
    kept = {r["id"] for r in store.records() if r["keep"]}
    trained = store.trained()
    assert set(trained) == kept and store.unconsumed() == []
    assert {i: s for i, s in trained.items() if "/step-000002/" in i} == {i: 2 for i in kept if "/step-000002/" in i}
    trained_rows = sum(m["trained_samples"] for m in resumed_run.read_metrics() if m.get("phase") == "rl")
    assert trained_rows == len(trained)  # what the trainer reports it trained is what the ledger holds

    # Physically, step 2 was trained by the crashed attempt too; the rollback voids those rows.
    twice = run_query(store, "SELECT id FROM ledger WHERE event = 'trained' GROUP BY id HAVING count(*) > 1")
    assert {r["id"] for r in twice.to_pylist()} == {i for i in kept if "/step-000002/" in i}
    assert run_query(store, "SELECT step FROM ledger WHERE event = 'rollback'").to_pylist() == [{"step": 2}]
    assert run_query(store, "SELECT count(*) AS n FROM trained").to_pylist() == [{"n": len(kept)}]
    assert TrajectoryWriter(resumed_run).steps() == [0, 1, 2]  # the old reader API sees the store


def test_query_prints_a_table_and_json_lines(resumed_run: RunFolder) -> None:
    sql = "SELECT step, count(*) AS n, sum(keep::int) AS kept FROM trajectories GROUP BY step ORDER BY step"
    result = runner.invoke(app, ["trajectories", "query", str(resumed_run.path), sql, "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and all(r["n"] == r["kept"] > 0 for r in rows)
    table = runner.invoke(app, ["trajectories", "query", str(resumed_run.path), sql])
    assert table.exit_code == 0 and "kept" in table.output and "(3 rows)" in table.output
    bad = runner.invoke(app, ["trajectories", "query", str(resumed_run.path), "SELECT nope FROM trajectories"])
    assert bad.exit_code == 2 and "query over" in bad.output


def test_show_prints_a_trajectory_step_by_step(resumed_run: RunFolder) -> None:
    id_ = f"{resumed_run.name}/step-000002/g001/s02"
    result = runner.invoke(app, ["trajectories", "show", str(resumed_run.path), id_])
    assert result.exit_code == 0, result.output
    for part in (id_, "1. prompt", "2. completion", "prompt tokens", "logprobs: sum", "3. reward", "outcome",
                 "4. quality gate", "kept", "trained at update 2", "attempt 2", "generate_s"):
        assert part in result.output, part
    missing = runner.invoke(app, ["trajectories", "show", str(resumed_run.path), "no/such/id"])
    assert missing.exit_code == 2 and "has no trajectory 'no/such/id'" in missing.output


def test_store_url_target_corrupt_segment_and_lenient(tmp_path: Path) -> None:
    url = f"memory://tidal-cli-{uuid.uuid4().hex}"
    store = TrajectoryStore.open(url, run="m", writable=True)
    try:
        good = store.write_episodes(0, [_episode("m", 0, 0, keep=True)])
        bad = store.write_episodes(1, [_episode("m", 1, 0, keep=True)])
        fs = fsspec.filesystem("memory")
        fs.pipe_file(bad.path, fs.cat_file(bad.path)[:100])  # torn
        strict = runner.invoke(app, ["trajectories", "query", url, "SELECT id FROM trajectories"])
        assert strict.exit_code == 2 and bad.name in strict.output and "corrupt" in strict.output
        with pytest.warns(CorruptSegmentWarning, match=bad.name):
            lenient = runner.invoke(app, ["trajectories", "query", url, "SELECT id FROM trajectories", "--json", "--lenient"])
        assert lenient.exit_code == 0
        assert [json.loads(line)["id"] for line in lenient.output.splitlines() if line.startswith("{")] == ["m/step-000000/g000/s00"]
        assert good.name not in lenient.output
    finally:
        fsspec.filesystem("memory").rm(url.split("://", 1)[1], recursive=True)


def test_jsonl_run_is_pointed_at_migrate_and_migrates(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path, "old")
    writer = TrajectoryWriter(run)
    for step in (0, 1, 2):
        writer.write_step(step, [_episode("old", step, s, keep=s != 1).to_record() for s in range(3)])
    for step in (1, 2):  # step 2 was stored, but the run died before its update finished
        run.append_metrics({"phase": "rl", "step": step})
    refused = runner.invoke(app, ["trajectories", "query", str(run.path), "SELECT 1"])
    assert refused.exit_code == 2 and "tidal trajectories migrate" in refused.output

    migrated = runner.invoke(app, ["trajectories", "migrate", str(run.path)])
    assert migrated.exit_code == 0 and "migrated 9 trajectories (4 marked trained)" in migrated.output, migrated.output
    assert writer.step_path(0).is_file()  # the JSONL files are kept
    result = runner.invoke(app, ["trajectories", "query", str(run.path), "SELECT id, step FROM trained ORDER BY id", "--json"])
    trained = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["id"].split("/", 1)[1], r["step"]) for r in trained] == [
        ("step-000000/g000/s00", 0), ("step-000000/g000/s02", 0), ("step-000001/g000/s00", 1), ("step-000001/g000/s02", 1),
    ]
    again = runner.invoke(app, ["trajectories", "migrate", str(run.path)])
    assert again.exit_code == 2 and "nothing to migrate" in again.output


def test_show_prints_an_agent_episode_turn_by_turn(tmp_path: Path) -> None:
    """A real agent episode (the oracle policy in the bwrap sandbox, turned into a trainable
    episode by the RL loop's own `episode_from_result`) is shown turn by turn: each turn's timings,
    the model's message, the tool call with its arguments, the tool result; the step count has no
    seconds unit; a hostile message is printed as text, not read as rich markup."""
    from tidal.agent.policy import make_policy
    from tidal.agent.runner import run_episode
    from tidal.errors import SandboxUnavailableError
    from tidal.pipeline.agent_rollout import episode_from_result
    from tidal.sandbox import get_backend
    from tidal.tasks import generate_tasks

    try:
        backend = get_backend("bwrap")
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")
    task = generate_tasks("agent", 1, "eval", seed=3, min_difficulty=1, max_difficulty=1)[0]
    result = run_episode(task, make_policy("oracle"), backend)
    result.trace["messages"].append({"role": "assistant", "content": "[bold red]not markup[/bold red]"})
    run = RunFolder.create(tmp_path, "ag")
    store = TrajectoryStore.open(str(run.trajectories_dir), run=run.name, writable=True)
    episode = episode_from_result(result, "ag/step-000000/g000/s00", "ag/step-000000/g000", 0)
    store.write_episodes(0, [episode], {task.id: task}, {"generate_s": 0.5})

    shown = runner.invoke(app, ["trajectories", "show", str(run.path), episode.id], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    out = shown.output
    for part in ("2. episode, turn by turn", "turn 1  generation", "turn 2  generation", "tool: [exit code 0]",
                 'call bash({"command":', "call submit({}) ok in", f"{len(result.steps) + 1} turns; ended by submitted",
                 "outcome pass", "[bold red]not markup[/bold red]", "component", "tests"):
        assert part in out, part
    assert out.index("turn 1") < out.index("call bash(") < out.index("tool: [exit code 0]") < out.index("turn 2")
    assert f"agent_steps {len(result.steps)}  " in out and "agent_steps 2.000s" not in out
    assert "generate_s 0.500s" in out


def _episode(run: str, step: int, sample: int, keep: bool) -> Episode:
    group = f"{run}/step-{step:06d}/g000"
    completion = Completion([1, 2], [3, 4, 5], [-0.5, -0.25, -0.125], "42", "stop", step)
    score = Score(1.0, Outcome.PASSED, {"exact": 1.0}, "", {})
    return Episode(f"{group}/s{sample:02d}", "math-0", "math", group, completion, score, keep, "" if keep else "empty")
