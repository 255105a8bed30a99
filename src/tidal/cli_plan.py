"""`tidal plan CONFIG`: a run's predicted peak memory per rank, part by part, whether it fits on
this machine, and its step time (tidal/trainer/plan.py, docs/design/trainer.md "Planning memory").

Only typer is imported at module level; torch and transformers load inside the command, so
`tidal --help` stays fast. Exits 0 when the run fits, 1 when it does not, 2 on an error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import typer

from tidal.errors import TidalError

GIB, MIB = float(1 << 30), float(1 << 20)


def _fail(error: Exception) -> NoReturn:
    typer.secho(f"error: {error}", fg="red", err=True)
    raise typer.Exit(2)


def plan_command(
    config: Path = typer.Argument(..., help="YAML config"),
    overrides: list[str] | None = typer.Argument(None, help="dotted overrides, e.g. trainer.micro_batch_size=16"),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
    gflops: float | None = typer.Option(None, min=0.001, help="matmul GFLOP/s for the step time (default: measured)"),
) -> None:
    """Predict a run's peak memory per rank (weights, gradients, optimizer state, activations, the
    log-prob head, reference model, every engine's KV pool, async copies, runtime), whether it fits in the memory
    available here, and its step time. Reads the model's config, never its weights; downloads nothing."""
    try:
        from tidal.config import load_config
        from tidal.pipeline.planning import plan_config
        from tidal.pipeline.run import build_tasks

        cfg = load_config(config, list(overrides or []))
        plan = plan_config(cfg, build_tasks(cfg), fetch=False, gflops=gflops)
    except TidalError as error:
        _fail(error)
    record = {"config": str(config), "model": cfg.model.path, **plan.record()}
    typer.echo(json.dumps(record, indent=2) if as_json else "\n".join(format_plan(record)))
    raise typer.Exit(0 if plan.fits else 1)


def _size(value: float) -> str:
    return f"{value / GIB:.2f} GiB" if value >= GIB / 2 else f"{value / MIB:.1f} MiB"


def format_plan(record: dict[str, Any]) -> list[str]:
    """`RunPlan.record` (with `config` and `model`) as a table and a few lines."""
    world = record["world_size"]
    title = (f"plan of {record['config']}: model {record['model']} ({record['parameters'] / 1e6:.2f}M parameters, "
             f"{record['trainable_parameters'] / 1e6:.2f}M trainable), {record['device']}, {world} rank(s), "
             f"{record['precision']}, micro-batch {record['micro_batch_size']} x {record['sequence_tokens']} tokens")
    lines = [title, ""]
    rows = [("part", "phases", "rank 0", "each other rank" if world > 1 else "", "total", "note")]
    for part in record["parts"]:
        phases = "all" if len(part["phases"]) == 3 else ", ".join(part["phases"])
        total = part["rank0_bytes"] + (world - 1) * part["other_rank_bytes"] + part["outside_bytes"]
        other = _size(part["other_rank_bytes"]) if world > 1 else ""
        where = " (host)" if part["host"] and record["device"] != "cpu" else ""
        rows.append((part["part"] + where, phases, _size(part["rank0_bytes"]), other, _size(total), part["note"]))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]), *(c.rjust(w) for c, w in zip(row[2:5], widths[2:5]))]
        lines.append("  ".join(cells + [row[5]]).rstrip())
    lines.append("")
    lines.append(f"peak of rank 0: {_size(record['rank0_peak_bytes'])} (in the {record['rank0_peak_phase']} phase)"
                 + (f"; of each other rank: {_size(record['other_rank_peak_bytes'])}" if world > 1 else ""))
    for check in record["checks"]:
        verdict = "fits" if check["fits"] else "DOES NOT FIT"
        lines.append(f"{check['what']}: {_size(check['predicted_bytes'])} of {_size(check['available_bytes'])} "
                     f"available: {verdict}")
    lines.append(f"available memory: {record['capacity_source']}")
    lines.append(f"KV pool of every engine: {record['kv_blocks']} blocks of {record['kv_block_size']} positions "
                 f"(rollout.kv_blocks; one sequence needs {record['sequence_blocks']}); the run builds each engine with it")
    lines.append(f"activations with gradient checkpointing flipped: "
                 f"{_size(record['activations_with_checkpointing_flipped_bytes'])}")
    if record.get("throughput"):
        t = record["throughput"]
        how = "at once (async)" if t["overlapped"] else "one after the other"
        lines.append(f"step: at most {t['sampling_gflop']:.1f} GFLOP sampling at {t['sampling_matmul_gflops']} GFLOP/s + "
                     f"{t['logprob_gflop']:.1f} log-prob passes + {t['update_gflop']:.1f} update at {t['matmul_gflops']} "
                     f"GFLOP/s ({t['rate_source']}); expected: sampling {t['sampling_seconds']:.1f} s and the update "
                     f"{t['update_seconds']:.1f} s {how}, scoring {t['scoring_cpu_seconds']:.1f} CPU s: about "
                     f"{t['expected_step_seconds']:.1f} s a step, {t['completions_per_second']} completions/s "
                     f"(at least {t['seconds_at_matmul_rate']:.2f} s at the full matmul rate)")
    lines.append(f"fits: {'yes' if record['fits'] else 'no'}")
    lines.append("assumptions:")
    lines += [f"  - {line}" for line in record["assumptions"]]
    return lines
