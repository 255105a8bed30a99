"""The Ray backend's scorer actor, in a module of its own: a Ray worker imports the module that
defines an actor's class, and this one imports only the reward layer (the scorer, its sandbox
pool, the config and the task types), not torch or transformers. A scorer actor starts without
their seconds of imports and holds none of their memory: a scoring-only node of a cluster needs
no model libraries (tests/unit/pipeline/test_backends.py checks the
imports in a fresh interpreter)."""

from __future__ import annotations

import os
import shutil
import socket
from typing import Any

from tidal.config.schema import RewardConfig
from tidal.errors import SandboxUnavailableError
from tidal.reward.scorer import Scorer
from tidal.sandbox.image import ImageSpec, build_image, find_image
from tidal.types import Score, Task


def node_preflight(specs: list[ImageSpec], sandboxed: bool) -> dict[str, Any]:
    """What this node can score: whether it has bubblewrap, and every image in `specs` (the run's
    sandboxed tasks' images), built here from its spec when missing or built from another spec.
    Returns {host, pid, bwrap, built, problems}."""
    report: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "bwrap": shutil.which("bwrap"),
                              "built": [], "problems": []}
    if not sandboxed:
        return report
    if report["bwrap"] is None:
        report["problems"].append("no bubblewrap (bwrap) on PATH: the sandbox cannot start (apt-get install bubblewrap)")
    for spec in specs:
        try:
            if find_image(spec.name).spec.digest() == spec.digest():
                continue
        except SandboxUnavailableError:
            pass
        try:
            build_image(spec)
            report["built"].append(spec.name)
        except Exception as error:  # noqa: BLE001 - every reason an image cannot be built here is reported
            report["problems"].append(f"image {spec.name!r} cannot be built here from its spec ({error})")
    return report


class ScorerActor:
    """Scores (task, answer) pairs with its own `Scorer` and sandbox pool (a Ray actor)."""

    def __init__(self, config: RewardConfig) -> None:
        self.scorer = Scorer(config)

    def pid(self) -> int:
        return os.getpid()

    def preflight(self, specs: list[ImageSpec], sandboxed: bool) -> dict[str, Any]:
        return node_preflight(specs, sandboxed)

    def score_many(self, items: list[tuple[Task, str | bytes]]) -> tuple[int, list[Score]]:
        return os.getpid(), self.scorer.score_many(items)

    def close(self) -> None:
        self.scorer.close()
