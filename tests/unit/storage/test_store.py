"""The trajectory store: round trips on every filesystem, segment layout, exactly-once ledger."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import fsspec
import pyarrow.parquet as pq
import pytest

from tidal.errors import ExactlyOnceError, StoreError
from tidal.storage.run import RunFolder
from tidal.storage.schema import LEDGER, SCHEMA_VERSION, TRAJECTORIES
from tidal.storage.store import TrajectoryStore, open_run_store
from tidal.storage.store import store_url as run_store_url
from tidal.storage.trajectories import TrajectoryWriter


def test_round_trip_keeps_every_field(store_url: str, make_step, tasks) -> None:
    store = TrajectoryStore.open(store_url, run="r", writable=True)
    episodes = make_step("r", 3, drop={2})
    store.write_episodes(3, episodes, tasks, timings={"generate_s": 1.5, "score_s": 9.0})

    reader = TrajectoryStore.open(store_url)
    records = list(reader.records())
    assert [r["id"] for r in records] == [e.id for e in episodes]
    first, dropped = records[1], records[2]
    source = episodes[1]
    assert first["token_ids"] == source.completion.token_ids and first["prompt_ids"] == source.completion.prompt_ids
    assert first["logprobs"] == source.completion.logprobs  # exact: the trainer's old policy
    assert first["score"] == source.score.to_dict() | {"reward": 1.0}
    assert first["prompt_messages"] == [{"role": "user", "content": "What is 0 + 1?"}]
    assert first["timings"] == {"generate_s": 1.5, "score_s": 0.01}  # the episode's own timing wins
    assert (first["step"], first["weight_version"], first["run"], first["attempt"]) == (3, 3, "r", 1)
    assert dropped["keep"] is False and dropped["drop_reason"] == "degenerate"
    assert reader.steps() == [3]
    assert reader.get(source.id)["text"] == "answer 0.1" and reader.get("r/nope") is None


def test_segments_are_parquet_files_with_a_footer_manifest(tmp_path: Path, make_step) -> None:
    store = TrajectoryStore.open(str(tmp_path), run="r", writable=True)
    segment = store.write_episodes(0, make_step("r", 0))
    store.mark_trained([store.unconsumed()[0]], 0)
    names = sorted(p.name for p in (tmp_path / "data").iterdir())
    assert names == [segment.name]  # no temporary files left beside it
    meta = pq.read_metadata(tmp_path / "data" / segment.name).metadata
    assert meta[b"tidal.kind"] == b"trajectories" and meta[b"tidal.rows"] == b"6"
    assert meta[b"tidal.schema_version"] == str(SCHEMA_VERSION).encode()
    assert len(store.segments(LEDGER)) == 1 and store.segments(TRAJECTORIES) == [segment]
    # A temporary file left by a crash mid-write is not a segment.
    (tmp_path / "data" / f".{segment.name}.dead.tmp").write_bytes(b"PAR1 half")
    assert TrajectoryStore.open(str(tmp_path)).segments() == [segment]


def test_write_trained_crash_reopen_trains_the_rest_exactly_once(store_url: str, make_step) -> None:
    store = TrajectoryStore.open(store_url, run="r", writable=True)
    for step in range(3):
        store.write_episodes(step, make_step("r", step, drop={0}))
    kept = store.unconsumed()
    assert len(kept) == 3 * 2 * 2 and store.unconsumed(include_dropped=True)[0].endswith("g000/s00")
    store.mark_trained(kept[:5], step=0)
    del store  # "crash": nothing of the object survives, only what it wrote

    again = TrajectoryStore.open(store_url, run="r", writable=True)
    assert again.attempt == 2
    rest = again.unconsumed()
    assert rest == kept[5:]
    again.mark_trained(rest[:4], step=1)
    again.mark_trained(rest[4:], step=2)

    reader = TrajectoryStore.open(store_url)
    assert sorted(reader.trained()) == sorted(kept) and reader.unconsumed() == []
    ledger = [id_ for seg in reader.segments(LEDGER) for id_ in reader.files.read(seg).column("id").to_pylist()]
    assert Counter(ledger).most_common(1)[0][1] == 1  # no id recorded twice, none lost
    assert sorted(ledger) == sorted(kept)


def test_training_an_id_twice_is_refused_and_writes_nothing(store_url: str, make_step) -> None:
    store = TrajectoryStore.open(store_url, run="r", writable=True)
    store.write_episodes(0, make_step("r", 0, drop={1}))
    ids = store.unconsumed()
    store.mark_trained(ids[:2], 0)
    before = len(store.segments(LEDGER))
    with pytest.raises(ExactlyOnceError, match="already trained at step 0"):
        store.mark_trained(ids[1:3], 1)
    with pytest.raises(ExactlyOnceError, match="never written to the store"):
        store.mark_trained(["r/step-000009/g000/s00"], 1)
    with pytest.raises(ExactlyOnceError, match="dropped by the quality gate"):
        store.mark_trained(["r/step-000000/g000/s01"], 1)
    with pytest.raises(ExactlyOnceError, match="repeat"):
        store.mark_trained([ids[3], ids[3]], 1)
    assert len(store.segments(LEDGER)) == before
    # A second writer (another attempt) sees the ledger too.
    other = TrajectoryStore.open(store_url, run="r", writable=True)
    with pytest.raises(ExactlyOnceError):
        other.mark_trained(ids[:1], 5)


def test_resume_rolls_back_updates_lost_with_the_crash(store_url: str, make_step) -> None:
    """Steps 0-2 trained, the checkpoint holds steps 0-1: resuming at 2 voids step 2's ledger rows,
    the redone step 2 rewrites the same ids and trains them once."""
    store = TrajectoryStore.open(store_url, run="r", writable=True)
    for step in range(3):
        store.write_episodes(step, make_step("r", step))
        store.mark_trained([e.id for e in make_step("r", step)], step)
    step2 = [e.id for e in make_step("r", 2)]
    with pytest.raises(ExactlyOnceError, match="rollback"):
        store.write_episodes(2, make_step("r", 2))  # redoing a trained step without a rollback
    del store

    resumed = TrajectoryStore.open(store_url, run="r", writable=True)
    assert resumed.rollback(2) is not None
    assert resumed.unconsumed() == step2
    resumed.write_episodes(2, make_step("r", 2))
    resumed.mark_trained(step2, 2)
    assert resumed.rollback(3) is None  # nothing after step 2 to void: no ledger row

    reader = TrajectoryStore.open(store_url)
    trained = reader.trained()
    assert len(trained) == 18 and all(trained[i] == 2 for i in step2)
    latest = reader.table(["id", "attempt"])
    assert {a for i, a in zip(*latest.to_pydict().values()) if i in step2} == {2}
    assert reader.table(["id"], all_versions=True).num_rows == 24  # the crashed attempt's rows are kept


def test_writer_refuses_an_id_twice_in_one_attempt_and_another_runs_store(store_url: str, make_step) -> None:
    store = TrajectoryStore.open(store_url, run="r", writable=True)
    store.write_episodes(0, make_step("r", 0))
    with pytest.raises(StoreError, match="already written in this attempt"):
        store.write_episodes(0, make_step("r", 0))
    with pytest.raises(StoreError, match="belongs to run 'r', not 'other'"):
        TrajectoryStore.open(store_url, run="other", writable=True)
    with pytest.raises(StoreError, match="opened read-only"):
        TrajectoryStore.open(store_url).mark_trained(["x"], 0)


def test_run_store_url_and_trajectory_writer_read_the_store(tmp_path: Path, make_step) -> None:
    run = RunFolder.create(tmp_path, "r")
    assert run_store_url(run) == str(run.trajectories_dir)
    assert run_store_url(run, "memory://bucket/tidal/") == "memory://bucket/tidal/r"
    store = open_run_store(run)
    store.write_episodes(1, make_step("r", 1))
    store.write_episodes(0, make_step("r", 0, groups=1))
    writer = TrajectoryWriter(run)
    assert writer.steps() == [0, 1]
    assert [r["id"] for r in writer.read_step(0)] == [e.id for e in make_step("r", 0, groups=1)]
    assert [r["step"] for r in writer.read_all()] == [0] * 3 + [1] * 6
    assert writer.find("r/step-000001/g001/s02")["advantage"] == 0.5


def test_configured_url_puts_the_store_under_the_run_name(tmp_path: Path, make_step) -> None:
    run = RunFolder.create(tmp_path / "runs", "r2")
    run.config_path.write_text("run:\n  trajectory_store: memory://tidal-test-configured\n")
    store = open_run_store(run, "memory://tidal-test-configured")
    try:
        store.write_episodes(0, make_step("r2", 0))
        assert TrajectoryWriter(run).steps() == [0]  # found through config.yaml
        assert not run.trajectories_dir.joinpath("_store.json").exists()
    finally:
        fsspec.filesystem("memory").rm("/tidal-test-configured", recursive=True)
