"""The intelligence index: per-category scores, the weighted index with its task-clustered bootstrap
interval, task-set hashes and refusals, the paired difference of versions, `tidal index`."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest
from typer.testing import CliRunner

from tidal.cli import app
from tidal.errors import ConfigError
from tidal.eval.index import (
    Category,
    IndexConfig,
    TaskSetMismatch,
    compute_index,
    paired_index_difference,
    read_task_set,
    task_set,
    trend_of_folders,
    write_task_set,
)
from tidal.eval.settings import load_eval_settings
from tidal.types import Task

DOMAINS = {"m": "math", "c": "code", "k": "knowledge"}


def _record(task: str, epoch: int, passed: bool, outcome: str | None = None) -> dict:
    return {"task_id": task, "epoch": epoch, "domain": DOMAINS[task[0]], "group": task,
            "outcome": outcome or ("pass" if passed else "fail"), "passed": passed}


def _records(solved: dict[str, bool], epochs: int = 1) -> list[dict]:
    return [_record(t, e, ok) for e in range(epochs) for t, ok in solved.items()]


SOLVED = {"m1": True, "m2": False, "m3": True, "m4": True, "c1": True, "c2": False, "k1": False, "k2": False}


def test_index_is_the_weighted_mean_of_category_scores_with_renormalised_weights() -> None:
    config = IndexConfig(categories={"math": Category(weight=2, domains=["math"]),
                                     "code": Category(weight=1, domains=["code"]),
                                     "knowledge": Category(weight=1, domains=["knowledge"]),
                                     "agent": Category(weight=4, domains=["agent"])})
    result = compute_index(_records(SOLVED), config)
    scores = {n: c["score"] for n, c in result["categories"].items()}
    assert scores == {"math": 0.75, "code": 0.5, "knowledge": 0.0, "agent": None}
    # agent has no tasks: its weight is dropped and 2:1:1 renormalised to 0.5, 0.25, 0.25.
    assert result["index"] == pytest.approx(0.5 * 0.75 + 0.25 * 0.5 + 0.25 * 0.0)
    assert result["missing"] == ["agent"] and result["categories"]["math"]["weight"] == pytest.approx(0.5)
    assert result["bootstrap"] == 2000 and result["seed"] == 0
    low, high = result["ci"]
    assert low < result["index"] < high
    assert result["categories"]["knowledge"]["ci"] == [0.0, 0.0]  # no spread within the category


def test_epochs_of_a_task_are_resampled_together() -> None:
    """Three identical epochs per task carry no more information than one: the interval is the same.
    Resampling single episodes would make it about sqrt(3) narrower."""
    once = compute_index(_records(SOLVED, epochs=1))
    thrice = compute_index(_records(SOLVED, epochs=3))
    assert thrice["index"] == pytest.approx(once["index"]) and thrice["ci"] == pytest.approx(once["ci"])


def test_bootstrap_interval_matches_the_standard_error_of_a_mean_of_tasks() -> None:
    rng = np.random.default_rng(3)
    solved = {f"m{i}": bool(rng.random() < 0.6) for i in range(200)}
    config = IndexConfig(categories={"math": Category(domains=["math"])}, bootstrap=20000, seed=5)
    result = compute_index(_records(solved), config)
    p = result["index"]
    half = 1.96 * np.sqrt(p * (1 - p) / 200)  # the bootstrap SE of a mean is sd(ddof=0) / sqrt(n)
    assert (result["ci"][1] - result["ci"][0]) / 2 == pytest.approx(half, rel=0.08)
    again = compute_index(_records(solved), config)
    assert again["ci"] == result["ci"]  # seeded
    other = compute_index(_records(solved), config.model_copy(update={"seed": 6}))
    assert other["ci"] != result["ci"]


def test_task_patterns_come_before_domains_and_errors_are_left_out() -> None:
    config = IndexConfig(categories={"hard": Category(tasks=["m[34]"]), "math": Category(domains=["math"])})
    records = _records({"m1": True, "m2": False, "m3": True, "m4": False, "c1": True})
    records.append(_record("m5", 0, False, outcome="infra_error"))
    result = compute_index(records, config)
    assert result["categories"]["hard"]["tasks"] == 2 and result["categories"]["math"]["tasks"] == 2
    assert result["unmapped"] == ["c1"] and result["tasks"] == 4  # m5 had no scored epoch


def test_bad_index_config_lists_every_problem_at_load(tmp_path: Path) -> None:
    path = tmp_path / "eval.yaml"
    path.write_text("index:\n  bootstrap: 10\n  categories:\n    a: {domains: [math], weight: 0}\n"
                    "    b: {domains: [math]}\n    c: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        load_eval_settings(path)
    text = str(error.value)
    assert "bootstrap" in text and "weight" in text
    path.write_text("index:\n  categories:\n    b: {domains: [math]}\n    c: {domains: [math]}\n    d: {}\n",
                    encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        load_eval_settings(path)
    assert "already in 'b'" in str(error.value) and "categories.d" in str(error.value)


def _task(task_id: str, answer: str = "4") -> Task:
    return Task.model_validate({"id": task_id, "domain": DOMAINS[task_id[0]], "prompt": f"solve {task_id}",
                                "verifier": {"name": "math", "answer": answer}})


def test_task_set_hash_covers_ids_and_content(tmp_path: Path) -> None:
    base = task_set([_task("m1"), _task("m2")])
    assert task_set([_task("m2"), _task("m1")])["hash"] == base["hash"]  # order does not matter
    assert task_set([_task("m1"), _task("m2", answer="5")])["hash"] != base["hash"]
    assert task_set([_task("m1")])["hash"] != base["hash"]
    write_task_set(tmp_path, [_task("m1"), _task("m2")])
    assert read_task_set(tmp_path) == base


def _eval_folder(folder: Path, solved: dict[str, bool], tasks: list[Task] | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(solved)), encoding="utf-8")
    (folder / "eval.json").write_text(json.dumps({"model": folder.name, "epochs": 1, "tasks": list(solved)}))
    write_task_set(folder, tasks if tasks is not None else [_task(t) for t in solved])
    return folder


def test_paired_difference_uses_the_same_draws_for_both_versions() -> None:
    before = _records(SOLVED)
    assert paired_index_difference(before, before)["ci"] == [0.0, 0.0]
    after = _records({**SOLVED, "m2": True})  # one math task of four flips to solved
    config = IndexConfig(categories={"math": Category(domains=["math"]), "code": Category(domains=["code"])})
    result = paired_index_difference(before, after, config)
    assert result["diff"] == pytest.approx(0.5 * 0.25) and result["tasks"] == 6
    low, high = result["ci"]
    # Paired: never below 0 (no task got worse); the top 2.5% needs the flipped task in 3 of 4 draws.
    assert low >= 0.0 and high == pytest.approx(0.5 * 0.75)
    unpaired_width = (compute_index(after, config)["ci"][1] - compute_index(after, config)["ci"][0])
    assert high - low < unpaired_width


def test_trend_refuses_folders_of_different_task_sets(tmp_path: Path) -> None:
    a = _eval_folder(tmp_path / "a", SOLVED)
    b = _eval_folder(tmp_path / "b", SOLVED, tasks=[_task(t, answer="5" if t == "m1" else "4") for t in SOLVED])
    with pytest.raises(TaskSetMismatch) as error:
        trend_of_folders([str(a), str(b)])
    first, second = read_task_set(a)["hash"], read_task_set(b)["hash"]
    assert first[:16] in str(error.value) and second[:16] in str(error.value) and "m1" in str(error.value)
    assert (error.value.first_hash, error.value.second_hash) == (first, second)


def test_tidal_index_writes_a_trend_in_version_order(tmp_path: Path) -> None:
    v10 = _eval_folder(tmp_path / "run-c", {**SOLVED, "m2": True, "k1": True})
    v2 = _eval_folder(tmp_path / "run-b", {**SOLVED, "m2": True})
    v1 = _eval_folder(tmp_path / "run-a", SOLVED)
    out = tmp_path / "index"
    result = CliRunner().invoke(app, ["index", f"{v10}:v10", f"{v2}:v2", f"{v1}:v1", "--by-label", "--out", str(out),
                                      "--bootstrap", "500", "--seed", "7"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "index.json").read_text(encoding="utf-8"))
    assert [v["label"] for v in data["versions"]] == ["v1", "v2", "v10"]
    assert data["bootstrap"] == 500 and data["seed"] == 7
    assert [round(d["diff"], 6) for d in data["differences"]] == [round(0.2 * 0.25 / 0.6, 6), round(0.2 * 0.5 / 0.6, 6)]
    assert "v1 -> v2" in result.output and "B=500" in result.output
    svg = ElementTree.fromstring((out / "trend.svg").read_text(encoding="utf-8"))
    assert svg.tag.endswith("svg") and len(svg.findall(".//{http://www.w3.org/2000/svg}circle")) == 3
    assert "Paired difference" in (out / "index.html").read_text(encoding="utf-8")


def test_tidal_index_exits_2_with_both_hashes_on_a_mismatch(tmp_path: Path) -> None:
    a = _eval_folder(tmp_path / "a", SOLVED)
    b = _eval_folder(tmp_path / "b", {**SOLVED, "m9": True})
    result = CliRunner().invoke(app, ["index", str(a), str(b), "--out", str(tmp_path / "index")])
    assert result.exit_code == 2
    assert read_task_set(a)["hash"][:16] in result.output and read_task_set(b)["hash"][:16] in result.output


def test_eval_report_compares_indices_only_on_the_same_task_set(tmp_path: Path) -> None:
    from tidal.eval.eval_report import render_eval_report
    from tidal.eval.harness import view_of
    from tidal.eval.settings import EvalSettings

    settings = EvalSettings()
    candidate = view_of(_eval_folder(tmp_path / "new", {**SOLVED, "m2": True}), settings)
    same = view_of(_eval_folder(tmp_path / "old", SOLVED), settings)
    other = view_of(_eval_folder(tmp_path / "other", {**SOLVED, "m9": True}), settings)
    html = render_eval_report([candidate, same, other], tmp_path)
    expected = paired_index_difference(same.records, candidate.records, settings.index)["diff"]
    assert f"new − old: {100 * expected:+.1f} pts" in html and "Intelligence index" in html
    assert "new vs other: not compared, the task sets differ" in html
    assert candidate.summary["index"]["bootstrap"] == 2000
