"""Eval metrics, checklist, report and config from fixed records: checked against hand-computed values."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.errors import ConfigError
from tidal.eval.checklist import evaluate_checklist
from tidal.eval.eval_report import EvalView, render_eval_report
from tidal.eval.metrics import summarize
from tidal.eval.settings import Checklist, load_eval_settings

ROOT = Path(__file__).resolve().parents[3]


def _record(task: str, epoch: int, outcome: str, steps: int = 3, invalid: int = 0, recovered: int = 0,
            followed: int = 0, cost: float = 0.01, domain: str = "agent", group: str | None = None) -> dict:
    return {"task_id": task, "epoch": epoch, "domain": domain, "group": group or task, "outcome": outcome,
            "passed": outcome == "pass", "steps": steps, "calls_valid": steps - invalid, "calls_invalid": invalid,
            "recoveries": recovered, "failures_followed": followed, "cost": cost, "max_steps": 4,
            "tokens_in": 100, "tokens_out": 10, "latency_s": 1.0, "generation_s": 0.5, "tool_s": 0.3,
            "overhead_s": 0.2, "trace": f"traces/{task}-e{epoch}.json", "detail": ""}


RECORDS = [
    _record("a", 0, "pass", steps=2), _record("a", 1, "pass", steps=3), _record("a", 2, "pass", steps=4),
    _record("b", 0, "pass", steps=1, invalid=1, followed=1, recovered=1), _record("b", 1, "fail"),
    _record("b", 2, "step_limit", steps=4, invalid=2, followed=2),
    _record("c", 0, "fail"), _record("c", 1, "infra_error"), _record("c", 2, "verifier_error"),
]


def test_summary_matches_hand_computed_values() -> None:
    s = summarize(RECORDS, epochs=3)
    assert s["outcomes"]["infra_error"] == 1 and s["verifier_errors"] == 1
    assert (s["scored"], s["passed"]) == (7, 4) and s["pass_rate"] == pytest.approx(4 / 7)
    # Clustered by task: residuals y - p n of a, b, c are 9/7, -5/7, -4/7, so var = (122/49) / 7^2 and
    # n_eff = p(1-p) / var = 588/122 = 4.82 (not 7 episodes); Wilson at p = 4/7, n = 4.82.
    assert s["interval"]["clusters"] == 3 and s["design_effect"] == pytest.approx(7 / (588 / 122))
    assert s["ci"][0] == pytest.approx(0.2087, abs=1e-3) and s["ci"][1] == pytest.approx(0.8708, abs=1e-3)
    # Per task: a 3/3, b 1/3, c 0/1 (its other epochs were not the model's). pass@1 = mean(1, 1/3, 0).
    assert s["pass_at_k"]["1"] == pytest.approx((1 + 1 / 3 + 0) / 3)
    assert s["pass_at_k"]["2"] == pytest.approx((1 + (1 - 1 / 3)) / 2)  # b: 1 - C(2,2)/C(3,2)
    assert s["pass_hat_k"]["3"] == pytest.approx((1 + 0) / 2)
    assert s["format_compliance"] == pytest.approx((20 - 3) / 20)  # turns: a 9, b 8, c 3
    assert s["recovery_rate"] == pytest.approx(1 / 3)
    assert dict(s["success_by_steps"]) == pytest.approx({1: 1 / 7, 2: 2 / 7, 3: 3 / 7, 4: 4 / 7})
    assert s["cluster_se_task"] is not None and s["latency_split"]["generation_s"] == pytest.approx(3.5)


def test_checklist_marks_each_threshold_with_links() -> None:
    s = summarize(RECORDS, epochs=3)
    items = evaluate_checklist(s, RECORDS, Checklist(non_inferiority_margin=0.05, cost_cap=0.005,
                                                     format_compliance_floor=0.9, pass_hat_k_floor=0.4,
                                                     min_pass_rate=0.5), epochs=3,
                               baseline=[_record("a", 0, "pass"), _record("b", 0, "pass"), _record("c", 0, "pass")])
    verdicts = {item["name"]: item["passed"] for item in items}
    assert verdicts == {"non-inferior to the baseline": False, "cost per task": False,
                        "tool-call format compliance": False, "pass^3": True, "pass rate": True}
    compliance = next(i for i in items if i["name"] == "tool-call format compliance")
    assert [link["task_id"] for link in compliance["links"]] == ["b", "b"]
    assert compliance["links"][0]["trace"] == "traces/b-e2.json"


def test_report_escapes_hostile_names_and_links_traces(tmp_path: Path) -> None:
    records = [_record("<script>alert(1)</script>", 0, "fail"), _record("ok", 0, "pass")]
    s = summarize(records)
    view = EvalView("model<b>", tmp_path / "run", s, records, evaluate_checklist(s, records, Checklist(), 1))
    html = render_eval_report([view], tmp_path)
    assert "<script>" not in html and "&lt;script&gt;" in html and "model&lt;b&gt;" in html
    assert 'href="run/traces/ok-e0.json"' in html
    assert "Content-Security-Policy" in html and html.count("<svg") >= 4


def test_shipped_config_loads_and_bad_config_lists_every_problem(tmp_path: Path) -> None:
    settings = load_eval_settings(ROOT / "configs" / "eval.yaml")
    assert settings.price("openai:gpt-4o-mini@https://x/v1").input_per_mtok == 0.15
    assert settings.price("openai:gpt-4o@https://x/v1").input_per_mtok == 2.5
    bad = tmp_path / "bad.yaml"
    bad.write_text("retries: {attempts: 0}\nchecklist: {format_compliance_floor: 2}\nbudgetz: {}\n")
    with pytest.raises(ConfigError) as caught:
        load_eval_settings(bad)
    assert len(caught.value.problems) == 3
