"""Run folders on the local disk: config, metrics, trajectories, eval records, summary, report.

    runs/<name>/
      run.json          marker written by `RunFolder.create` (name, creation time, format)
      config.yaml       the resolved config (`save_config`)
      metrics.jsonl     one JSON object per line, appended and fsynced per row
      trajectories/     the trajectory store (store.py); older runs: step-NNNNNN.jsonl files
      checkpoints/      owned by the trainer
      eval/<tag>.jsonl  per-task eval records (e.g. before, after); summary.json, report.html

A metrics row is one `write` + flush + fsync, so at most the last line can be torn: it is skipped
with a warning on reading and cut off before the next append. Everything else is written whole to
a temporary file, fsynced and renamed over the target, so a reader sees the old file or the new
one. NaN and ±Infinity are kept as `json`'s tokens (a NaN loss is information), which strict JSON
parsers reject. docs/design/store.md, "The run folder".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from tidal.errors import CheckpointError

logger = logging.getLogger(__name__)

MARKER = "run.json"
FORMAT_VERSION = 1


# ------------------------------------------------------------------------------------------------
# Atomic writes


def _json_default(value: Any) -> Any:
    """Serialise numpy scalars/arrays, paths and sets, which rows from the trainer often carry."""
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def dumps(obj: Any, *, indent: int | None = None) -> str:
    """`obj` as JSON text: UTF-8 kept readable, numpy values converted."""
    separators = None if indent else (",", ":")
    return json.dumps(obj, ensure_ascii=False, default=_json_default, indent=indent, separators=separators)


def fsync_path(path: Path) -> None:
    """Flush a file, or make renames in a folder durable. Not every platform opens folders; then skip."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[IO[str]]:
    """Open a temporary file next to `path` for writing text; on success fsync it and rename it
    over `path`. On an exception the temporary file is removed and `path` is left untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def write_jsonl_atomic(path: Path, records: list[dict[str, Any]]) -> None:
    """Write `records` as JSON lines to `path`, whole or not at all."""
    with atomic_writer(path) as handle:
        for record in records:
            handle.write(dumps(record))
            handle.write("\n")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a JSON-lines file; a malformed line raises CheckpointError with file and line."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as error:
                raise CheckpointError(f"{path}:{number}: not valid JSON ({error.msg}); the file is damaged") from None


# ------------------------------------------------------------------------------------------------
# Run folder


class RunFolder:
    """One run directory. Create it with `RunFolder.create`, open an existing one with `.open`."""

    def __init__(self, path: Path) -> None:
        # Use `create` or `open`; the constructor trusts that `path` is a run folder.
        self.path = Path(path)
        # Called with every metrics row once it is on disk (the telemetry sinks, telemetry/sinks.py).
        self.listeners: list[Callable[[dict[str, Any]], None]] = []

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def create(cls, parent: str | Path, name: str | None = None, *, exist_ok: bool = False) -> RunFolder:
        """Make a new run folder `parent/name` (default name: the UTC time, `YYYYmmdd-HHMMSS`).

        A default name that is taken gets a suffix (`-2`, `-3`, ...). A given name that already
        holds a run raises CheckpointError unless `exist_ok`, in which case that run is opened
        (resume). A given name that holds something other than a run always raises.
        """
        parent = Path(parent)
        parent.mkdir(parents=True, exist_ok=True)
        if name is None:
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
            path, suffix = parent / stamp, 1
            while True:
                try:
                    path.mkdir()
                    break
                except FileExistsError:
                    suffix += 1
                    path = parent / f"{stamp}-{suffix}"
        else:
            if not name or name in (".", "..") or "/" in name or "\\" in name:
                raise CheckpointError(f"run name {name!r}: give a plain folder name, without slashes")
            path = parent / name
            if (path / MARKER).is_file():
                if exist_ok:
                    return cls.open(path)
                raise CheckpointError(
                    f"{path}: a run with this name already exists; choose another name, or resume it"
                )
            if path.exists() and (not path.is_dir() or any(path.iterdir())):
                raise CheckpointError(f"{path}: exists and is not a tidal run folder; choose another name")
            path.mkdir(exist_ok=True)
        run = cls(path)
        for folder in (run.trajectories_dir, run.checkpoints_dir, run.eval_dir):
            folder.mkdir(exist_ok=True)
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        run.write_json(MARKER, {"format": FORMAT_VERSION, "name": path.name, "created_utc": created})
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunFolder:
        """Open an existing run folder; raises CheckpointError when `path` is not one."""
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"{path}: no such run folder")
        marker = path / MARKER
        if not marker.is_file():
            raise CheckpointError(f"{path}: not a tidal run folder (no {MARKER}); create runs with RunFolder.create")
        try:
            info = json.loads(marker.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointError(f"{marker}: damaged run marker (not JSON)") from None
        version = info.get("format") if isinstance(info, dict) else None
        if version != FORMAT_VERSION:
            raise CheckpointError(f"{marker}: run format {version!r}, this tidal reads format {FORMAT_VERSION}")
        return cls(path)

    # -- paths ---------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def trajectories_dir(self) -> Path:
        return self.path / "trajectories"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def eval_dir(self) -> Path:
        return self.path / "eval"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def report_path(self) -> Path:
        return self.path / "report.html"

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    # -- metrics -------------------------------------------------------------------------------

    def append_metrics(self, row: dict[str, Any]) -> None:
        """Append one row to metrics.jsonl and fsync it, so a crash loses at most this row."""
        line = dumps(row) + "\n"  # JSON escapes newlines inside strings: one row, one line
        self._cut_torn_tail()
        with self.metrics_path.open("a", encoding="utf-8", newline="\n") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        for listener in self.listeners:
            listener(row)

    def append_jsonl(self, name: str, row: dict[str, Any]) -> None:
        """Append one JSON row to `name` in the run folder (alarms, weight changes) and fsync it."""
        with (self.path / name).open("a", encoding="utf-8", newline="\n") as handle:
            handle.write(dumps(row) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def read_metrics(self) -> list[dict[str, Any]]:
        """All metrics rows in order. A torn last line (a crash mid-write) is skipped with a
        warning; a malformed line before the last raises CheckpointError."""
        return [row for _, row in self._metrics_lines()]

    def drop_metrics_after(self, phase: str, step: int) -> int:
        """Remove the rows of `phase` with a step above `step` from metrics.jsonl, keeping every
        other row, byte for byte and in order; returns how many went. A resume from the checkpoint
        of `step` calls it before redoing the later steps, whose rows would otherwise be there
        twice (the crashed attempt's and the redone ones). Atomic: the file is rewritten whole
        (`atomic_writer`), so a crash meanwhile leaves the old file. A torn last line goes too."""
        return self.drop_rows_after(self.metrics_path.name, step, phase)

    def drop_rows_after(self, name: str, step: int, phase: str | None = None) -> int:
        """`drop_metrics_after` for any JSON-lines file of the run folder (alarms.jsonl, ...): its
        rows with a step above `step` (of `phase` only, when given) go; returns how many."""
        path = self._inside(name)
        kept: list[bytes] = []
        dropped = 0
        for line, row in self._jsonl_lines(path):
            later = isinstance(row.get("step"), int) and row["step"] > step
            if later and (phase is None or row.get("phase") == phase):
                dropped += 1
            else:
                kept.append(line)
        if dropped:
            with atomic_writer(path) as handle:
                handle.write("".join(line.decode("utf-8") + "\n" for line in kept))
            logger.info("%s: dropped %d row(s) after step %d, to be redone", path, dropped, step)
        return dropped

    def _metrics_lines(self) -> Iterator[tuple[bytes, dict[str, Any]]]:
        return self._jsonl_lines(self.metrics_path)

    def _jsonl_lines(self, path: Path) -> Iterator[tuple[bytes, dict[str, Any]]]:
        """(line, row) for each row of a JSON-lines file, in order; a torn last line is skipped
        with a warning, a malformed line before the last raises CheckpointError."""
        if not path.is_file():
            return
        lines = path.read_bytes().split(b"\n")
        last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
        for index, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line.decode("utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                where = f"{path}:{index + 1}"
                reason = getattr(error, "msg", None) or str(error)
                if index == last:
                    logger.warning("%s: skipped a torn last line (%s), left by an interrupted write", where, reason)
                    continue
                raise CheckpointError(f"{where}: not valid JSON ({reason}); the file is damaged") from None
            yield line, row

    def _cut_torn_tail(self) -> None:
        """If the file does not end in a newline, a crash tore the last row: drop the partial
        line (or, if it happens to be complete JSON, just end it) before appending."""
        path = self.metrics_path
        if not path.is_file():
            return
        with path.open("rb+") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size == 0:
                return
            handle.seek(size - 1)
            if handle.read(1) == b"\n":
                return
            start = _last_line_start(handle, size)
            handle.seek(start)
            tail = handle.read()
            try:
                json.loads(tail.decode("utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                logger.warning("%s: dropped a torn last line of %d bytes before appending", path, len(tail))
                handle.truncate(start)
            else:
                handle.seek(0, os.SEEK_END)
                handle.write(b"\n")
            handle.flush()
            os.fsync(handle.fileno())

    # -- JSON documents ------------------------------------------------------------------------

    def _inside(self, name: str | Path) -> Path:
        relative = Path(name)
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise ValueError(f"{name!s}: give a path inside the run folder, e.g. 'summary.json'")
        return self.path / relative

    def write_json(self, name: str | Path, obj: Any) -> Path:
        """Write `obj` as indented JSON to `name` (relative to the run folder), atomically."""
        path = self._inside(name)
        with atomic_writer(path) as handle:
            handle.write(dumps(obj, indent=2))
            handle.write("\n")
        return path

    def read_json(self, name: str | Path) -> Any:
        """Read a JSON document written with `write_json`."""
        path = self._inside(name)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"{path}: not written yet") from None
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None


def _last_line_start(handle: IO[bytes], size: int, block: int = 1 << 16) -> int:
    """Offset just after the last newline of a binary file (0 if it has none)."""
    end = size
    while end > 0:
        start = max(0, end - block)
        handle.seek(start)
        chunk = handle.read(end - start)
        position = chunk.rfind(b"\n")
        if position >= 0:
            return start + position + 1
        end = start
    return 0
