"""Shared by the benchmarks: the machine line, and replacing one "## " section of bench/RESULTS.md."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def write_section(path: Path, heading: str, text: str) -> None:
    """Replace the section titled `heading` (up to the next "## " heading) with `text`, or append it."""
    existing = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = existing.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == heading), None)
    if start is None:
        updated = existing.rstrip("\n") + "\n\n" + text
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        updated = "\n".join(lines[:start] + text.rstrip("\n").splitlines() + [""] + lines[end:]).rstrip("\n") + "\n"
    path.write_text(updated)


def command_line(command: str, *versions: str) -> str:
    """The line under a section's description: the exact command, the machine and the versions it ran with."""
    return f"Command: `{command}` ({machine()}{'; ' + ', '.join(versions) if versions else ''})"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPU cores, {platform.system()}"
