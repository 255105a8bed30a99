"""Bad input for the trajectory store: an unusable URL, a full disk, corrupt segments."""

from __future__ import annotations

import os
import random
import re
import uuid
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tidal.config import load_config
from tidal.errors import (
    ConfigError,
    CorruptSegmentError,
    StoreError,
    StoreUnavailableError,
    StoreWriteError,
)
from tidal.storage.query import run_query
from tidal.storage.run import RunFolder
from tidal.storage.schema import LEDGER
from tidal.storage.segments import CorruptSegmentWarning
from tidal.storage.store import TrajectoryStore, open_run_store

SMOKE = Path(__file__).resolve().parents[3] / "configs" / "smoke.yaml"


def test_unknown_protocol_is_a_typed_error_naming_the_url(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailableError, match=r"'nosuchfs://bucket/x'.*Protocol not known") as caught:
        TrajectoryStore.open("nosuchfs://bucket/x", run="r", writable=True)
    assert caught.value.url == "nosuchfs://bucket/x"
    with pytest.raises(ConfigError, match=r"run.trajectory_store: .*unknown protocol 'nosuchfs'"):
        load_config(SMOKE, ["run.trajectory_store=nosuchfs://bucket/x"])


def test_read_only_store_fails_at_open_before_anything_is_written(tmp_path: Path, read_only_folder: Path) -> None:
    run = RunFolder.create(tmp_path, "r")
    with pytest.raises(StoreUnavailableError, match=r"cannot be written \((Read-only file system|Permission denied)\)") as caught:
        open_run_store(run, str(read_only_folder))
    assert caught.value.url == f"{read_only_folder}/r"
    assert str(read_only_folder) in str(caught.value)


def test_full_disk_is_a_typed_error_and_leaves_earlier_segments_readable(small_tmpfs: Path, make_step) -> None:
    url = str(small_tmpfs / "store")
    store = TrajectoryStore.open(url, run="r", writable=True)
    first = store.write_episodes(0, make_step("r", 0))
    store.mark_trained(store.unconsumed()[:2], 0)
    huge = make_step("r", 1, groups=1, samples=1)
    rng = random.Random(0)
    huge[0].completion.logprobs = [rng.random() for _ in range(150_000)]  # 1.2 MB that zstd cannot shrink
    huge[0].completion.token_ids = [rng.randrange(1 << 30) for _ in range(150_000)]  # and 0.6 MB more

    with pytest.raises(StoreWriteError, match="no space left on the device") as caught:
        store.write_episodes(1, huge)
    assert caught.value.url == url and str(small_tmpfs) in str(caught.value)
    assert sorted(os.listdir(small_tmpfs / "store" / "data")) == [first.name]  # nothing half-visible

    reader = TrajectoryStore.open(url)
    assert reader.steps() == [0] and len(list(reader.records())) == 6
    assert len(reader.trained()) == 2
    store.write_episodes(1, make_step("r", 1))  # the space of the failed write was given back
    assert TrajectoryStore.open(url).steps() == [0, 1]


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_corrupt_segment_strict_names_it_and_lenient_skips_it(tmp_path: Path, make_step) -> None:
    url = str(tmp_path / "store")
    store = TrajectoryStore.open(url, run="r", writable=True)
    store.write_episodes(0, make_step("r", 0))
    torn = store.write_episodes(1, make_step("r", 1))
    store.write_episodes(2, make_step("r", 2))
    _truncate(Path(torn.path))

    strict = TrajectoryStore.open(url)
    with pytest.raises(CorruptSegmentError, match="corrupt trajectories segment") as caught:
        list(strict.records())
    assert caught.value.segment == torn.path and torn.name in str(caught.value)
    with pytest.raises(CorruptSegmentError, match=torn.name):
        run_query(strict, "SELECT count(*) FROM trajectories")
    with pytest.raises(CorruptSegmentError):
        TrajectoryStore.open(url, run="r", writable=True).mark_trained(["r/step-000000/g000/s00"], 0)

    lenient = TrajectoryStore.open(url, strict=False)
    with pytest.warns(CorruptSegmentWarning, match=torn.name):
        assert lenient.steps() == [0, 2]
    with pytest.warns(CorruptSegmentWarning, match=torn.name):
        assert run_query(lenient, "SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 12}]


def test_corrupt_pages_and_foreign_files_are_detected(store_url: str, make_step) -> None:
    store = TrajectoryStore.open(store_url, run="r", writable=True)
    store.write_episodes(0, make_step("r", 0))
    store.mark_trained(store.unconsumed(), 0)
    fs, _ = fsspec.core.url_to_fs(store_url)
    ledger = store.segments(LEDGER)[0]
    data = bytearray(fs.cat_file(ledger.path))
    data[len(data) // 3] ^= 0xFF  # one flipped byte inside the pages: the footer still parses
    fs.pipe_file(ledger.path, bytes(data))
    reader = TrajectoryStore.open(store_url)
    with pytest.raises(CorruptSegmentError, match=ledger.name):
        reader.trained()

    # A Parquet file that is not a tidal segment, under a segment's name.
    foreign = store.segments()[0].path.replace("-s000001-", "-s000009-")
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"x": [1]}), sink)
    fs.pipe_file(foreign, sink.getvalue().to_pybytes())
    with pytest.raises(CorruptSegmentError, match="not a tidal trajectories segment"):
        list(reader.records())


def test_a_run_whose_store_lived_in_its_process_or_is_gone_says_so(tmp_path: Path) -> None:
    """A later command reads the store the run's config.yaml names: a memory:// one died with the
    training process (this process never had it), and a folder that is gone is not "before RL"."""
    from typer.testing import CliRunner

    from tidal.cli import app
    from tidal.storage.cli_support import resolve_store

    url = f"memory://tidal-test-{uuid.uuid4().hex}"
    run = RunFolder.create(tmp_path, "mem")
    run.config_path.write_text(f"run:\n  trajectory_store: {url}\n")
    run.append_metrics({"phase": "rl", "step": 1})
    ended = f"trajectory store {url}/mem lived in the training process; nothing to read"
    for target in (str(run.path), f"{url}/mem"):
        with pytest.raises(StoreUnavailableError, match=re.escape(ended)):
            resolve_store(target)
    shown = CliRunner().invoke(app, ["trajectories", "show", str(run.path), "mem/step-000000/g000/s00"])
    assert shown.exit_code == 2 and ended in shown.output and "has not reached RL" not in shown.output

    gone = RunFolder.create(tmp_path, "gone")
    gone.config_path.write_text(f"run:\n  trajectory_store: {tmp_path / 'moved'}\n")
    with pytest.raises(StoreError, match="has not reached RL"):  # true: no RL row yet
        resolve_store(str(gone.path))
    gone.append_metrics({"phase": "rl", "step": 1})
    moved = f"trajectory store {tmp_path / 'moved'}/gone is not there"
    with pytest.raises(StoreUnavailableError, match=re.escape(moved)):
        resolve_store(str(gone.path))
