"""`tidal train configs/smoke.yaml trainer.lora.enabled=true`, end to end, sync and async: the
adapter trains (KL to the base grows), checkpoints hold the adapter alone, the exported policy is a
plain Hugging Face folder equal to the warm-started base plus the last adapter, async rollout
samples from published (verified) versions, and a killed run resumes to the uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from tidal.cli import app
from tidal.pipeline import quickstart as qs
from tidal.pipeline import run as pipeline_run
from tidal.rollout.engine import EmbeddedEngine
from tidal.storage.run import RunFolder
from tidal.storage.store import existing_run_store
from tidal.trainer import lora

STEPS = 3
# Every sample trains (the smoke model's groups are mostly flat), and the entropy bonus gives the
# adapter a gradient even when every reward is 0.
OVERRIDES = ["trainer.lora.enabled=true", f"trainer.steps={STEPS}", "trainer.lr=1e-2", "algorithm.kl_coef=0.1",
             "algorithm.entropy_coef=0.05", "gate.drop_zero_variance=false", "gate.drop_truncated=false",
             "gate.drop_empty=false", "gate.max_repetition=1.0", "audit.watch.enabled=false"]


def _rl_rows(run: RunFolder) -> dict[int, dict]:
    return {m["step"]: m for m in run.read_metrics() if m.get("phase") == "rl"}


def _check_run(run: RunFolder) -> None:
    rows = _rl_rows(run)
    assert sorted(rows) == list(range(1, STEPS + 1))
    assert all(r["skipped"] == 0 and r["grad_norm"] > 0 for r in rows.values())
    assert rows[1]["kl"] == 0 and rows[STEPS]["kl"] > 0  # the policy starts as the base and leaves it
    last = run.checkpoints_dir / "rl" / f"step-{STEPS:06d}" / "model"
    assert lora.is_adapter_folder(last) and not (last / "model.safetensors").exists()
    policy = Path(run.read_json("summary.json")["run"]["policy"])
    assert policy == run.checkpoints_dir / "policy"
    exported = AutoModelForCausalLM.from_pretrained(policy)
    assert not lora.has_adapter(exported)
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(run.checkpoints_dir / "warm-start")
    adapted = PeftModel.from_pretrained(base, last)
    ids = torch.randint(0, exported.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(exported(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-5)
        with adapted.disable_adapter():
            assert (exported(input_ids=ids).logits - adapted(input_ids=ids).logits).abs().max() > 1e-4


def test_the_smoke_config_trains_an_adapter_from_the_cli(tmp_path: Path) -> None:
    config = Path(qs.find_config("smoke"))
    result = CliRunner().invoke(app, ["train", str(config), *OVERRIDES, f"run.dir={tmp_path}", "run.name=sync"])
    assert result.exit_code == 0, result.output
    _check_run(RunFolder.open(tmp_path / "sync"))


@pytest.mark.parametrize("publish", ["merged", "adapter"])
def test_the_async_pipeline_samples_from_the_published_adapter(tmp_path: Path, publish: str) -> None:
    overrides = [*OVERRIDES, "pipeline.mode=async", f"trainer.lora.publish={publish}", "algorithm.max_staleness=1"]
    qs.run_quickstart(qs.find_config("smoke"), overrides, tmp_path, "async")
    run = RunFolder.open(tmp_path / "async")
    _check_run(run)
    store = existing_run_store(run)
    assert store is not None
    versions = set(store.table(["weight_version"]).column("weight_version").to_pylist())
    # Batches after the first were sampled with published updates, each verified on loading
    # (a publication whose canary did not match would have failed the run).
    assert max(versions) >= 1


def test_a_killed_lora_run_resumes_to_the_uninterrupted_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    qs.run_quickstart(qs.find_config("smoke"), OVERRIDES, tmp_path, "whole")
    original, calls = EmbeddedEngine.update_weights, {"n": 0}

    def crash_on_second(self: EmbeddedEngine, state: object, version: int) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # after step 2's update, before its checkpoint
            raise RuntimeError("simulated kill")
        original(self, state, version)

    monkeypatch.setattr(EmbeddedEngine, "update_weights", crash_on_second)
    with pytest.raises(RuntimeError, match="simulated kill"):
        qs.run_quickstart(qs.find_config("smoke"), OVERRIDES, tmp_path, "killed")
    monkeypatch.setattr(EmbeddedEngine, "update_weights", original)
    killed = RunFolder.open(tmp_path / "killed")
    assert sorted(_rl_rows(killed)) == [1]
    pipeline_run.run_training(killed.path, [])

    whole, resumed = _rl_rows(RunFolder.open(tmp_path / "whole")), _rl_rows(killed)
    for step in whole:
        for key in ("loss", "grad_norm", "kl", "entropy", "reward/mean"):
            assert resumed[step][key] == whole[step][key], (step, key)
    from safetensors.torch import load_file

    last = f"step-{STEPS:06d}/model/{lora.ADAPTER_WEIGHTS}"
    a = load_file(str(tmp_path / "whole" / "checkpoints" / "rl" / last))
    b = load_file(str(killed.checkpoints_dir / "rl" / last))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
