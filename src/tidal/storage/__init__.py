"""storage layer: run folders (config, metrics, summary, report), eval records, and the trajectory
store (Parquet segments through fsspec, with the exactly-once ledger; imported on first use so
that importing a run folder does not load pyarrow)."""

from typing import Any

from tidal.storage.run import (
    RunFolder,
    atomic_writer,
    read_jsonl,
    write_jsonl_atomic,
)
from tidal.storage.trajectories import TrajectoryWriter

_LAZY = {"TrajectoryStore": "tidal.storage.store", "open_run_store": "tidal.storage.store", "run_query": "tidal.storage.query"}

__all__ = ["RunFolder", "TrajectoryStore", "TrajectoryWriter", "atomic_writer", "open_run_store", "read_jsonl", "run_query", "write_jsonl_atomic"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tidal.storage' has no attribute {name!r}")
