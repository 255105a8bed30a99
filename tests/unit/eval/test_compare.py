"""Paired comparison statistics against hand-computed values, and `tidal compare` end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tidal.cli import app
from tidal.eval.compare import (
    CompareError,
    cluster_se,
    compare,
    holm,
    load_scores,
    mcnemar,
    min_detectable_difference,
    paired_bootstrap,
    scores_from_records,
)


def test_mcnemar_exact_and_chi_square() -> None:
    assert mcnemar(0, 0) == 1.0
    assert mcnemar(3, 3) == 1.0
    assert mcnemar(1, 5) == pytest.approx(2 * (1 + 6) / 64)  # exact binomial, n = 6
    assert mcnemar(0, 10) == pytest.approx(2 / 1024)
    assert mcnemar(10, 30) == pytest.approx(0.0026631, rel=1e-4)  # (|10-30|-1)^2/40 = 9.025, chi2(1)
    with pytest.raises(ValueError):
        mcnemar(-1, 2)


def test_holm_is_step_down_and_monotone() -> None:
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})
    assert holm({"x": 0.6, "y": 0.7}) == pytest.approx({"x": 1.0, "y": 1.0})
    assert holm({}) == {}


def test_minimum_detectable_difference() -> None:
    assert min_detectable_difference(100, 0.2) == pytest.approx(0.1252907, rel=1e-6)
    assert min_detectable_difference(400, 0.2) == pytest.approx(0.1252907 / 2, rel=1e-6)  # 4x tasks, half the MDD
    assert min_detectable_difference(10, 0.0) == pytest.approx(2.8015852 * math.sqrt(0.1 / 10), rel=1e-6)


def test_cluster_se() -> None:
    values = [0.2, 0.9, 0.4, 0.7, 0.1]
    plain = float(__import__("numpy").std(values, ddof=1)) / math.sqrt(len(values))
    assert cluster_se(values, ["a", "b", "c", "d", "e"]) == pytest.approx(plain)
    assert cluster_se([1, 0, 1, 0], ["g1", "g1", "g2", "g2"]) == pytest.approx(0.0)
    assert cluster_se([1, 1, 0, 0], ["g1", "g1", "g2", "g2"]) == pytest.approx(0.5)
    assert cluster_se([1, 0], ["g", "g"]) == math.inf


def test_paired_bootstrap_is_seeded_and_paired() -> None:
    a = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert paired_bootstrap(a, [x + 1 for x in a]) == (1.0, 1.0, 1.0)  # every pair moved by 1
    b = [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    first = paired_bootstrap(a, b, seed=3)
    assert first == paired_bootstrap(a, b, seed=3)
    mean, low, high = first
    assert mean == pytest.approx(0.25) and 0.0 <= low < mean < high <= 1.0  # no pair got worse
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0, 0.0])


def _records(outcomes: dict[str, list[str]], domain: str = "code") -> list[dict]:
    return [{"task_id": t, "domain": domain, "epoch": e, "outcome": o} for t, os_ in outcomes.items() for e, o in enumerate(os_)]


def test_compare_pairs_tasks_and_reports_flips() -> None:
    a = scores_from_records("A", _records({"t1": ["pass"], "t2": ["fail"], "t3": ["fail"], "t4": ["pass"], "t5": ["infra_error"],
                                         "t7": ["verifier_error"]})
                            + _records({"m1": ["pass"], "m2": ["pass"]}, "math"))
    b = scores_from_records("B", _records({"t1": ["pass"], "t2": ["pass"], "t3": ["pass"], "t4": ["fail"], "t6": ["pass"]})
                            + _records({"m1": ["pass"], "m2": ["pass"]}, "math"))
    result = compare(a, b, seed=1)
    code = next(d for d in result.domains if d.domain == "code")
    assert (code.n, code.only_a, code.only_b) == (4, 1, 2)
    assert code.mean_a == 0.5 and code.mean_b == 0.75 and code.diff == pytest.approx(0.25)
    assert code.p_value == pytest.approx(mcnemar(1, 2))
    assert result.flips_to_b == ["t2", "t3"] and result.flips_to_a == ["t4"]
    assert result.only_in_a == []  # t5 had only an infra error: not a result of the model
    assert result.only_in_b == ["t6"]
    assert result.excluded == {"A": 2, "B": 0}
    assert result.overall.n == 6
    with pytest.raises(CompareError, match="share no tasks"):
        compare(a, scores_from_records("C", _records({"zz": ["pass"]})))


def test_epochs_average_into_task_scores() -> None:
    scores = scores_from_records("A", _records({"t": ["pass", "fail", "pass", "pass"]}))
    assert scores.scores == {"t": 0.75}
    with pytest.raises(CompareError, match="has none of"):
        scores_from_records("A", [{"task_id": "t"}])


def test_cli_compare_two_result_files_and_a_run_tag(tmp_path: Path) -> None:
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    for folder, outcomes in ((run_a, ["fail"] * 30 + ["pass"] * 10), (run_b, ["pass"] * 36 + ["fail"] * 4)):
        folder.mkdir()
        lines = [json.dumps({"task_id": f"t{i}", "domain": "code", "outcome": o}) for i, o in enumerate(outcomes)]
        (folder / "results.jsonl").write_text("\n".join(lines) + "\n")
    runner = CliRunner()
    result = runner.invoke(app, ["compare", str(run_a), str(run_b), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    overall = payload[0]["overall"]
    assert overall["only_b"] == 30 and overall["only_a"] == 4 and overall["ci_low"] > 0
    text = runner.invoke(app, ["compare", str(run_a), str(run_b)]).output
    assert "overall: B better" in text and "solved by B, not A: 30" in text
    (run_a / "eval").mkdir()
    (run_a / "eval" / "before.jsonl").write_text(json.dumps({"task_id": "t0", "domain": "code", "pass_rate": 0.25}) + "\n")
    assert load_scores(f"{run_a}:before").scores == {"t0": 0.25}
    bad = runner.invoke(app, ["compare", str(run_a), str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "no results file" in bad.output
