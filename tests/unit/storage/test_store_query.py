"""DuckDB over the store: the views agree with the Python reader, on every filesystem."""

from __future__ import annotations

import pytest

from tidal.errors import StoreError
from tidal.storage.query import rows_of, run_query
from tidal.storage.store import TrajectoryStore


def _crashed_and_resumed(url: str, make_step) -> list[str]:
    """Steps 0-2 trained; a crash with the checkpoint at step 1; resumed: steps 1-2 redone."""
    store = TrajectoryStore.open(url, run="r", writable=True)
    for step in range(3):
        store.write_episodes(step, make_step("r", step, drop={2}))
        store.mark_trained([e.id for e in make_step("r", step) if not e.id.endswith("s02")], step)
    resumed = TrajectoryStore.open(url, run="r", writable=True)
    resumed.rollback(1)
    for step in (1, 2):
        resumed.write_episodes(step, make_step("r", step, drop={2}))
        resumed.mark_trained([i for i in resumed.unconsumed() if f"step-{step:06d}" in i], step)
    return [e.id for s in range(3) for e in make_step("r", s) if not e.id.endswith("s02")]


def test_views_match_the_python_reader_after_a_resume(store_url: str, make_step) -> None:
    kept = _crashed_and_resumed(store_url, make_step)
    reader = TrajectoryStore.open(store_url)
    trained_sql = run_query(reader, "SELECT id, step FROM trained ORDER BY id").to_pylist()
    assert {r["id"]: r["step"] for r in trained_sql} == reader.trained()
    assert sorted(reader.trained()) == sorted(kept)
    count = run_query(reader, "SELECT count(*) AS n, count(DISTINCT id) AS ids FROM trajectories").to_pylist()
    assert count == [{"n": 18, "ids": 18}]
    versions = run_query(reader, "SELECT attempt, count(*) AS n FROM trajectories_all GROUP BY attempt ORDER BY attempt")
    assert versions.to_pylist() == [{"attempt": 1, "n": 18}, {"attempt": 2, "n": 12}]
    latest = run_query(reader, "SELECT step, min(attempt) AS a FROM trajectories GROUP BY step ORDER BY step").to_pylist()
    assert latest == [{"step": 0, "a": 1}, {"step": 1, "a": 2}, {"step": 2, "a": 2}]
    events = run_query(reader, "SELECT event, count(*) AS n FROM ledger GROUP BY event ORDER BY event").to_pylist()
    assert events == [{"event": "rollback", "n": 1}, {"event": "trained", "n": 12 + 8}]


def test_maps_lists_and_joins_are_queryable(store_url: str, make_step) -> None:
    store = TrajectoryStore.open(store_url, run="r", writable=True)
    store.write_episodes(0, make_step("r", 0))
    store.mark_trained(store.unconsumed()[:2], 0)
    sql = """
        SELECT t.id, t.reward_components['exact'] AS exact, len(t.token_ids) AS tokens, t.logprobs[1] AS first,
               t.timings, tr.step IS NOT NULL AS trained
        FROM trajectories t LEFT JOIN trained tr USING (id) ORDER BY t.id LIMIT 2
    """
    rows = rows_of(run_query(TrajectoryStore.open(store_url), sql))
    assert rows[1] == {
        "id": "r/step-000000/g000/s01", "exact": 1.0, "tokens": 3, "first": -0.123456789012345,
        "timings": {"score_s": 0.01}, "trained": True,
    }


def test_empty_store_has_empty_views_and_bad_sql_is_a_store_error(store_url: str) -> None:
    TrajectoryStore.open(store_url, run="r", writable=True)
    reader = TrajectoryStore.open(store_url)
    assert run_query(reader, "SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 0}]
    assert run_query(reader, "SELECT * FROM trained").num_rows == 0
    with pytest.raises(StoreError, match="query over .* failed: .*nope"):
        run_query(reader, "SELECT nope FROM trajectories")
