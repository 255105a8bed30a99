"""Sessions: one workspace kept across several sandboxed commands, with snapshots to branch or retry.

An agent episode runs many commands in one workspace (a tool call each). `open_session` (on a
`SessionBackend`) writes the starting files once; every `exec` then starts a fresh sandbox (new
namespaces, processes, `/tmp`, limits and wall clock) over that same workspace, so files persist
and nothing else does. Between commands no sandboxed process is alive: that is when `snapshot()`
copies the workspace, `restore(snapshot)` puts it back exactly (files, folders, modes, symlinks)
and `fork(snapshot)` opens a branch. Nothing outside the workspace is ever captured or touched
from the host: links are stored and recreated as links, never followed; special files are skipped
and listed; the size is capped (`SnapshotError`); `read_file`, `write_files` and `put_files` never
pass through a symlink. A harness that checks the workspace afterwards (an agent episode's
acceptance tests) works in the same session: `put_files` writes its files over whatever the
sandbox left on their paths, and `exec` can add harness files and open the report channel.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tidal.errors import TidalError
from tidal.sandbox.base import (
    SandboxBackend,
    SandboxResult,
    SessionBackend,
    chown_tree,
    remove_tree,
    safe_relative_path,
    write_tree,
)
from tidal.sandbox.leftovers import make_run_dir
from tidal.types import Limits

SNAPSHOT_CAP_MB = 256
SNAPSHOT_ENTRIES_CAP = 100_000


class SnapshotError(TidalError):
    """A workspace could not be snapshotted or restored (too large, or not this session's)."""


@dataclass(frozen=True)
class Snapshot:
    """One saved workspace state."""

    id: str
    path: Path  # the saved tree
    modes: dict[str, int]  # relative path -> permission bits of the original
    files: int
    bytes: int
    skipped: tuple[str, ...] = ()  # special files left out (relative paths)
    taken_s: float = 0.0


def _copy_tree(source: Path, target: Path, cap_bytes: int) -> tuple[int, int, list[str], dict[str, int]]:
    """Copy `source` to (new) `target` without following symlinks; (files, bytes, skipped, modes).
    The copies are owner-readable and writable; `modes` holds the originals' permission bits."""
    files = size = entries = 0
    skipped: list[str] = []
    modes: dict[str, int] = {}
    target.mkdir(mode=0o700)
    for folder, dirs, names in os.walk(source, followlinks=False):
        relative = Path(folder).relative_to(source)
        destination = target / relative
        for name in sorted(dirs + names):
            entries += 1
            if entries > SNAPSHOT_ENTRIES_CAP:
                raise SnapshotError(f"the workspace holds more than {SNAPSHOT_ENTRIES_CAP} entries")
            path, copy = Path(folder, name), destination / name
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(path), copy)
                if name in dirs:
                    dirs.remove(name)  # os.walk lists links to folders as folders; never enter one
            elif stat.S_ISDIR(info.st_mode):
                copy.mkdir(mode=0o700)
            elif stat.S_ISREG(info.st_mode):
                size += info.st_size
                if size > cap_bytes:
                    raise SnapshotError(f"the workspace is larger than the snapshot cap ({cap_bytes >> 20} MiB)")
                _copy_file(path, copy)
                files += 1
            else:
                skipped.append((relative / name).as_posix())
                continue
            if not stat.S_ISLNK(info.st_mode):
                modes[(relative / name).as_posix()] = stat.S_IMODE(info.st_mode)
                os.chmod(copy, 0o700 if stat.S_ISDIR(info.st_mode) else 0o600)
    return files, size, skipped, modes


def _copy_into(source: Path, target: Path) -> None:
    """Copy the saved tree `source` into the existing empty folder `target` (links as links)."""
    for entry in source.iterdir():
        destination = target / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry), destination)
        elif entry.is_dir():
            shutil.copytree(entry, destination, symlinks=True)
        else:
            shutil.copy2(entry, destination, follow_symlinks=False)


