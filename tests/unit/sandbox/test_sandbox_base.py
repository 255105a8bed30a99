"""The sandbox registry and the helpers every backend shares."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidal.errors import SandboxUnavailableError, UnknownNameError
from tidal.sandbox import get_backend, known_backends
from tidal.sandbox.base import remove_tree, safe_relative_path, write_tree


def test_known_backends() -> None:
    assert {"bwrap", "unsafe_local"} <= known_backends()


def test_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as caught:
        get_backend("docker")
    assert "docker" in str(caught.value)
    assert "bwrap" in str(caught.value) and "unsafe_local" in str(caught.value)


def test_missing_bwrap_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import tidal.sandbox.bwrap as bwrap_module

    monkeypatch.setattr(bwrap_module.shutil, "which", lambda name, path=None: None)
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        get_backend("bwrap")


@pytest.mark.parametrize("name", ["/etc/passwd", "../up.py", "a/../../b", "", ".", "x\0y"])
def test_file_names_must_stay_inside_the_workspace(name: str) -> None:
    with pytest.raises(ValueError):
        safe_relative_path(name)


def test_write_tree_and_remove_a_hostile_tree(tmp_path: Path) -> None:
    root = tmp_path / "workspace"
    root.mkdir()
    write_tree(root, {"a/b/c.txt": "text", "bin.dat": b"\x00\xff"})
    assert (root / "a/b/c.txt").read_text() == "text"
    assert (root / "bin.dat").read_bytes() == b"\x00\xff"
    locked = root / "locked"
    (locked / "inner").mkdir(parents=True)
    (locked / "inner" / "file").write_text("x")
    os.symlink("/etc", root / "link-to-etc")
    (locked / "inner").chmod(0)
    locked.chmod(0)
    remove_tree(root)
    assert not root.exists()
    assert Path("/etc/passwd").exists()
