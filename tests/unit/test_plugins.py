"""Plugins (tidal.plugins): `imports:` in a config, `--import` on the command line, installed entry
points, any identifier as a domain, and the advantage/loss registries users add to.

Every plugin here is a real file (or a real installed distribution: a .dist-info with
entry_points.txt on sys.path, in a fresh interpreter) imported the way a user's would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tidal.algos import get_advantage, get_loss, known_losses
from tidal.config import load_config
from tidal.errors import ConfigError
from tidal.plugins import PluginError, import_plugin, take_import_options
from tidal.reward import get_verifier, known_verifiers
from tidal.types import Task

SRC = str(Path(__file__).resolve().parents[2] / "src")


def registries() -> list[dict]:
    """The registries a plugin adds to (process-wide), to put back after a test; the built-ins
    loaded first, so what is put back holds them."""
    import tidal.tasks.families  # noqa: F401 - registers the built-in families
    from tidal.algos import advantages, known_advantages, losses
    from tidal.reward import base
    from tidal.tasks.families import registry

    known_verifiers(), known_losses(), known_advantages(), registry.known_families()

    return [losses.LOSSES, losses.LOSS_INPUTS, advantages.ADVANTAGES, advantages.GROUP_ADVANTAGES,
            base._VERIFIERS, registry.FAMILIES]


@pytest.fixture(autouse=True)
def _own_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # import_plugin records its plugins in TIDAL_IMPORTS for child processes, and the plugins
    # register names: keep both out of the rest of the session.
    monkeypatch.delenv("TIDAL_IMPORTS", raising=False)
    saved = [dict(table) for table in registries()]
    yield
    for table, before in zip(registries(), saved, strict=True):
        table.clear()
        table.update(before)


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


PLUGIN = '''\
import torch

from tidal.algos import advantage, loss, ppo_clip_loss
from tidal.reward import verifier
from tidal.types import Outcome, Score


@verifier("{verifier}")
def exact_upper(task, answer, ctx):
    """The answer, upper-cased, is the task's `answer`."""
    ok = answer.strip().upper() == task.verifier.args["answer"]
    return Score(float(ok), Outcome.PASSED if ok else Outcome.FAILED)


