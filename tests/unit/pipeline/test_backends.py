"""The backend registry: names, the config's choices, a clear error when Ray is missing, and what
a Ray scorer actor's process imports."""

from __future__ import annotations

import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from tidal.config.schema import PipelineConfig
from tidal.errors import UnknownNameError
from tidal.pipeline.backends import BACKENDS, get_backend, split_by_task
from tidal.pipeline.backends.local import LocalBackend
from tidal.types import Task


def test_an_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match=r"unknown pipeline backend 'spark'; known: local, ray"):
        get_backend("spark")
    assert isinstance(get_backend("local"), LocalBackend)


def test_the_config_offers_exactly_the_registered_backends() -> None:
    choices = typing.get_args(PipelineConfig.model_fields["backend"].annotation)
    assert sorted(choices) == sorted(BACKENDS)
    with pytest.raises(ValueError, match="'local' or 'ray'"):
        PipelineConfig(backend="spark")


def test_the_ray_backend_without_ray_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from tidal.pipeline.backends import BackendUnavailableError
    from tidal.pipeline.backends.ray import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` finds when Ray is not installed
    with pytest.raises(BackendUnavailableError, match=r"pip install 'tidal\[ray\]'.*pipeline.backend=local"):
        import_ray()


def test_scoring_shares_keep_a_tasks_answers_together() -> None:
    tasks = {name: Task(id=name, domain="math", prompt="?", verifier={"name": "exact_match", "answer": "1"}) for name in "abc"}
    items = [(tasks[name], str(i)) for i, name in enumerate("aabbbcab")]
    shares = split_by_task(items, 2)
    assert sorted(i for share in shares for i in share) == list(range(len(items)))
    for share in shares:
        assert share == sorted(share)
    owner = {items[i][0].id: n for n, share in enumerate(shares) for i in share}
    assert all(owner[items[i][0].id] == n for n, share in enumerate(shares) for i in share)
    assert len(shares) == 2 and split_by_task(items, 8) and len(split_by_task(items, 8)) == 3
    assert split_by_task([], 3) == []


def test_a_ray_scorer_actor_imports_no_model_libraries() -> None:
    """A Ray worker imports the module that defines its actor's class. The scorer actor's must not
    pull in torch or transformers (seconds of start-up and hundreds of MB in every scorer)."""
    from tidal.pipeline.backends.ray import ScorerActor

    probe = (
        f"import sys\nfrom {ScorerActor.__module__} import ScorerActor\n"
        "from tidal.config.schema import RewardConfig\nScorerActor(RewardConfig()).close()\n"
        "print(sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_ray_run_prints_no_core_worker_error(tmp_path: Path, ray_cluster: str) -> None:
    """`tidal quickstart` on Ray, in a process of its own (Ray logs each of its C++ errors once
    per process): stderr has no `E ... core_worker` line. There was one at every run: the rollout
    actors took the policy's object-store ref as a constructor argument, which Ray flags for a
    restartable actor (ray-project/ray#53727); they now get it with each call."""
    tidal = Path(sys.executable).parent / "tidal"
    done = subprocess.run(
        [str(tidal), "quickstart", "--smoke", "--out", str(tmp_path), "--name", "ray", "trainer.steps=2",
         "pipeline.mode=async", "pipeline.backend=ray", f"pipeline.ray_address={ray_cluster}"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if re.search(r"\bE \d+ \d+\] \w+\.cc:\d+", line)]
    assert errors == [], errors
    assert "constructor arguments in the object store" not in done.stderr
