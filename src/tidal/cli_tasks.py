"""`tidal tasks import`: datasets in other layouts as tidal task files (tasks/importers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn, Optional

import typer

from tidal.errors import TidalError


def _fail(error: Exception) -> NoReturn:  # as cli.py's (importing it would be a cycle)
    typer.secho(f"error: {error}", fg="red", err=True)
    raise typer.Exit(2)


def tasks_import_command(
    sources: list[Path] = typer.Argument(..., help="dataset files or folders: .jsonl .json .csv .parquet .arrow, or "
                                         "a folder saved by datasets.save_to_disk"),
    format: str = typer.Option(..., "--format", help="hf (tidal's own fields), code-tests, qa, mcq or inspect"),
    out: Path = typer.Option(..., "--out", help="the task file to write (.jsonl or .yaml); written only when every "
                             "row converted"),
    mapping: Optional[list[str]] = typer.Option(None, "--map", help="FIELD=COLUMN, FIELD={template} or "
                                                "FIELD=[a,b,c] (repeatable), e.g. --map question=problem"),
    split: Optional[str] = typer.Option(None, help="the split of a saved dataset to read; tasks of a split other "
                                        "than train get the tidal split eval"),
    domain: Optional[str] = typer.Option(None, help="the tasks' domain (default: the format's: code, math, knowledge)"),
    id: Optional[str] = typer.Option(None, "--id", help="task id template over the row's fields and {row}, {index}, "
                                     "{stem}, e.g. 'gsm8k-{index}' (default: the row's id or task_id, else STEM-ROW)"),
    limit: Optional[int] = typer.Option(None, min=1, help="import the first N rows only"),
) -> None:
    """Convert datasets (Hugging Face, code benchmarks, QA, multiple choice, inspect_ai samples)
    into a tidal task file. Each task keeps its source file and row in metadata.source; a bad row
    fails the import with its file and row, and nothing is written."""
    try:
        from tidal.reward.registry import known_verifiers
        from tidal.tasks.importers import import_tasks, parse_map
        from tidal.tasks.loader import write_tasks

        tasks = import_tasks(sources, format, mapping=parse_map(mapping or []), split=split, domain=domain, id=id,
                             limit=limit, known_verifiers=known_verifiers())
        if not tasks:
            raise TidalError(f"no rows in {', '.join(map(str, sources))}; nothing written")
        write_tasks(tasks, out)
    except TidalError as error:
        _fail(error)
    domains = sorted({task.domain for task in tasks})
    typer.echo(f"wrote {len(tasks)} task(s) ({', '.join(domains)}) to {out}")
