"""Plain reward functions (`@reward_function`, reward/function.py): run in the real bubblewrap
sandbox by default and in process only when asked; what the user's code gets wrong is an
infra_error naming its file and line, never a 0."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidal.errors import SandboxUnavailableError
from tidal.plugins import import_plugin
from tidal.reward import ScoringContext, get_verifier
from tidal.reward.function import USER_ERROR
from tidal.reward.registry import needs_sandbox
from tidal.sandbox import get_backend
from tidal.types import Limits, Outcome, Task

REWARDS = '''\
import os

from tidal.reward import reward_function
from tidal.types import Outcome, Score


@reward_function("{p}_match")
def match(task, answer):
    """1 when the answer holds the expected number, 0.5 when it holds a number at all."""
    expected = task.verifier.args["answer"]
    if expected in answer.split():
        return 1.0
    return 0.5 if any(word.isdigit() for word in answer.split()) else 0.0


@reward_function("{p}_score")
def scored(task, answer):
    return Score(0.25, Outcome.FAILED, {{"length": 0.25}}, "a quarter", {{"domain": task.domain}})


@reward_function("{p}_broken")
def broken(task, answer):
    numbers = {{}}
    return numbers[answer]  # BROKEN LINE


@reward_function("{p}_out_of_range")
def too_big(task, answer):
    return 2.0


@reward_function("{p}_wrong_type")
def wrong(task, answer):
    return "yes"


@reward_function("{p}_where")
def where(task, answer):
    return float(os.path.exists({host!r}))


@reward_function("{p}_image")
def image(task, answer):
    import pytest  # the default image's package

    return float(bool(pytest.__version__))


@reward_function("{p}_hang")
def hang(task, answer):
    while True:
        pass


@reward_function("{p}_local", in_process=True)
def local(task, answer):
    return float(os.path.exists({host!r}))


@reward_function("{p}_local_broken", in_process=True)
def local_broken(task, answer):
    raise ValueError("no such table")  # LOCAL LINE
'''


@pytest.fixture(scope="module")
def sandboxed() -> ScoringContext:
    try:
        backend = get_backend("bwrap")
        backend.run(["/bin/true"], {}, Limits(timeout_s=20))
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")
    return ScoringContext(backend)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("rewards")
    prefix = f"rf{uuid.uuid4().hex[:6]}"
    path = folder / "rewards.py"
    path.write_text(REWARDS.format(p=prefix, host=str(path)))
    from tidal.reward import base, known_verifiers

    known_verifiers()  # the built-ins loaded first, so what is put back holds them
    saved = dict(base._VERIFIERS)
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("TIDAL_IMPORTS", raising=False)  # what import_plugin records stays in this module
        import_plugin(str(path))
        yield prefix, path.resolve()
    base._VERIFIERS.clear()  # and so do the verifiers it registered
    base._VERIFIERS.update(saved)


def _line(path: Path, marker: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if marker in line)


def _task(verifier: str, **limits: float) -> Task:
    return Task.model_validate({"id": "t1", "domain": "finance", "prompt": "how much?",
                                "verifier": {"name": verifier, "answer": "42"}, "limits": limits or {}})


def test_a_reward_function_scores_in_the_sandbox(plugin: tuple[str, Path], sandboxed: ScoringContext) -> None:
    prefix, _ = plugin
    name = f"{prefix}_match"
    assert needs_sandbox(name)
    verify = get_verifier(name)
    right = verify(_task(name), "it is 42", sandboxed)
    assert (right.value, right.outcome) == (1.0, Outcome.PASSED)
    partial = verify(_task(name), "it is 41", sandboxed)
    assert (partial.value, partial.outcome) == (0.5, Outcome.FAILED)
    assert verify(_task(name), "", sandboxed).outcome is Outcome.FAILED  # empty: not even sent in
    score = get_verifier(f"{prefix}_score")(_task(f"{prefix}_score"), "x", sandboxed)
    assert (score.value, score.components, score.detail, score.info) == (0.25, {"length": 0.25}, "a quarter",
                                                                       {"domain": "finance"})


def test_the_sandbox_does_not_see_the_host(plugin: tuple[str, Path], sandboxed: ScoringContext) -> None:
    prefix, _ = plugin
    inside = get_verifier(f"{prefix}_where")(_task(f"{prefix}_where"), "x", sandboxed)
    assert inside.value == 0.0 and inside.outcome is Outcome.FAILED  # the plugin's own host path is not there
    assert get_verifier(f"{prefix}_image")(_task(f"{prefix}_image"), "x", sandboxed).value == 1.0  # image packages
    local = get_verifier(f"{prefix}_local")(_task(f"{prefix}_local"), "x", sandboxed)
    assert local.value == 1.0 and not needs_sandbox(f"{prefix}_local")  # the opt-in runs on the host


def test_user_errors_name_file_and_line_and_are_never_a_zero(plugin: tuple[str, Path], sandboxed: ScoringContext) -> None:
    prefix, path = plugin
    broken = get_verifier(f"{prefix}_broken")(_task(f"{prefix}_broken"), "x", sandboxed)
    assert broken.outcome is Outcome.INFRA_ERROR and broken.info[USER_ERROR]
    assert f"raised KeyError at {path}:{_line(path, 'BROKEN LINE')}" in broken.detail
    assert f'File "{path}", line {_line(path, "BROKEN LINE")}' in broken.info["traceback"]
    local = get_verifier(f"{prefix}_local_broken")(_task(f"{prefix}_local_broken"), "x", sandboxed)
    assert local.outcome is Outcome.INFRA_ERROR and f"{path}:{_line(path, 'LOCAL LINE')}" in local.detail and "no such table" in local.detail
    for suffix, words in (("out_of_range", "outside [0, 1]"), ("wrong_type", "not a float or a Score")):
        score = get_verifier(f"{prefix}_{suffix}")(_task(f"{prefix}_{suffix}"), "x", sandboxed)
        assert score.outcome is Outcome.INFRA_ERROR and words in score.detail, score.detail


def test_a_hanging_reward_function_is_stopped_at_the_task_limit(plugin: tuple[str, Path],
                                                                sandboxed: ScoringContext) -> None:
    prefix, _ = plugin
    score = get_verifier(f"{prefix}_hang")(_task(f"{prefix}_hang", timeout_s=1.0), "x", sandboxed)
    assert score.outcome is Outcome.INFRA_ERROR and "did not finish in the sandbox (timeout" in score.detail


def test_a_function_without_a_source_file_must_opt_in(tmp_path: Path) -> None:
    from tidal.reward.function import register_reward_function

    namespace: dict[str, object] = {}
    exec("def f(task, answer):\n    return 1.0\n", namespace)  # noqa: S102 - a function with no file
    with pytest.raises(ValueError, match="no source file"):
        register_reward_function(f"nofile_{uuid.uuid4().hex[:6]}", namespace["f"])  # type: ignore[arg-type]
