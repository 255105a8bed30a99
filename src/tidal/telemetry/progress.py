"""Live progress on the terminal (rich): phase, step, reward per domain, tokens/s, time left."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class ProgressDisplay:
    """One bar per phase plus a status line. Disabled, it prints nothing (tests, logs)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.console = Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]{task.description:<12}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=self.console,
            disable=not enabled,
        )
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> "ProgressDisplay":
        self._progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._progress.__exit__(kind, error, tb)

    def phase(self, name: str, total: int, completed: int = 0) -> None:
        self._tasks[name] = self._progress.add_task(name, total=total, completed=completed, status="")

    def update(self, name: str, completed: int, status: str = "") -> None:
        self._progress.update(self._tasks[name], completed=completed, status=status)

    def log(self, message: str) -> None:
        if self.enabled:
            self._progress.console.print(message)


def rl_status(metrics: dict[str, Any]) -> str:
    """`reward math 0.42 code 0.31 · 512 tok/s` from one step's metrics."""
    rewards = " ".join(
        f"{key.split('/', 1)[1]} {value:.2f}"
        for key, value in metrics.items()
        if key.startswith("reward/") and key != "reward/mean"
    )
    return f"reward {rewards} · {metrics.get('tokens_per_s', 0):.0f} tok/s"