def _copy_file(source: Path, target: Path) -> None:
    """Copy one regular file, refusing to open it through a link swapped in meanwhile."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SnapshotError(f"{source.name} changed while it was copied")
        with os.fdopen(os.dup(fd), "rb") as reader, open(target, "xb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)
    finally:
        os.close(fd)


def _add_mode(path: Path, bits: int) -> None:
    """Add permission `bits` to a folder or regular file; links and special files are left alone."""
    info = os.lstat(path)
    if (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)) and stat.S_IMODE(info.st_mode) & bits != bits:
        os.chmod(path, stat.S_IMODE(info.st_mode) | bits)


def _apply_modes(root: Path, modes: dict[str, int]) -> None:
    """Give every copied entry its saved mode, deepest first (so folders are still writable)."""
    for relative in sorted(modes, key=lambda name: -name.count("/")):
        path = root / relative
        if not path.is_symlink():
            os.chmod(path, modes[relative])


class SandboxSession:
    """A workspace that outlives single commands. Use `open_session`; close it (or use `with`)."""

    _counter = itertools.count()

    def __init__(self, backend: SessionBackend, limits: Limits, store: Path, owner: tuple[int, int] | None,
                 snapshot_cap_mb: int = SNAPSHOT_CAP_MB) -> None:
        self.backend, self.limits = backend, limits
        self.store, self.owner, self.snapshot_cap_mb = store, owner, snapshot_cap_mb
        self.run_dir = Path(tempfile.mkdtemp(prefix="tidal-session-", dir=store))
        (self.run_dir / "workspace").mkdir(mode=0o755)
        (self.run_dir / "harness").mkdir(mode=0o755)
        backend.prepare_workspace(self.workspace, limits)  # a size-limited tmpfs where the backend can make one
        self.closed = False
        self.commands = 0
        self.owned_store: SessionStore | None = None  # a store open_session made for this session alone

    @property
    def workspace(self) -> Path:
        return self.run_dir / "workspace"

    # ------------------------------------------------------------------ commands and files

    def exec(self, argv: list[str], timeout_s: float | None = None, env: dict[str, str] | None = None, *,
             limits: Limits | None = None, harness_files: dict[str, str | bytes] | None = None,
             report_input: bytes | None = None) -> SandboxResult:
        """Run `argv` in a fresh sandbox over this workspace, under the session's limits (or
        `limits`), with `timeout_s` when given. `harness_files` are added to the read-only harness
        folder (`$TIDAL_HARNESS`, first on PYTHONPATH) and stay for later commands; `report_input`
        opens the private report channel for this command only (`SandboxResult.report`)."""
        self._check_open()
        limits = limits or self.limits
        if timeout_s is not None:
            limits = limits.model_copy(update={"timeout_s": timeout_s})
        if harness_files:
            harness = self.run_dir / "harness"
            write_tree(harness, harness_files, mode=0o755)  # read-only inside: a ro bind
            for folder, dirs, _ in os.walk(harness):
                for name in dirs:
                    os.chmod(os.path.join(folder, name), 0o755)
        self.commands += 1
        if report_input is None:
            return self.backend.run_in(self.run_dir, argv, limits, env)
        return self.backend.run_in(self.run_dir, argv, limits, env, report_input=report_input)

    def write_files(self, files: dict[str, str | bytes]) -> None:
        """Write files into the workspace from the host, never through a symlink the sandbox made."""
        self._check_open()
        for name in files:
            self._refuse_links(safe_relative_path(name))
        write_tree(self.workspace, files)
        if self.owner is not None:
            chown_tree(self.workspace, *self.owner)

    def put_files(self, files: dict[str, str | bytes], remove: Iterable[str] = ()) -> None:
        """Write `files` from the host exactly as given, between commands (no sandboxed process is
        alive then): whatever the sandbox left on their paths (a link, a file where a folder must
        be, a folder where a file goes) is deleted first, as are the `remove` paths, never through
        a link. Every folder and file of the workspace also gets its owner's read and write bits
        (and search on folders; bits are only added), so a command run next can read all of it."""
        self._check_open()
        self._grant_owner_access()
        for name in remove:
            self._clear(safe_relative_path(name), blockers=False)
        for name in files:
            self._clear(safe_relative_path(name), blockers=True)
        write_tree(self.workspace, files)
        if self.owner is not None:
            chown_tree(self.workspace, *self.owner)

    def _clear(self, relative: PurePosixPath, blockers: bool) -> None:
        """Delete what is at `relative` (and, with `blockers`, a link or file on the way to it)."""
        path = self.workspace
        for index, part in enumerate(relative.parts):
            path = path / part
            if not os.path.lexists(path):
                return
            last = index == len(relative.parts) - 1
            real_folder = path.is_dir() and not path.is_symlink()
            if last or not real_folder:
                if (last or blockers) and real_folder:
                    remove_tree(path)
                elif last or blockers:
                    path.unlink()
                return

    def _grant_owner_access(self) -> None:
        _add_mode(self.workspace, stat.S_IRWXU)  # before os.walk lists it
        for folder, dirs, names in os.walk(self.workspace, followlinks=False):
            for name in dirs:
                _add_mode(Path(folder, name), stat.S_IRWXU)  # before os.walk lists it
            for name in names:
                _add_mode(Path(folder, name), stat.S_IRUSR | stat.S_IWUSR)

    def read_file(self, name: str, max_bytes: int = 1 << 20) -> bytes:
        """Up to `max_bytes` of a regular workspace file; FileNotFoundError / IsADirectoryError /
        PermissionError (a symlink on the way) otherwise."""
        self._check_open()
        path = self._refuse_links(safe_relative_path(name))
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise IsADirectoryError(errno.EISDIR, "not a regular file", name)
            return os.read(fd, max_bytes)
        finally:
            os.close(fd)

    def list_files(self) -> list[str]:
        """Relative paths of the regular files and links in the workspace (links not followed)."""
        found = []
        for folder, dirs, names in os.walk(self.workspace, followlinks=False):
            for name in names + [d for d in dirs if Path(folder, d).is_symlink()]:
                found.append(Path(folder, name).relative_to(self.workspace).as_posix())
        return sorted(found)

    def _refuse_links(self, relative: PurePosixPath) -> Path:
        path = self.workspace
        for part in relative.parts:
            path = path / part
            if path.is_symlink():
                raise PermissionError(errno.EPERM, "the workspace path goes through a symlink", str(relative))
        return path

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> Snapshot:
        """Save the workspace as it is now (see the module docstring for what is and is not kept)."""
        self._check_open()
        started = time.monotonic()
        snapshot_id = f"snap-{next(self._counter)}-{os.getpid()}"
        target = self.store / snapshot_id
        try:
            files, size, skipped, modes = _copy_tree(self.workspace, target, self.snapshot_cap_mb << 20)
        except BaseException:
            remove_tree(target)
            raise
        return Snapshot(snapshot_id, target, modes, files, size, tuple(skipped), time.monotonic() - started)

    def restore(self, snapshot: Snapshot) -> None:
        """Put the workspace back exactly as `snapshot` saved it."""
        self._check_open()
        if not snapshot.path.is_dir() or snapshot.path.parent != self.store:
            raise SnapshotError(f"snapshot {snapshot.id} is not in this session's store (or was deleted)")
        # Emptied and refilled in place: the workspace may be a mount point, which cannot be renamed.
        for entry in list(self.workspace.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                remove_tree(entry)
            else:
                entry.unlink()
        _copy_into(snapshot.path, self.workspace)
        _apply_modes(self.workspace, snapshot.modes)
        if self.owner is not None:
            chown_tree(self.workspace, *self.owner)

    def fork(self, snapshot: Snapshot | None = None) -> SandboxSession:
        """A new session over a copy of `snapshot` (default: the workspace now), sharing the store."""
        snapshot = snapshot or self.snapshot()
        child = SandboxSession(self.backend, self.limits, self.store, self.owner, self.snapshot_cap_mb)
        child.restore(snapshot)
        return child

    def _check_open(self) -> None:
        if self.closed:
            raise SnapshotError("the session is closed")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.backend.release_workspace(self.workspace)
            remove_tree(self.run_dir)
            if self.owned_store is not None:
                self.owned_store.close()

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@dataclass
class SessionStore:
    """Where sessions and their snapshots live; delete it with `close` when the episode group ends."""

    root: Path = field(default_factory=lambda: make_run_dir("tidal-sessions-"))

    def close(self) -> None:
        remove_tree(self.root)


def open_session(
    backend: SandboxBackend,
    files: dict[str, str | bytes] | None = None,
    limits: Limits | None = None,
    store: SessionStore | None = None,
    snapshot_cap_mb: int = SNAPSHOT_CAP_MB,
) -> SandboxSession:
    """A session on `backend` (which must be a `SessionBackend`) with `files` as the starting
    workspace. Without `store` the session gets a store of its own, removed when the session closes."""
    if not isinstance(backend, SessionBackend):
        raise TypeError(f"sandbox backend {backend.name!r} does not support sessions")
    owner = backend.workspace_owner
    own: SessionStore | None = None
    if store is None:
        store = own = SessionStore()
    try:
        session = SandboxSession(backend, limits or Limits(), store.root, owner, snapshot_cap_mb)
    except BaseException:
        if own is not None:
            own.close()
        raise
    session.owned_store = own
    try:
        session.write_files(files or {})
    except BaseException:
        session.close()
        raise
    return session
