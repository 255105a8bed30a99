"""Speed, cost and tool stability: prices resolved from the config, the flags or the built-in table
(unknown, not 0, otherwise); tokens/s, time to first token and tool-call failure figures from real
step records and from a real tiny-model eval; the checklist items they feed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tidal.agent.local import LocalPolicy
from tidal.agent.records import CallRecord, StepRecord
from tidal.config.schema import ModelConfig, TinyModelConfig
from tidal.errors import SandboxUnavailableError
from tidal.eval.checklist import evaluate_checklist
from tidal.eval.eval_report import EvalView, render_eval_report
from tidal.eval.harness import run_eval, view_of
from tidal.eval.metrics import summarize
from tidal.eval.prices import api_name, cost_of, resolve_price, with_flag_prices
from tidal.eval.settings import Budgets, Checklist, EvalSettings, Price
from tidal.eval.speed import speed_summary, step_fields
from tidal.models import load_model
from tidal.rollout import EmbeddedEngine
from tidal.sandbox import get_backend
from tidal.tasks import generate_tasks

SPEC = "openai:gpt-4o-mini@https://api.example.com/v1"


def test_prices_come_from_flags_then_config_then_the_table_else_unknown() -> None:
    bare = EvalSettings()
    found = resolve_price(SPEC, bare)
    assert found is not None and found.source == "built-in: gpt-4o-mini" and found.price.output_per_mtok == 0.60
    assert resolve_price("openai:gpt-4o-2024-08-06@http://x", bare).source == "built-in: gpt-4o"
    assert resolve_price("openai:anthropic/claude-3-5-sonnet-20241022@http://x", bare).price.input_per_mtok == 3.0
    assert resolve_price("openai:o3-pro@http://x", bare) is None  # a prefix is not a match
    assert resolve_price("/ckpt/run-7/step-400", bare) is None and api_name("/ckpt/x") is None
    assert cost_of(None, 1000, 100, 1.0) is None
    configured = EvalSettings(prices={"openai:gpt-4o": Price(input_per_mtok=1.0, output_per_mtok=2.0)})
    assert resolve_price(SPEC, configured).source == "config: openai:gpt-4o"  # config outranks the table
    flagged = with_flag_prices(configured, SPEC, 4.0, None)
    assert resolve_price(SPEC, flagged).price == Price(input_per_mtok=4.0, output_per_mtok=0.0)
    assert cost_of(resolve_price(SPEC, flagged), 1_000_000, 500_000, 0.0) == pytest.approx(4.0)
    assert with_flag_prices(bare, SPEC, None, None) is bare


def _step(out: int, seconds: float, ttft: float | None, tokens_in: int, calls: list[bool]) -> StepRecord:
    return StepRecord(index=0, tokens_in=tokens_in, tokens_out=out, generation_s=seconds, tool_s=0.0,
                      overhead_s=0.0, validity="valid", first_token_s=ttft,
                      calls=[CallRecord("bash", "{}", ok, 0.1, 10, False) for ok in calls])


def test_step_fields_count_speed_context_and_failed_calls() -> None:
    steps = [_step(10, 0.5, 0.1, 100, [False, True]), _step(30, 1.5, None, 400, [False]), _step(0, 0.2, 0.3, 50, [])]
    fields = step_fields(steps)
    assert fields["tokens_per_s"] == pytest.approx(40 / 2.2) and fields["first_token_s"] == pytest.approx(0.2)
    assert fields["max_context_tokens"] == 400
    # The first failure is followed by a success; the second (last call of the episode) is not.
    assert (fields["tool_calls"], fields["tool_calls_failed"], fields["tool_failures_recovered"]) == (3, 2, 1)


def _record(task: str, epoch: int, speeds: list, failed: int, calls: int, recovered: int, cost: float | None) -> dict:
    out, seconds = sum(s[0] for s in speeds), sum(s[1] for s in speeds)
    ttfts = [s[2] for s in speeds if s[2] is not None]
    return {"task_id": task, "epoch": epoch, "domain": "agent", "group": task, "outcome": "pass", "passed": True,
            "kind": "episode", "steps": len(speeds), "calls_valid": len(speeds), "calls_invalid": 0, "cost": cost,
            "step_speeds": speeds, "tokens_per_s": out / seconds, "first_token_s": sum(ttfts) / len(ttfts) if ttfts else None,
            "max_context_tokens": 300, "tool_calls": calls, "tool_calls_failed": failed,
            "tool_failures_recovered": recovered, "trace": f"traces/{task}-{epoch}.json", "detail": ""}


RECORDS = [_record("a", 0, [[10, 1.0, None], [30, 1.0, None]], 1, 4, 1, 0.01),
           _record("b", 0, [[50, 1.0, None]], 2, 2, 0, None), _record("c", 0, [[20, 2.0, None]], 0, 4, 0, 0.02)]


def test_speed_summary_and_unknown_cost_by_hand() -> None:
    summary = summarize(RECORDS, epochs=1)
    speed = summary["speed"]
    assert speed["tokens_per_s_task"]["mean"] == pytest.approx((20 + 50 + 10) / 3)  # per task: 20, 50, 10 tokens/s
    assert speed["tokens_per_s_step"]["mean"] == pytest.approx((10 + 30 + 50 + 10) / 4)
    low, high = speed["tokens_per_s_step"]["ci"]
    assert low <= 25 <= high and speed["tokens_per_s_step"]["bootstrap"] == 2000
    assert speed["first_token_s_task"] is None and speed["first_token_s_step"] is None  # not measured
    tools = summary["tools"]
    assert tools["failed_call_rate"]["rate"] == pytest.approx(3 / 10) and tools["failed_call_rate"]["events"] == 10
    assert tools["recovery_after_failure"]["rate"] == pytest.approx(1 / 3)
    assert summary["cost_per_task"] is None and summary["cost_unknown"] == 1  # b has no price: unknown, not 0
    assert summary["distributions"]["cost"]["sum"] == pytest.approx(0.03)
    items = {i["name"]: i for i in evaluate_checklist(summary, RECORDS, Checklist(
        cost_cap=1.0, min_tokens_per_s=30, max_first_token_s=2.0, max_failed_call_rate=0.2,
        min_recovery_after_failure=0.5, max_context_exceeded_rate=0.0), epochs=1)}
    assert items["cost per task"]["passed"] is None and "unknown" in items["cost per task"]["detail"]
    assert items["output speed (tokens/s)"]["passed"] is False and items["output speed (tokens/s)"]["links"][0]["task_id"] == "c"
    assert items["time to first token (s)"]["passed"] is None and "not measured" in items["time to first token (s)"]["detail"]
    assert items["failed tool calls"]["passed"] is False and items["failed tool calls"]["links"][0]["task_id"] == "b"
    assert items["recovery after a failed call"]["passed"] is False and items["context exceeded"]["passed"] is True
    html = render_eval_report([EvalView("m", Path("."), summary, RECORDS, list(items.values()))], Path("."))
    assert "unknown (1 episodes without a price)" in html and ">unknown<" in html and "not measured" in html


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_real_local_eval_records_speed_and_first_token_times(tmp_path: Path) -> None:
    try:
        backend = get_backend("bwrap")
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")
    loaded = load_model(ModelConfig(path="tiny", device="cpu", seed=5, tiny=TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128, max_position=4096)))
    policy = LocalPolicy(EmbeddedEngine(loaded.model.eval(), loaded.tokenizer), loaded.tokenizer, temperature=0.0)
    tasks = [*generate_tasks("agent", 2, "eval", seed=11, min_difficulty=1, max_difficulty=1),
             *generate_tasks("math", 1, "eval", seed=1)]
    settings = EvalSettings(budgets=Budgets(max_steps=2, max_tokens=4096, max_new_tokens=12))
    try:
        run_eval(policy, tasks, tmp_path / "e", backend, settings, model="/ckpt/local-model")
    finally:
        policy.close()
    records = [json.loads(line) for line in (tmp_path / "e" / "results.jsonl").read_text().splitlines()]
    for record in records:
        assert record["cost"] is None and record["price_source"] == "unknown"  # a path has no list price
        assert record["tokens_per_s"] > 0 and record["step_speeds"]
        for out, seconds, ttft in record["step_speeds"]:
            assert out > 0 and ttft is not None and 0 < ttft <= seconds  # the first token comes before the last
        assert record["max_context_tokens"] > 0
    assert {r["kind"] for r in records} == {"episode", "answer"}
    summary = view_of(tmp_path / "e", settings).summary
    assert summary["speed"]["first_token_s_step"]["steps"] == sum(len(r["step_speeds"]) for r in records)
    assert summary["cost_per_task"] is None and summary["index"]["task_set"] == json.loads(
        (tmp_path / "e" / "taskset.json").read_text())["hash"]
    assert speed_summary([])["tools"]["failed_call_rate"] is None
