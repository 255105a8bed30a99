"""The store keeps each trajectory's loss mask and which tokens came from tools (schema version 2),
so the tokens a multi-turn episode trained on can be told from its tool output after the fact,
also where a generated token's logprob is exactly 0; segments of version 1 read them as null."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from rich.console import Console

from tidal.storage import schema
from tidal.storage.cli_support import show_trajectory
from tidal.storage.query import run_query
from tidal.storage.store import TrajectoryStore
from tidal.types import Completion, Episode, Outcome, Score


def _agent_episode(run: str, step: int = 0) -> Episode:
    # turn (3 tokens, one with logprob exactly 0) | tool result (4) | turn (2)
    completion = Completion(prompt_ids=[1, 2], token_ids=[10, 11, 12, 20, 21, 22, 23, 13, 14],
                            logprobs=[-0.5, 0.0, -0.25, 0.0, 0.0, 0.0, 0.0, -1.0, -0.125],
                            text="turn one\nturn two", finish_reason="stop", weight_version=step,
                            loss_mask=[1, 1, 1, 0, 0, 0, 0, 1, 1], tool_mask=[0, 0, 0, 1, 1, 1, 1, 0, 0])
    group = f"{run}/step-{step:06d}/g000"
    return Episode(f"{group}/s00", "agent/t", "agent", group, completion,
                   Score(1.0, Outcome.PASSED))


def test_masks_round_trip_and_single_turn_rows_are_written_out(tmp_path: Path, make_step) -> None:
    store = TrajectoryStore.open(str(tmp_path / "store"), run="r", writable=True)
    agent = _agent_episode("r")
    plain = make_step("r", 0, groups=1, samples=1)[0]
    plain.id, plain.group_id = "r/step-000000/g001/s00", "r/step-000000/g001"
    store.write_episodes(0, [agent, plain])

    records = {r["id"]: r for r in TrajectoryStore.open(str(tmp_path / "store")).records()}
    stored = records[agent.id]
    assert stored["loss_mask"] == agent.completion.loss_mask and stored["tool_mask"] == agent.completion.tool_mask
    generated = [t for t, m in zip(stored["token_ids"], stored["loss_mask"]) if m]
    assert generated == [10, 11, 12, 13, 14]  # token 11's logprob is 0: the mask, not the logprob, says so
    assert [t for t, m in zip(stored["token_ids"], stored["tool_mask"]) if m] == [20, 21, 22, 23]
    single = records[plain.id]  # a completion without masks: every token generated, none from tools
    assert single["loss_mask"] == [1, 1, 1] and single["tool_mask"] == [0, 0, 0]
    # And in SQL: the trained and the tool tokens of each row.
    table = run_query(TrajectoryStore.open(str(tmp_path / "store")),
                      "SELECT id, list_sum(loss_mask) AS trained, list_sum(tool_mask) AS tool FROM trajectories ORDER BY id")
    assert table.to_pylist() == [{"id": agent.id, "trained": 5, "tool": 4}, {"id": plain.id, "trained": 3, "tool": 0}]
    # `tidal trajectories show`: the split, and a logprob summary of the generated tokens only.
    console = Console(record=True, width=200)
    show_trajectory(TrajectoryStore.open(str(tmp_path / "store")), agent.id, console)
    text = console.export_text()
    assert "9 tokens (5 generated and trained on, 4 from tools)" in text
    assert "logprobs: sum -1.875  mean -0.375" in text


def test_a_mask_of_the_wrong_length_is_refused_naming_the_episode(tmp_path: Path) -> None:
    episode = _agent_episode("r")
    episode.completion.loss_mask = [1, 0]
    with pytest.raises(ValueError, match=f"episode {episode.id}: its loss_mask has 2 entries for 9 tokens"):
        schema.episode_row(episode, 0)


def test_a_version_1_segment_reads_its_masks_as_null(tmp_path: Path, make_step, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "store")
    store = TrajectoryStore.open(url, run="r", writable=True)
    version_1 = pa.schema([f for f in schema.TRAJECTORY_SCHEMA if f.name not in ("loss_mask", "tool_mask")])
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 1)
    monkeypatch.setitem(schema.SCHEMAS, schema.TRAJECTORIES, version_1)
    from tidal.storage import segments

    monkeypatch.setattr(segments, "SCHEMA_VERSION", 1)
    rows = [{k: v for k, v in schema.episode_row(e, 0).items() if k not in ("loss_mask", "tool_mask")}
            for e in make_step("r", 0, groups=1, samples=2)]
    store.append(rows)
    monkeypatch.undo()

    store.write_episodes(1, [_agent_episode("r", step=1)])
    records = {r["id"]: r for r in TrajectoryStore.open(url).records()}
    assert [records[r["id"]]["loss_mask"] for r in rows] == [None, None]
    assert records["r/step-000001/g000/s00"]["tool_mask"] == [0, 0, 0, 1, 1, 1, 1, 0, 0]
    table = run_query(TrajectoryStore.open(url), "SELECT count(*) AS n FROM trajectories WHERE loss_mask IS NULL")
    assert table.to_pylist() == [{"n": 2}]
