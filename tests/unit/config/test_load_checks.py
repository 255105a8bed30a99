"""What a config is checked for at load, before any model, task or run folder exists: algorithm
names, the trajectory store's protocol and its package, the overlong penalty's range, and the
config's own task files."""

from pathlib import Path

import fsspec
import pytest
import yaml

from tidal.config import load_config
from tidal.errors import ConfigError

SMOKE = Path(__file__).resolve().parents[3] / "configs" / "smoke.yaml"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.advantage=grpoo", "unknown advantage estimator 'grpoo'; known: dr_grpo, gae, grpo"),
        ("algorithm.loss=ppo", "unknown policy loss 'ppo'; known: cispo, decoupled_ppo, gspo, ppo_clip, tis_pg"),
        ("reward.overlong_buffer=16", "reward.overlong_buffer=16 must be below rollout.max_new_tokens=16"),
        ("run.trajectory_store=nosuchproto://bucket/runs", "unknown protocol 'nosuchproto'"),
    ],
)
def test_bad_names_fail_at_load(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(SMOKE, [override])
    assert message in str(caught.value)


def test_a_protocol_whose_package_is_missing_fails_at_load() -> None:
    # s3 is a protocol fsspec knows by name; its implementation lives in s3fs
    try:
        fsspec.get_filesystem_class("s3")
    except ImportError:
        pass
    else:
        pytest.skip("s3fs is installed here")
    with pytest.raises(ConfigError) as caught:
        load_config(SMOKE, ["run.trajectory_store=s3://bucket/runs"])
    assert "protocol 's3' needs a package that is not installed" in str(caught.value)


def test_known_names_and_an_installed_protocol_load() -> None:
    cfg = load_config(SMOKE, ["algorithm.advantage=rloo", "algorithm.loss=tis_pg", "run.trajectory_store=memory://x",
                              "reward.overlong_buffer=8"])
    assert (cfg.algorithm.advantage, cfg.algorithm.loss, cfg.reward.overlong_buffer) == ("rloo", "tis_pg", 8)


def test_task_files_beside_the_config_are_found_from_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "mine.jsonl").write_text("")
    config = folder / "run.yaml"
    config.write_text(yaml.safe_dump({"tasks": {"domains": {
        "mine": {"sources": ["data/mine.jsonl", "elsewhere.jsonl"]},
    }}}))
    monkeypatch.chdir(tmp_path)  # neither path exists from here
    sources = load_config(config).tasks.domains["mine"].sources
    # the one beside the config becomes absolute; the other stays as written (a later error names it)
    assert sources == [str((folder / "data" / "mine.jsonl").resolve()), "elsewhere.jsonl"]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.jsonl").write_text("")
    assert load_config(config).tasks.domains["mine"].sources[0] == "data/mine.jsonl"  # the working directory wins


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.parallel.strategy=zero3"], "trainer.parallel.strategy"),
        (["trainer.parallel.world_size=2"], "world_size=2 needs a strategy (ddp or fsdp2)"),
        (["trainer.parallel.strategy=ddp", "trainer.parallel.world_size=0"], "trainer.parallel.world_size"),
        (["trainer.parallel.strategy=fsdp2", "trainer.parallel.world_size=512"],
         "world_size=512: this machine has"),
        (["trainer.parallel.strategy=ddp", "trainer.parallel.param_dtype=bf16"], "only apply to strategy fsdp2"),
        (["trainer.parallel.strategy=ddp", "algorithm.advantage=gae"], "trains a value model, which runs in one"),
    ],
)
def test_impossible_trainer_ranks_fail_at_load(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(SMOKE, overrides)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.advantage=gae"], "trainer.lora with algorithm.advantage 'gae' is not supported"),
        (["trainer.lora.target_modules=[]"], "target_modules is empty"),
    ],
)
def test_lora_configs_that_cannot_work_fail_at_load(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(SMOKE, ["trainer.lora.enabled=true", *overrides])
    assert message in str(caught.value)
    load_config(SMOKE, ["trainer.lora.enabled=true", "trainer.lora.publish=adapter"])
    load_config(SMOKE, ["trainer.lora.enabled=true", "trainer.parallel.strategy=fsdp2", "trainer.parallel.world_size=2"])


def test_bad_engine_settings_fail_at_load_all_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(SMOKE, ["rollout.kv_block_size=0", "rollout.prefill_chunk=0", "rollout.engine_dtype=fp8"])
    message = str(caught.value)
    assert "rollout.kv_block_size" in message and "rollout.prefill_chunk" in message and "rollout.engine_dtype" in message
    config = load_config(SMOKE, ["rollout.kv_blocks=64", "rollout.prefix_cache=false", "rollout.engine_dtype=auto"])
    assert (config.rollout.kv_blocks, config.rollout.prefix_cache, config.rollout.engine_dtype) == (64, False, "auto")


HTTP = ["rollout.engine=http", "rollout.http.base_url=http://gpu-node:8000/v1/", "rollout.http.model=policy"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.engine=http"], "rollout.http is not set"),
        ([*HTTP, "rollout.http.base_url=gpu-node:8000"], "is not an http(s) URL"),
        ([*HTTP, "rollout.http.api_key_env=TIDAL_TEST_UNSET_KEY"], "TIDAL_TEST_UNSET_KEY is not set"),
        ([*HTTP, "rollout.http.max_concurrency=0"], "max_concurrency"),
        ([*HTTP, "rollout.http.weight_transfer=ftp"], "weight_transfer"),
        ([*HTTP, "pipeline.mode=async", "pipeline.backend=ray"], "async with pipeline.backend=local"),
        ([*HTTP, "rollout.speculative.k=4"], "rollout.speculative applies to the embedded engine"),
        ([*HTTP, "merge.weight=0.5"], "merge.weight < 1"),
    ],
)
def test_http_engine_configs_that_cannot_work_fail_at_load(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(SMOKE, overrides)
    assert message in str(caught.value)


def test_an_http_engine_config_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDAL_TEST_KEY", "secret")
    config = load_config(SMOKE, [*HTTP, "rollout.http.api_key_env=TIDAL_TEST_KEY"])
    assert config.rollout.http is not None and config.rollout.http.base_url == "http://gpu-node:8000/v1"
