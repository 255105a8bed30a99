"""Append-only Parquet segments on any fsspec filesystem: write once, list, read and verify.

A segment is one Parquet file, written whole and never changed:

- on a local disk to a hidden temporary name (`.<name>.tmp`) in the same folder, fsynced, then
  renamed into place, so a listing never shows half a file;
- on an object store (and `memory://`) in one `put` of the finished bytes under a name no other
  writer uses (attempt, sequence and a random tag), which object stores make visible whole or not
  at all.

The Parquet footer, written last, is the segment's manifest: besides the schema it holds
`tidal.kind`, `tidal.schema_version`, `tidal.rows`, `tidal.attempt`, `tidal.sequence`, and pages
carry CRC checksums. A file whose footer is missing (torn), whose row count disagrees, or whose
pages fail their checksum is reported as `CorruptSegmentError` naming its URL.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from tidal.errors import CorruptSegmentError, StoreUnavailableError, StoreWriteError
from tidal.storage.run import fsync_path
from tidal.storage.schema import LEDGER, SCHEMA_VERSION, TRAJECTORIES, upgrade

FOLDERS = {TRAJECTORIES: "data", LEDGER: "ledger"}
_PREFIX = {TRAJECTORIES: "t", LEDGER: "l"}
_NAME = re.compile(r"^(?P<prefix>[tl])-a(?P<attempt>\d{6,})-s(?P<sequence>\d{6,})-(?P<tag>[0-9a-f]{8})\.parquet$")


class CorruptSegmentWarning(UserWarning):
    """A lenient reader skipped a corrupt segment (its URL is in the message)."""


@dataclass(frozen=True, order=True)
class Segment:
    """One finished segment file. Ordered by (attempt, sequence): the order it was written in."""

    attempt: int
    sequence: int
    kind: str
    name: str
    path: str  # path on the store's filesystem (no protocol)


class SegmentFiles:
    """The segment folders of one store root, on the filesystem its URL names."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        except ValueError as error:  # fsspec: "Protocol not known: ..."
            known = ", ".join(sorted(fsspec.available_protocols())[:40])
            raise StoreUnavailableError(
                f"trajectory store {url!r}: {error}; give a local folder or a URL with a known protocol ({known}, ...)",
                url,
            ) from None
        except ImportError as error:  # a known protocol whose driver (s3fs, gcsfs, ...) is not installed
            raise StoreUnavailableError(f"trajectory store {url!r}: {error}", url) from None
        self.root = self.root.rstrip("/") or "/"
        self.local = isinstance(self.fs, LocalFileSystem)

    # -- names -------------------------------------------------------------------------------------

    def display(self, path: str) -> str:
        """A path on the filesystem as a URL a user can paste (local paths stay plain paths)."""
        return path if self.local else self.fs.unstrip_protocol(path)

    def join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def new_segment(self, kind: str, attempt: int, sequence: int) -> Segment:
        name = f"{_PREFIX[kind]}-a{attempt:06d}-s{sequence:06d}-{secrets.token_hex(4)}.parquet"
        return Segment(attempt, sequence, kind, name, self.join(FOLDERS[kind], name))

    # -- writing -----------------------------------------------------------------------------------

    def check_writable(self) -> None:
        """Create the store's folders and write and delete a probe file; a store that cannot be
        written raises StoreUnavailableError now, before any trajectory is generated."""
        probe = self.join(f".probe-{secrets.token_hex(4)}")
        try:
            for folder in FOLDERS.values():
                self.fs.makedirs(self.join(folder), exist_ok=True)
            self._put(probe, b"probe")
            self.fs.rm_file(probe)
        except OSError as error:
            reason = error.strerror or str(error)
            raise StoreUnavailableError(
                f"trajectory store {self.url!r} cannot be written ({reason}); give a writable folder or URL "
                "in run.trajectory_store",
                self.url,
            ) from None

    def write_once(self, path: str, data: bytes) -> None:
        """Write `data` to `path` whole or not at all (see the module docstring)."""
        try:
            self._put(path, data)
        except OSError as error:
            where = self.display(path)
            if error.errno == errno.ENOSPC:
                reason = "no space left on the device"
            elif error.errno == errno.EDQUOT:
                reason = "disk quota exceeded"
            else:
                reason = error.strerror or str(error)
            raise StoreWriteError(
                f"trajectory store {self.url!r}: writing {where} failed: {reason}; nothing of it is visible and "
                "the finished segments are intact. Free space (or fix the store) and resume the run",
                self.url,
            ) from error

    def _put(self, path: str, data: bytes) -> None:
        if self.local:
            _write_local_atomic(Path(path), data)
        else:
            self.fs.pipe_file(path, data)

    def write_segment(self, segment: Segment, table: pa.Table) -> None:
        """Encode `table` with its manifest in the footer and write it once under `segment.path`."""
        metadata = {
            b"tidal.kind": segment.kind.encode(),
            b"tidal.schema_version": str(SCHEMA_VERSION).encode(),
            b"tidal.rows": str(table.num_rows).encode(),
            b"tidal.attempt": str(segment.attempt).encode(),
            b"tidal.sequence": str(segment.sequence).encode(),
        }
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd", write_page_checksum=True)
        self.write_once(segment.path, sink.getvalue().to_pybytes())

    # -- listing and reading -----------------------------------------------------------------------

    def list(self, kind: str) -> list[Segment]:
        """Finished segments of `kind`, in write order. Temporary files (`.name.tmp`) and foreign
        names are not segments; a missing folder means none yet."""
        folder = self.join(FOLDERS[kind])
        try:
            entries = self.fs.ls(folder, detail=False)
        except FileNotFoundError:
            return []
        except OSError as error:
            raise StoreUnavailableError(f"trajectory store {self.url!r}: cannot list {folder}: {error}", self.url) from None
        found = []
        for entry in entries:
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            match = _NAME.match(name)
            if match and match["prefix"] == _PREFIX[kind]:
                found.append(Segment(int(match["attempt"]), int(match["sequence"]), kind, name, self.join(FOLDERS[kind], name)))
        return sorted(found)

    def read(self, segment: Segment, columns: list[str] | None = None) -> pa.Table:
        """The rows of `segment` (optionally only `columns`), checked against its footer manifest
        and page checksums; CorruptSegmentError names the segment otherwise."""
        where = self.display(segment.path)
        try:
            data = self.fs.cat_file(segment.path)
            parquet = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
            meta = parquet.schema_arrow.metadata or {}
            kind = meta.get(b"tidal.kind", b"").decode()
            version = int(meta.get(b"tidal.schema_version", b"0"))
            rows = int(meta.get(b"tidal.rows", b"-1"))
            if kind != segment.kind or version < 1:
                raise ValueError(f"not a tidal {segment.kind} segment (footer kind {kind!r}, schema version {version})")
            if rows != parquet.metadata.num_rows:
                raise ValueError(f"footer says {rows} rows, the file holds {parquet.metadata.num_rows}")
            table = upgrade(parquet.read(), version, segment.kind)
        except FileNotFoundError:
            raise CorruptSegmentError(f"{where}: segment vanished while reading", self.url, where) from None
        except (pa.ArrowException, OSError, ValueError, EOFError) as error:
            raise CorruptSegmentError(
                f"{where}: corrupt {segment.kind} segment ({error}). Move it out of the store to continue; "
                "lenient readers (--lenient) skip it",
                self.url,
                where,
            ) from None
        return table.select(columns) if columns else table

    def read_all(self, kind: str, strict: bool, columns: list[str] | None = None) -> list[tuple[Segment, pa.Table]]:
        """Every segment of `kind` in write order. Strict: a corrupt one raises. Lenient: it is
        skipped with a CorruptSegmentWarning, and the others are returned."""
        out = []
        for segment in self.list(kind):
            try:
                out.append((segment, self.read(segment, columns)))
            except CorruptSegmentError as error:
                if strict:
                    raise
                warnings.warn(f"skipped: {error}", CorruptSegmentWarning, stacklevel=2)
        return out

    def url_of(self, segment: Segment) -> str:
        """What DuckDB's read_parquet is given for a segment: a local path, or a full URL."""
        return segment.path if self.local else self.fs.unstrip_protocol(segment.path)


def _write_local_atomic(path: Path, data: bytes) -> None:
    """Temporary file in the same folder, fsync, rename, fsync the folder; the temporary file is
    removed on any failure, so a full disk leaves nothing behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)
