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
