"""Helpers for sandbox probes."""

from __future__ import annotations

import os


def processes_with(marker: str) -> list[int]:
    """Pids of live processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                if marker.encode() in file.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found
