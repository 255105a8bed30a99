"""The `tidal` command. Heavy libraries (torch, transformers) are imported inside the commands, so
`tidal --help` answers at once."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn, Optional

import typer

from tidal.errors import TidalError

app = typer.Typer(
    help="RL post-training of language models on verifiable tasks, and agent evaluation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
tasks_app = typer.Typer(help="Generate and validate task files.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")


def _fail(error: Exception) -> NoReturn:
    typer.secho(f"error: {error}", fg="red", err=True)
    raise typer.Exit(2)


@app.command()
def quickstart(
    out: Path = typer.Option(Path("runs"), help="parent folder of the run folder"),
    name: Optional[str] = typer.Option(None, help="run folder name (default: a timestamp)"),
    config: Optional[Path] = typer.Option(None, help="config file (default: configs/quickstart.yaml)"),
    smoke: bool = typer.Option(False, help="a seconds-long run on a minimal setup (for tests)"),
    overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides, e.g. trainer.steps=10"),
) -> None:
    """Generate multi-domain tasks, warm-start the tiny model, evaluate, RL-train, evaluate again,
    and write summary.json and report.html with the paired before/after difference."""
    try:
        from tidal.pipeline.quickstart import run_quickstart

        report = run_quickstart(config, list(overrides or []), out, name, smoke=smoke)
    except TidalError as error:
        _fail(error)
    typer.echo(f"report: {report}")


@app.command()
def train(
    config: Path = typer.Argument(..., help="YAML config, or an existing run folder to resume"),
    overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides, e.g. trainer.lr=1e-5"),
) -> None:
    """RL-train as the config says (warm start and evaluations included when enabled). Given a run
    folder, resume it from its latest checkpoint."""
    try:
        from tidal.pipeline.quickstart import run_training

        report = run_training(config, list(overrides or []))
    except TidalError as error:
        _fail(error)
    typer.echo(f"report: {report}")


@tasks_app.command("generate")
def tasks_generate(
    family: str = typer.Option(..., help="built-in family: math, code, knowledge, reasoning, general"),
    n: int = typer.Option(100, min=1, help="number of tasks"),
    split: str = typer.Option("train", help="train or eval"),
    out: Path = typer.Option(..., help="output file (.jsonl or .yaml)"),
    seed: int = typer.Option(1234, help="generator seed"),
    min_difficulty: int = typer.Option(1, min=1, max=10),
    max_difficulty: int = typer.Option(3, min=1, max=10),
) -> None:
    """Generate tasks of a built-in family, with graded difficulty and a deterministic seed."""
    if split not in ("train", "eval"):
        _fail(ValueError(f"--split must be train or eval, not {split!r}"))
    try:
        from tidal.tasks import generate_tasks, write_tasks

        tasks = generate_tasks(family, n, split, seed, min_difficulty, max_difficulty)  # type: ignore[arg-type]
        write_tasks(tasks, out)
    except TidalError as error:
        _fail(error)
    typer.echo(f"wrote {len(tasks)} {family} tasks ({split}) to {out}")


@tasks_app.command("validate")
def tasks_validate(paths: list[Path] = typer.Argument(..., help="task files or folders")) -> None:
    """Check task files: every problem with its file, line, task id and field."""
    try:
        from tidal.reward import known_verifiers
        from tidal.tasks import load_tasks

        tasks = load_tasks(list(paths), known_verifiers=known_verifiers())
    except TidalError as error:
        _fail(error)
    by_domain: dict[str, int] = {}
    for task in tasks:
        by_domain[task.domain] = by_domain.get(task.domain, 0) + 1
    detail = ", ".join(f"{d}: {c}" for d, c in sorted(by_domain.items()))
    typer.echo(f"ok: {len(tasks)} tasks ({detail})")


@app.command()
def score(
    tasks: list[Path] = typer.Argument(..., help="task files or folders"),
    task: str = typer.Option(..., "--task", help="task id"),
    answer: Path = typer.Option(..., "--answer", help="file holding the model's answer"),
    backend: str = typer.Option("bwrap", help="sandbox backend: bwrap or unsafe_local"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Score one answer to one task: reward, typed outcome, the quality gate's verdict, components."""
    try:
        from tidal.reward.cli_support import score_command

        result = score_command([str(p) for p in tasks], task, str(answer), backend=backend)
    except TidalError as error:
        _fail(error)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    verdict = "keep" if result["keep"] else f"drop ({result.get('drop_reason', '')})"
    typer.echo(f"{result['task_id']}: reward {result['reward']:.3f}, {result['outcome']}, {verdict}")
    if result.get("detail"):
        typer.echo(f"  {result['detail']}")


def main() -> None:  # pragma: no cover - entry point
    app(prog_name="tidal")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
