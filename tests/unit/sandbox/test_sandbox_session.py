"""Sessions: a workspace across commands, snapshots that restore exactly and never leave the workspace."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tidal.sandbox import SandboxBackend, SandboxStatus
from tidal.sandbox.session import SessionStore, SnapshotError, open_session
from tidal.types import Limits


@pytest.fixture
def store() -> SessionStore:
    made = SessionStore()
    yield made
    made.close()


def sh(session, script: str):  # type: ignore[no-untyped-def]
    result = session.exec(["/bin/sh", "-c", script])
    assert result.status == SandboxStatus.OK, result.stderr
    return result


def test_files_persist_across_commands_and_processes_do_not(bwrap: SandboxBackend, store: SessionStore) -> None:
    with open_session(bwrap, {"a.txt": "one\n"}, Limits(timeout_s=10), store) as session:
        sh(session, "echo two >> a.txt; mkdir -p d; echo x > d/b; (sleep 30 &) ; echo $$ > /tmp/pid")
        result = sh(session, "cat a.txt d/b; echo TMP; ls -A /tmp; echo PS; ps -e -o comm=")
        files, rest = result.stdout.decode().split("TMP\n")
        tmp, processes = rest.split("PS\n")
        assert files.split() == ["one", "two", "x"]
        assert tmp == ""  # /tmp is the sandbox's own, new each command
        assert "sleep" not in processes.split()  # died with the last sandbox
        assert session.read_file("a.txt") == b"one\ntwo\n"
        assert session.list_files() == ["a.txt", "d/b"]
        assert session.commands == 2


def test_snapshot_restore_is_exact_and_fork_branches(bwrap: SandboxBackend, store: SessionStore) -> None:
    with open_session(bwrap, {"keep.txt": "v1", "bin/run.sh": "echo hi"}, Limits(timeout_s=10), store) as session:
        sh(session, "chmod 750 bin/run.sh; chmod 500 bin; ln -s keep.txt link; mkfifo pipe")
        snap = session.snapshot()
        assert snap.files == 2 and snap.skipped == ("pipe",)
        sh(session, "chmod 700 bin; rm -r bin; echo v2 > keep.txt; rm link; echo new > extra")
        branch = session.fork(snap)
        session.restore(snap)
        for each in (session, branch):
            out = sh(each, "cat keep.txt; echo; stat -c '%a %n' bin bin/run.sh; readlink link; ls").stdout.decode().split("\n")
            assert out[0] == "v1"
            assert out[1:3] == ["500 bin", "750 bin/run.sh"]
            assert out[3] == "keep.txt" and "extra" not in out[4:] and "pipe" not in out[4:]
        sh(branch, "chmod 700 bin; echo branch > keep.txt")
        assert session.read_file("keep.txt") == b"v1" and branch.read_file("keep.txt") == b"branch\n"
        branch.close()


def test_snapshots_never_follow_links_out(bwrap: SandboxBackend, store: SessionStore, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    with open_session(bwrap, {}, Limits(timeout_s=10), store) as session:
        # Links the sandbox makes to paths that exist on the host (but not inside the sandbox).
        sh(session, f"ln -s {secret} out; ln -s {tmp_path} outdir; ln -s / root")
        snap = session.snapshot()
        assert snap.files == 0 and snap.bytes == 0
        assert sorted(os.listdir(snap.path)) == ["out", "outdir", "root"]
        assert all(Path(snap.path, name).is_symlink() for name in os.listdir(snap.path))
        with pytest.raises(PermissionError):
            session.read_file("out")
        with pytest.raises(PermissionError):
            session.read_file("outdir/secret.txt")
        with pytest.raises(PermissionError):
            session.write_files({"outdir/planted.txt": "x"})
        assert not (tmp_path / "planted.txt").exists()
        session.restore(snap)
        assert Path(session.workspace, "out").is_symlink()
        assert secret.read_text() == "host secret"


def test_snapshot_cap_and_closed_sessions(bwrap: SandboxBackend, store: SessionStore) -> None:
    session = open_session(bwrap, {}, Limits(timeout_s=10), store, snapshot_cap_mb=1)
    sh(session, "head -c 2000000 /dev/zero > big")
    with pytest.raises(SnapshotError, match="snapshot cap"):
        session.snapshot()
    assert not [p for p in store.root.iterdir() if p.name.startswith("snap-")]  # the partial copy is gone
    session.close()
    with pytest.raises(SnapshotError, match="closed"):
        session.exec(["/bin/true"])
    assert not session.run_dir.exists()


def test_a_session_without_a_store_removes_its_own_when_it_closes(bwrap: SandboxBackend) -> None:
    with open_session(bwrap, {"a.txt": "one\n"}, Limits(timeout_s=10)) as session:
        sh(session, "echo two >> a.txt")
        session.snapshot()
        own = session.store
        assert own.is_dir() and any(p.name.startswith("snap-") for p in own.iterdir())
    assert not own.exists()  # the store it made for itself went with it, snapshots included

    before = set(Path(tempfile.gettempdir()).glob("tidal-sessions-*"))
    with pytest.raises(ValueError, match="relative path"):
        open_session(bwrap, {"../out.txt": "x"}, Limits(timeout_s=10))  # refused starting files
    assert set(Path(tempfile.gettempdir()).glob("tidal-sessions-*")) <= before


def test_a_shared_store_outlives_the_sessions_that_use_it(bwrap: SandboxBackend, store: SessionStore) -> None:
    with open_session(bwrap, {}, Limits(timeout_s=10), store) as session:
        assert session.store == store.root
    assert store.root.is_dir()  # the caller closes it