@advantage("{advantage}")
def sign(rewards, mask):
    mean = (rewards * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return torch.sign(rewards - mean) * mask


@loss("{loss}")
def halved(*args, **kwargs):
    value, metrics = ppo_clip_loss(*args, **kwargs)
    return value / 2, metrics
'''


def _config(tmp_path: Path, **extra: object) -> Path:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("")
    data = {"tasks": {"domains": {"sql": {"sources": [str(tasks)]}}}, **extra}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_config_imports_a_file_beside_it_and_its_names_pass_validation(tmp_path: Path) -> None:
    names = {"verifier": _name("upper"), "advantage": _name("sign"), "loss": _name("halved")}
    (tmp_path / "my_plugin.py").write_text(PLUGIN.format(**names))
    elsewhere = tmp_path / "run_from_here"
    elsewhere.mkdir()
    path = _config(tmp_path, imports=["my_plugin.py"],
                   algorithm={"advantage": names["advantage"], "loss": names["loss"]})
    cwd = os.getcwd()
    os.chdir(elsewhere)  # the relative file is found beside the config, not in the working directory
    try:
        cfg = load_config(path)
    finally:
        os.chdir(cwd)
    assert cfg.imports == [str((tmp_path / "my_plugin.py").resolve())]
    assert names["verifier"] in known_verifiers() and names["loss"] in known_losses()
    import torch

    advantages = get_advantage(names["advantage"])(torch.tensor([[1.0, 0.0, 0.0]]), torch.ones(1, 3, dtype=torch.bool))
    assert advantages.tolist() == [[1.0, -1.0, -1.0]]
    task = Task.model_validate({"id": "t", "domain": "sql", "prompt": "say hi",
                                "verifier": {"name": names["verifier"], "answer": "HI"}})
    assert get_verifier(names["verifier"])(task, " hi ", None).value == 1.0  # type: ignore[arg-type]
    # the saved (absolute) imports load again from anywhere
    again = load_config(None, [f"imports={json.dumps(cfg.imports)}", f"tasks.domains.sql.sources=[{tmp_path / 'tasks.jsonl'}]",
                               f"algorithm.loss={names['loss']}"])
    assert again.algorithm.loss == names["loss"]


def test_unknown_loss_without_the_plugin_says_how_to_load_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(_config(tmp_path, algorithm={"loss": "nowhere_loss"}))
    assert "unknown policy loss 'nowhere_loss'" in str(raised.value) and "imports" in str(raised.value)


def test_a_plugin_that_raises_on_import_is_reported_with_file_and_line(tmp_path: Path) -> None:
    plugin = tmp_path / "broken.py"
    plugin.write_text("import os\n\nraise RuntimeError('no database configured')\n")
    with pytest.raises(ConfigError) as raised:
        load_config(_config(tmp_path, imports=["broken.py"]))
    message = str(raised.value)
    assert f"{plugin.resolve()}:3" in message and "RuntimeError: no database configured" in message
    assert "imports.0" in message


def test_a_syntax_error_and_a_missing_plugin_are_reported(tmp_path: Path) -> None:
    plugin = tmp_path / "typo.py"
    plugin.write_text("def reward(task, answer)\n    return 1.0\n")
    with pytest.raises(PluginError, match=rf"{plugin.resolve()}:1"):
        import_plugin(str(plugin))
    with pytest.raises(PluginError, match="does not exist"):
        import_plugin(str(tmp_path / "absent.py"))
    with pytest.raises(PluginError, match="not importable"):
        import_plugin("no_such_tidal_plugin_module")
    with pytest.raises(PluginError, match="neither a dotted module name"):
        import_plugin("not a-module")


def test_an_error_inside_a_module_plugin_names_the_line_in_that_module(tmp_path: Path) -> None:
    package = tmp_path / _name("pkg")
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "inner.py").write_text("x = 1\ny = {}['missing']\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(PluginError, match=rf"{package / 'inner.py'}:2"):
            import_plugin(f"{package.name}.inner")
    finally:
        sys.path.remove(str(tmp_path))


def test_import_options_are_taken_from_anywhere_on_the_line() -> None:
    rest, specs = take_import_options(["train", "--import", "a.py", "cfg.yaml", "--import=pkg.mod", "--", "--import", "x"])
    assert rest == ["train", "cfg.yaml", "--", "--import", "x"] and specs == ["a.py", "pkg.mod"]
    with pytest.raises(PluginError):
        take_import_options(["eval", "--import"])


def test_any_identifier_is_a_domain_and_others_are_refused() -> None:
    base = {"id": "t", "prompt": "p", "verifier": {"name": "exact_match", "answer": "1"}}
    assert Task.model_validate({**base, "domain": "finance_v2"}).domain == "finance_v2"
    for bad in ("my-domain", "", "9lives", "sql domain"):
        with pytest.raises(ValueError, match="is not a domain name: an identifier"):
            Task.model_validate({**base, "domain": bad})


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("TIDAL_IMPORTS", None)
    return subprocess.run([sys.executable, "-m", "tidal.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_cli_import_option_makes_a_plugin_verifier_and_domain_known(tmp_path: Path) -> None:
    name = _name("upper")
    (tmp_path / "my_plugin.py").write_text(PLUGIN.format(verifier=name, advantage=_name("a"), loss=_name("l")))
    task = {"id": "q1", "domain": "sql", "prompt": "say hi", "verifier": {"name": name, "answer": "HI"}}
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    without = _cli("tasks", "validate", "tasks.jsonl", cwd=tmp_path)
    assert without.returncode != 0 and f"unknown verifier {name!r}" in without.stderr + without.stdout
    after = _cli("tasks", "validate", "tasks.jsonl", "--import", "my_plugin.py", cwd=tmp_path)
    assert after.returncode == 0, after.stderr
    assert "ok: 1 tasks" in after.stdout
    before = _cli("--import", "my_plugin.py", "tasks", "validate", "tasks.jsonl", cwd=tmp_path)
    assert before.returncode == 0, before.stderr
    broken = tmp_path / "broken.py"
    broken.write_text("\n\nimport not_installed_anywhere\n")
    failed = _cli("tasks", "validate", "tasks.jsonl", "--import", "broken.py", cwd=tmp_path)
    assert failed.returncode == 2 and f"{broken}:3" in failed.stderr


ENTRY_POINTS = """\
[tidal.verifiers]
demo_contains = tidal_demo_plugin:contains
demo_module = tidal_demo_plugin.verifiers

[tidal.families]
demo_family = tidal_demo_plugin:make

[tidal.advantages]
demo_centred = tidal_demo_plugin:centred

[tidal.losses]
demo_loss = tidal_demo_plugin:demo_loss
"""

PACKAGE = '''\
import random

from tidal.algos import ppo_clip_loss
from tidal.tasks.families.registry import Draft


def contains(task, answer):
    return float(task.verifier.args["answer"] in answer)


def make(rng: random.Random, difficulty: int) -> Draft:
    a = rng.randint(1, 10 ** difficulty)
    return Draft(key=str(a), prompt=f"echo {a}", reference=str(a), verifier={"name": "exact_match", "answer": str(a)})


make.domain = "echo"


def centred(rewards, mask):
    mean = (rewards * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return (rewards - mean) * mask


def demo_loss(*args, **kwargs):
    return ppo_clip_loss(*args, **kwargs)
'''

VERIFIERS = '''\
from tidal.reward import verifier
from tidal.types import Outcome, Score


@verifier("demo_decorated")
def decorated(task, answer, ctx):
    return Score(1.0, Outcome.PASSED)
'''

CHECK = '''\
import sys
sys.path.insert(0, sys.argv[1])
import torch
from tidal.algos import get_advantage, get_loss
from tidal.reward.registry import get_verifier, needs_sandbox
from tidal.tasks.families.registry import generate_tasks, get_family
print("verifiers", callable(get_verifier("demo_contains")), needs_sandbox("demo_contains"),
      callable(get_verifier("demo_decorated")))
print("family", get_family("demo_family").domain, generate_tasks("demo_family", 3, "train", seed=1)[0].domain)
print("advantage", get_advantage("demo_centred")(torch.tensor([[1.0, 0.0]]), torch.ones(1, 2, dtype=torch.bool)).tolist())
print("loss", get_loss("demo_loss").__name__)
'''


def test_entry_points_of_an_installed_package_are_loaded(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "tidal_demo_plugin").mkdir(parents=True)
    (site / "tidal_demo_plugin" / "__init__.py").write_text(PACKAGE)
    (site / "tidal_demo_plugin" / "verifiers.py").write_text(VERIFIERS)
    dist = site / "tidal_demo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tidal-demo-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    (dist / "top_level.txt").write_text("tidal_demo_plugin\n")
    env = {**os.environ, "PYTHONPATH": SRC}
    result = subprocess.run([sys.executable, "-c", CHECK, str(site)], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "verifiers True True True"  # the two-argument function runs in the sandbox
    assert lines[1] == "family echo echo"
    assert lines[2] == "advantage [[0.5, -0.5]]"
    assert lines[3] == "loss demo_loss"


def test_a_broken_entry_point_names_its_package_and_line(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "tidal_bad_plugin").mkdir(parents=True)
    (site / "tidal_bad_plugin" / "__init__.py").write_text("\n1 / 0\n")
    dist = site / "tidal_bad_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tidal-bad-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[tidal.losses]\nbad = tidal_bad_plugin:loss\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(site)!r})
        from tidal.algos import get_loss
        get_loss("ppo_clip")
    """)
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": SRC},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "tidal-bad-plugin" in result.stderr and f"{site / 'tidal_bad_plugin' / '__init__.py'}:2" in result.stderr
    assert "ZeroDivisionError" in result.stderr


def test_registering_a_taken_name_is_refused() -> None:
    from tidal.algos import register_advantage, register_loss

    with pytest.raises(ValueError, match="already registered"):
        register_loss("ppo_clip", lambda *a, **k: None)
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo", lambda r, m: r)
    with pytest.raises(ValueError, match="trainer supplies"):
        register_loss(_name("l"), lambda *a, **k: None, inputs=("values",))
    assert get_loss("ppo_clip") is not None


def test_a_child_process_imports_what_its_parent_imported(tmp_path: Path) -> None:
    name = _name("upper")
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(PLUGIN.format(verifier=name, advantage=_name("a"), loss=_name("l")))
    code = f"from tidal.reward.registry import known_verifiers; print({name!r} in known_verifiers())"
    env = {**os.environ, "PYTHONPATH": SRC, "TIDAL_IMPORTS": str(plugin)}
    inherited = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert inherited.stdout.strip() == "True", inherited.stderr
    env.pop("TIDAL_IMPORTS")
    alone = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert alone.stdout.strip() == "False", alone.stderr
