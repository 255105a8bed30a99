"""Size-limited workspaces: on root hosts each sandbox workspace is its own tmpfs.

A workspace on the host's disk is bounded per file (RLIMIT_FSIZE) but not in total or in inode
count, so a candidate could fill the disk within its time limit. Mounted as a tmpfs with
`size=Limits.disk_mb` and a fixed inode count, the workspace is bounded as a whole, and its pages
are charged to the memory cgroup of the process that writes them (the sandbox's own). The host
reads and writes it like any folder; it is unmounted (lazily, if something still holds it) before
the run folder is deleted. Mounting needs root; elsewhere the workspace is a plain folder.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

MS_NOSUID, MS_NODEV = 0x2, 0x4
MNT_DETACH = 0x2
INODES = 32_768

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def mount_tmpfs(path: Path, size_mb: int, inodes: int = INODES) -> bool:
    """Mount a tmpfs of `size_mb` at `path` (an existing empty folder); False when not allowed."""
    options = f"size={size_mb}m,nr_inodes={inodes},mode=0755".encode()
    if _libc.mount(b"tidal-workspace", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        error = ctypes.get_errno()
        log.debug("workspace tmpfs at %s not mounted: %s", path, os.strerror(error))
        return False
    return True


def unmount(path: Path) -> None:
    """Unmount `path` if something is mounted there (detaching it if it is still busy)."""
    if _libc.umount2(os.fsencode(path), 0) != 0 and ctypes.get_errno() == 16:  # EBUSY
        _libc.umount2(os.fsencode(path), MNT_DETACH)


def is_mount(path: Path) -> bool:
    return os.path.ismount(path)
