"""Complete records from an asynchronous run: the rollout engines' `engine/*` counters reach its
metrics rows as they do in a synchronous run, and its store holds each agent episode's loss mask
and tool tokens. Both are read back from the run folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.pipeline import quickstart as qs
from tidal.pipeline.async_source import sum_engine_metrics
from tidal.storage.run import RunFolder
from tidal.storage.store import existing_run_store


def test_workers_engine_counters_sum_and_their_rates_weigh_by_what_they_are_a_fraction_of() -> None:
    one = {"engine/prompt_tokens": 300, "engine/reuse_rate": 0.5, "engine/preemptions": 1,
           "spec/drafted": 0, "spec/acceptance_rate": 0.0}
    two = {"engine/prompt_tokens": 100, "engine/reuse_rate": 0.1, "engine/preemptions": 2,
           "spec/drafted": 10, "spec/acceptance_rate": 0.8}
    summed = sum_engine_metrics([one, two])
    assert summed["engine/prompt_tokens"] == 400 and summed["engine/preemptions"] == 3
    assert summed["engine/reuse_rate"] == pytest.approx((300 * 0.5 + 100 * 0.1) / 400)
    assert summed["spec/acceptance_rate"] == pytest.approx(0.8)  # the worker that drafted nothing weighs 0
    assert sum_engine_metrics([{"engine/reuse_rate": 0.2, "engine/prompt_tokens": 0}] * 2)["engine/reuse_rate"] == \
        pytest.approx(0.2)
    assert sum_engine_metrics([]) == {}


def test_an_async_run_records_engine_metrics_and_agent_masks(tmp_path: Path) -> None:
    overrides = [
        ("tasks.domains={agent: {family: agent, n_train: 4, n_eval: 1, max_difficulty: 1}, "
         "math: {family: math, n_train: 8, n_eval: 1, max_difficulty: 1}}"),
        "tasks.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=12",
        "model.tiny.max_position=4096", "trainer.steps=2", "eval.samples_per_task=1",
        "pipeline.mode=async", "algorithm.max_staleness=1",
        "gate.drop_zero_variance=false", "gate.drop_truncated=false", "gate.drop_empty=false",
        "gate.max_repetition=1.0", "audit.watch.enabled=false",
    ]
    qs.run_quickstart(qs.find_config("smoke"), overrides, tmp_path, "records")
    run = RunFolder.open(tmp_path / "records")

    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    assert len(rows) == 2
    # The rollout worker's own engine prefilled the batches' prompts; its counters never go back.
    assert all(row["engine/prompt_tokens"] > 0 and 0 <= row["engine/reuse_rate"] <= 1 for row in rows)
    assert rows[1]["engine/prompt_tokens"] >= rows[0]["engine/prompt_tokens"]

    store = existing_run_store(run)
    assert store is not None
    records = list(store.records())
    agent = [r for r in records if r["domain"] == "agent"]
    assert agent and len(agent) < len(records)
    for record in records:
        n = len(record["token_ids"])
        assert len(record["loss_mask"]) == len(record["tool_mask"]) == n, record["id"]
        assert not any(m and t for m, t in zip(record["loss_mask"], record["tool_mask"]))  # never both
        if record["domain"] != "agent":
            assert record["loss_mask"] == [1] * n and record["tool_mask"] == [0] * n
    # At least one agent episode ran a tool and read its result: tool tokens, not trained, logprob 0.
    with_tools = [r for r in agent if any(r["tool_mask"])]
    assert with_tools
    for record in with_tools:
        assert all(lp == 0.0 for lp, t in zip(record["logprobs"], record["tool_mask"]) if t)
        assert any(record["loss_mask"])
