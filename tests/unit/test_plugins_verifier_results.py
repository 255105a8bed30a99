"""What a plugin's `@verifier` may return (a float, a bool or a `Score`) and what becomes of the
rest: an `infra_error` the gate drops, naming the function, its file and line and the value,
never a traceback (`tidal score --import plugin.py` on a verifier returning 0.75 used to end in
`AttributeError: 'float' object has no attribute 'outcome'` in the gate)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidal.config.schema import GateConfig
from tidal.gate import gate_single
from tidal.plugins import import_plugin
from tidal.reward import get_verifier
from tidal.reward.registry import get_batch_verifier, known_verifiers
from tidal.reward.scorer import Scorer
from tidal.types import Completion, Episode, Outcome, Score, Task

SRC = str(Path(__file__).resolve().parents[2] / "src")

PLUGIN = '''\
import math

from tidal.reward import verifier
from tidal.types import Outcome, Score


@verifier("{p}_float")
def as_float(task, answer, ctx):
    return 0.75


@verifier("{p}_bool")
def as_bool(task, answer, ctx):
    return answer.strip() == "yes"


@verifier("{p}_score")
def as_score(task, answer, ctx):
    return Score(0.5, Outcome.FAILED, {{}}, "half")


@verifier("{p}_dict")
def as_dict(task, answer, ctx):
    return {{"score": 1}}


@verifier("{p}_none")
def as_none(task, answer, ctx):
    pass


@verifier("{p}_nan")
def as_nan(task, answer, ctx):
    return math.nan


@verifier("{p}_big")
def as_big(task, answer, ctx):
    return 3


@verifier("{p}_raises")
def raises(task, answer, ctx):
    return {{}}["missing"]


def _batch(task, answers, ctx):
    return [1.0, "no"][: len(answers)]


@verifier("{p}_batch", batch=_batch)
def single(task, answer, ctx):
    return 1.0
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    from tidal.reward import base

    monkeypatch.delenv("TIDAL_IMPORTS", raising=False)
    known_verifiers()  # the built-ins first, so what is put back holds them
    saved = dict(base._VERIFIERS)
    prefix = f"p{uuid.uuid4().hex[:8]}"
    path = tmp_path / "plugin.py"
    path.write_text(PLUGIN.format(p=prefix))
    import_plugin(str(path))
    yield prefix, path
    base._VERIFIERS.clear()
    base._VERIFIERS.update(saved)


def _task(verifier: str) -> Task:
    return Task.model_validate({"id": "q1", "domain": "text", "prompt": "say yes", "verifier": {"name": verifier}})


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_float_a_bool_or_a_score_is_the_reward(plugin: tuple[str, Path]) -> None:
    prefix, _ = plugin
    half = get_verifier(f"{prefix}_float")(_task(f"{prefix}_float"), "x", None)  # type: ignore[arg-type]
    assert (half.value, half.outcome) == (0.75, Outcome.FAILED)  # a number passes at 1, like a reward function
    yes = get_verifier(f"{prefix}_bool")(_task(f"{prefix}_bool"), "yes", None)  # type: ignore[arg-type]
    no = get_verifier(f"{prefix}_bool")(_task(f"{prefix}_bool"), "no", None)  # type: ignore[arg-type]
    assert (yes.value, yes.outcome, no.value, no.outcome) == (1.0, Outcome.PASSED, 0.0, Outcome.FAILED)
    score = get_verifier(f"{prefix}_score")(_task(f"{prefix}_score"), "x", None)  # type: ignore[arg-type]
    assert score == Score(0.5, Outcome.FAILED, {}, "half")


@pytest.mark.parametrize(("suffix", "returned"), [
    ("dict", "returned a dict {'score': 1}, not a float, a bool or a Score"),
    ("none", "returned a NoneType None"),
    ("nan", "returned nan, not a number in [0, 1]"),
    ("big", "returned 3, not a number in [0, 1]"),
    ("raises", "raised KeyError at"),
])
def test_anything_else_is_an_infra_error_naming_the_function_file_and_line(
        plugin: tuple[str, Path], suffix: str, returned: str) -> None:
    prefix, path = plugin
    task = _task(f"{prefix}_{suffix}")
    score = get_verifier(task.verifier.name)(task, "x", None)  # type: ignore[arg-type]
    assert score.outcome is Outcome.INFRA_ERROR and score.value == 0.0
    function = {"dict": "as_dict", "none": "as_none", "nan": "as_nan", "big": "as_big", "raises": "raises"}[suffix]
    assert f"verifier {task.verifier.name} (function {function} at {path}:{_line(path, f'def {function}(')})" \
        in score.detail
    assert returned in score.detail
    if suffix == "raises":  # where it raised, too
        assert f"{path}:{_line(path, 'return {}[')}" in score.detail
    episode = Episode("e", task.id, "text", "g", Completion([1], [2], [0.0], "x", "stop", 0), score=score)
    assert gate_single(episode, GateConfig(), max_new_tokens=16) == (False, "infra_error")


def test_a_batch_form_is_checked_answer_by_answer(plugin: tuple[str, Path]) -> None:
    prefix, _ = plugin
    task = _task(f"{prefix}_batch")
    batch = get_batch_verifier(task.verifier.name)
    assert batch is not None
    good, bad = batch(task, ["a", "b"], None)  # type: ignore[arg-type]
    assert good.outcome is Outcome.PASSED and bad.outcome is Outcome.INFRA_ERROR and "'no'" in bad.detail
    scores = Scorer().score_many([(task, "a"), (task, "b")])
    assert [s.outcome for s in scores] == [Outcome.PASSED, Outcome.INFRA_ERROR]


def test_tidal_score_reports_a_bad_return_value_without_a_traceback(tmp_path: Path) -> None:
    prefix = f"p{uuid.uuid4().hex[:8]}"
    (tmp_path / "plugin.py").write_text(PLUGIN.format(p=prefix))
    tasks = [{"id": f"q_{s}", "domain": "text", "prompt": "say yes", "verifier": {"name": f"{prefix}_{s}"}}
             for s in ("float", "dict")]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (tmp_path / "answer.txt").write_text("yes\n")
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("TIDAL_IMPORTS", None)

    def score(task_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tidal.cli", "score", "tasks.jsonl", "--task", task_id,
                               "--answer", "answer.txt", "--import", "plugin.py"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)

    half, broken = score("q_float"), score("q_dict")
    assert half.returncode == 0, half.stderr
    assert "reward 0.750" in half.stdout
    assert "Traceback" not in broken.stdout + broken.stderr
    assert "infra_error" in broken.stdout and f"plugin.py:{_line(tmp_path / 'plugin.py', 'def as_dict(')}" \
        in broken.stdout
