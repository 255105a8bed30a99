"""`tidal eval --sweep context=...`: one eval per context length, and the curve in the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tidal.cli import app
from tidal.config.schema import ModelConfig, TinyModelConfig
from tidal.errors import EvalError
from tidal.eval.sweep import parse_sweep
from tidal.models import load_model, save_checkpoint

runner = CliRunner()


def test_sweep_specs_are_parsed_or_refused() -> None:
    assert parse_sweep("context=1k,512,2k") == [512, 1024, 2048]
    for bad in ("ctx=1k", "context=", "context=1q", "context=8"):
        with pytest.raises(EvalError):
            parse_sweep(bad)


def _tiny_checkpoint(folder: Path) -> Path:
    """The tiny model with a 4096-token window, so the sweep's lengths, not the model, bind."""
    loaded = load_model(ModelConfig(path="tiny", device="cpu", seed=1, tiny=TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128, max_position=4096)))
    return save_checkpoint(loaded.model, loaded.tokenizer, folder)


def test_a_context_sweep_on_the_tiny_model_writes_every_point_and_the_curve(tmp_path: Path) -> None:
    model = _tiny_checkpoint(tmp_path / "tiny-4k")
    tasks = tmp_path / "tasks.jsonl"
    rows = [{"id": f"t{i}", "domain": "agent", "prompt": "Write hi into out.txt" + " please" * (40 * i),
             "verifier": {"name": "python_tests"}, "tools": ["bash"], "max_steps": 1,
             "tests": {"test_out.py": "def test_out():\n    assert open('out.txt').read() == 'hi'\n"}}
            for i in range(3)]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "eval.yaml"
    config.write_text("prompt: {system: Use the tools.}\nbudgets: {max_new_tokens: 16}\n")
    out = tmp_path / "sweep"
    result = runner.invoke(app, ["eval", "--model", str(model), "--tasks", str(tasks), "--out", str(out),
                                 "--config", str(config), "--sweep", "context=1k,2k"])
    assert result.exit_code == 0, result.output
    points = json.loads((out / "sweep.json").read_text())["points"]
    assert [p["context_length"] for p in points] == [1024, 2048]
    assert all(p["scored"] == 3 for p in points)
    # The two longer prompts do not fit 1k tokens with the tools' declarations; all fit 2k.
    assert points[0]["context_exceeded"] == 2 and points[1]["context_exceeded"] == 0
    assert points[0]["tokens_per_task"] < points[1]["tokens_per_task"]
    for length in (1024, 2048):
        spec = json.loads((out / f"context-{length}" / "eval.json").read_text())
        assert spec["settings"]["context"]["context_length"] == length
    assert (out / "sweep.svg").read_text().startswith("<svg")
    report = (out / "report.html").read_text()
    assert "<h2>Context-length sweep</h2>" in report and "<td>1024</td>" in report and "<td>2048</td>" in report
    assert "context 1024: pass rate 0.0%" in result.output
