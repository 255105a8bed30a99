from pathlib import Path

import pytest
import yaml

from tidal.config import load_config, save_config
from tidal.config.load import parse_override
from tidal.errors import ConfigError

SHIPPED = sorted((Path(__file__).resolve().parents[3] / "configs").glob("*.yaml"))
EVAL_CONFIGS = [p for p in SHIPPED if p.stem == "eval"]  # `tidal eval --config`, its own schema
CONFIGS = [p for p in SHIPPED if p not in EVAL_CONFIGS]


def test_configs_are_shipped() -> None:
    assert {p.stem for p in CONFIGS} >= {"quickstart", "smoke"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.tasks.domains


@pytest.mark.parametrize("path", EVAL_CONFIGS, ids=lambda p: p.name)
def test_shipped_eval_config_loads(path: Path) -> None:
    from tidal.eval.settings import load_eval_settings

    settings = load_eval_settings(path)
    raw = yaml.safe_load(path.read_text())
    for key, value in raw["checklist"].items():
        assert getattr(settings.checklist, key) == value, key


def test_every_error_reported_at_once_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "tasks": {"domains": {"math": {"weight": 1}}},
                "trainer": {"lr": -1, "stpes": 3},
                "rollout": {"temperature": 5},
            }
        )
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    problems = caught.value.problems
    assert "trainer.lr: must be > 0.0" in problems
    assert "rollout.temperature: must be <= 2.0" in problems
    assert "trainer.stpes: unknown field (did you mean 'steps'?)" in problems
    assert any(p.startswith("tasks.domains.math:") and "family" in p for p in problems)
    assert str(path) in str(caught.value)


def test_dotted_overrides_are_typed_and_validated() -> None:
    cfg = load_config(CONFIGS[0], ["trainer.lr=1e-5", "rollout.stop=['\\n\\n']", "run.progress=false"])
    assert cfg.trainer.lr == pytest.approx(1e-5)
    assert cfg.run.progress is False
    with pytest.raises(ConfigError, match="trainer.steps"):
        load_config(CONFIGS[0], ["trainer.steps=-3"])
    with pytest.raises(ConfigError, match="section.field=value"):
        parse_override("trainer.lr")


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_config(CONFIGS[0])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg


def _problems(tmp_path: Path, tasks: dict, **sections: dict) -> list[str]:
    path = tmp_path / "domains.yaml"
    path.write_text(yaml.safe_dump({"tasks": tasks, **sections}))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return caught.value.problems


def test_domain_errors_are_reported_at_load(tmp_path: Path) -> None:
    # A domain with no tasks to train on.
    problems = _problems(tmp_path, {"domains": {"code": {"family": "code", "n_train": 0}}})
    assert any(p.startswith("tasks.domains.code:") and "no train tasks" in p for p in problems)
    # Weights that sum to 0.
    problems = _problems(tmp_path, {"domains": {"code": {"family": "code", "weight": 0}}})
    assert any(p.startswith("tasks:") and "weights must not all be 0" in p for p in problems)
    # A verifier name unknown to a domain, and one domain's sub-rewards without the task's own.
    problems = _problems(tmp_path, {"domains": {
        "code": {"family": "code", "verifiers": [{"name": "task"}, {"name": "stlye", "weight": 0.1}]},
        "math": {"family": "math", "verifiers": [{"name": "static"}]},
    }})
    assert any(p.startswith("tasks.domains.code:") and "unknown verifier 'stlye'" in p and "static" in p for p in problems)
    assert any(p.startswith("tasks.domains.math:") and "must include `task`" in p for p in problems)
    # A normaliser or curriculum that cannot work.
    problems = _problems(tmp_path, {"domains": {"code": {"family": "code", "normaliser": {"kind": "per_reward"}}}})
    assert any("per_reward needs `verifiers`" in p for p in problems)
    problems = _problems(tmp_path, {"domains": {"code": {"family": "code", "curriculum": {"band_start": [0.9, 0.1]}}}})
    assert any(p.startswith("tasks.domains.code.curriculum") for p in problems)
    # Replay needs its loss weight.
    problems = _problems(tmp_path, {"domains": {"code": {"family": "code"}}}, replay={"source": "base"})
    assert any("replay_weight" in p for p in problems)


def test_domain_features_load_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "joint.yaml"
    path.write_text(yaml.safe_dump({
        "tasks": {"oversample": 2.0, "domains": {
            "code": {"family": "code", "weight": 2, "priority": 3, "normaliser": {"kind": "per_reward"},
                     "verifiers": [{"name": "task", "weight": 0.8}, {"name": "static", "weight": 0.2}],
                     "curriculum": {"band_start": [0.2, 0.9]}},
            "math": {"family": "math", "normaliser": {"kind": "rank", "window": 64}}}},
        "algorithm": {"replay_weight": 0.1}, "replay": {"source": "trajectories"},
    }))
    cfg = load_config(path)
    code = cfg.tasks.domains["code"]
    assert [v.name for v in code.verifiers] == ["task", "static"] and code.curriculum is not None
    assert cfg.tasks.domains["math"].normaliser.window == 64 and cfg.tasks.domains["math"].curriculum is None
