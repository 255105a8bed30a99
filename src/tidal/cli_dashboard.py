"""`tidal dashboard [RUN_DIRS...]`: serve the dashboard (tidal/dashboard, docs/design/dashboard.md)
over run folders and eval folders, or folders that hold them. Starlette and uvicorn load inside
the command, so `tidal --help` stays fast. Exits 2 when a folder is neither."""

from __future__ import annotations

from pathlib import Path

import typer

from tidal.errors import TidalError


def dashboard_command(
    run_dirs: list[Path] | None = typer.Argument(None, help="run folders, eval folders, or folders holding them (default: runs)"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8765, min=0, max=65535, help="port to listen on"),
) -> None:
    """A local web app over runs and evals: metrics per domain with guard events, audit and
    quarantine counts, trajectory search and step-by-step replay, eval checklists and paired
    comparisons. Live runs refresh themselves; nothing is fetched from the network."""
    import uvicorn

    from tidal.dashboard.app import build_app

    try:
        app = build_app(list(run_dirs or [Path("runs")]))
    except TidalError as error:
        typer.secho(f"error: {error}", fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"tidal dashboard on http://{host}:{port}/", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
