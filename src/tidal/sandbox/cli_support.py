"""What `tidal sandbox run` and `tidal image build|list` do, apart from argument parsing (cli.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tidal.sandbox.base import SandboxResult, SandboxStatus, get_backend
from tidal.types import Limits

TIMEOUT_EXIT = 124  # what `timeout(1)` exits with, for a run killed at its wall-clock limit


def parse_file_args(specs: list[str]) -> dict[str, bytes]:
    """`SRC[:DEST]` -> {DEST: bytes of SRC}; a folder SRC is copied with everything under it.

    Raises ValueError naming the spec for a missing source or a DEST that leaves the workspace."""
    files: dict[str, bytes] = {}
    for spec in specs:
        source, _, destination = spec.partition(":")
        path = Path(source)
        if not path.exists():
            raise ValueError(f"--file {spec}: {source} does not exist")
        target = destination or path.name
        if path.is_dir():
            for folder, _, names in os.walk(path):
                for name in names:
                    host = Path(folder, name)
                    files[f"{target}/{host.relative_to(path).as_posix()}"] = host.read_bytes()
        else:
            files[target] = path.read_bytes()
    from tidal.sandbox.base import safe_relative_path

    for name in files:
        safe_relative_path(name)
    return files


def run_command(
    argv: list[str], files: dict[str, bytes], image: str, timeout_s: float, memory_mb: int, pids: int, backend: str
) -> SandboxResult:
    """Run `argv` in a fresh sandbox. `python`/`python3` as the command mean the image's interpreter."""
    options: dict[str, Any] = {"image": image} if backend == "bwrap" else {}
    sandbox = get_backend(backend, **options)
    if argv and argv[0] in ("python", "python3"):
        argv = [sandbox.python, *argv[1:]]
    return sandbox.run(argv, dict(files), Limits(timeout_s=timeout_s, memory_mb=memory_mb, pids=pids))


def result_record(result: SandboxResult) -> dict[str, Any]:
    """The JSON `tidal sandbox run --json` prints."""
    return {
        "exit_code": result.exit_code,
        "signal": result.signal,
        "outcome": result.status.value,
        "stdout": result.stdout.decode("utf-8", errors="replace"),
        "stderr": result.stderr.decode("utf-8", errors="replace"),
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
        "wall_s": round(result.wall_s, 4),
        "cpu_s": None if result.cpu_s is None else round(result.cpu_s, 4),
        "max_rss_mb": None if result.max_rss_mb is None else round(result.max_rss_mb, 2),
        "detail": result.detail,
    }


def exit_status(result: SandboxResult) -> int:
    """The command's own exit code; 124 at the wall clock; 128 + N for signal N (as a shell)."""
    if result.status == SandboxStatus.TIMEOUT and result.signal is not None:
        return TIMEOUT_EXIT
    if result.exit_code is not None:
        return result.exit_code
    return 128 + (result.signal or 0)
