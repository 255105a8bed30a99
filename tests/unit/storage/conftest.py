"""Fixtures for the trajectory store tests: real episodes, real filesystems (a folder, a file://
URL, fsspec's memory://, and a 1 MiB tmpfs when running as root)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pytest

from tidal.types import Completion, Episode, Outcome, Score, Task

Make = Callable[..., list[Episode]]


def episodes_of_step(run: str, step: int, groups: int = 2, samples: int = 3, drop: set[int] | None = None) -> list[Episode]:
    """`groups` x `samples` scored episodes of RL step `step`, ids as the loop makes them; the
    sample indexes in `drop` are dropped by the gate."""
    out = []
    for g in range(groups):
        group_id = f"{run}/step-{step:06d}/g{g:03d}"
        for s in range(samples):
            keep = s not in (drop or set())
            completion = Completion(
                prompt_ids=[5, 6, 7 + g],
                token_ids=[10 + s, 11, 2],
                logprobs=[-0.123456789012345, -1.5 - s, -0.000001],
                text=f"answer {g}.{s}",
                finish_reason="stop",
                weight_version=step,
            )
            out.append(
                Episode(
                    id=f"{group_id}/s{s:02d}",
                    task_id=f"math-{g}",
                    domain="math",
                    group_id=group_id,
                    completion=completion,
                    score=Score(float(s % 2), Outcome.PASSED if s % 2 else Outcome.FAILED, {"exact": float(s % 2), "format": 1.0}, "detail", {"tests": [s]}),
                    keep=keep,
                    drop_reason="" if keep else "degenerate",
                    advantage=0.25 * s,
                    timings={"score_s": 0.01 * s},
                )
            )
    return out


def task(g: int) -> Task:
    return Task(id=f"math-{g}", domain="math", prompt=f"What is {g} + 1?", verifier={"name": "exact_match", "answer": str(g + 1)})


@pytest.fixture(params=["folder", "file_url", "memory"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store URL on each kind of filesystem the store must support."""
    if request.param == "folder":
        yield str(tmp_path / "store")
    elif request.param == "file_url":
        yield f"file://{tmp_path / 'store'}"
    else:
        root = f"/tidal-test-{uuid.uuid4().hex}"
        yield f"memory://{root}"
        fs = fsspec.filesystem("memory")
        if fs.exists(root):
            fs.rm(root, recursive=True)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)], capture_output=True, text=True, check=False)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody can write into: a read-only tmpfs as root (root ignores mode bits), else
    a folder without write permission."""
    folder = tmp_path / "readonly"
    folder.mkdir()
    if os.geteuid() == 0:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], capture_output=True, text=True, check=False)
        if done.returncode:
            pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.strip()}")
        try:
            yield folder
        finally:
            subprocess.run(["umount", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(0o755)


@pytest.fixture
def make_step() -> Make:
    """`episodes_of_step` as a fixture."""
    return episodes_of_step


@pytest.fixture
def tasks() -> dict[str, Task]:
    """The tasks the episodes of `make_step` answer, by id."""
    return {f"math-{g}": task(g) for g in range(4)}
