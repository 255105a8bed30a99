"""storage layer: run folders (config, metrics, summary, report), trajectory and eval records."""

from tidal.storage.run import RunFolder, TrajectoryWriter, atomic_writer, read_jsonl, write_jsonl_atomic

__all__ = ["RunFolder", "TrajectoryWriter", "atomic_writer", "read_jsonl", "write_jsonl_atomic"]
