"""The asynchronous loop against the synchronous one, on sandboxed code rewards.

Both sides run the same job from the same seed, each in a fresh run folder: the tiny model
(--hidden, --layers), a short warm start, then --steps GRPO steps on the built-in `code` family,
whose answers are scored by running the task's tests in bwrap sandboxes (`sandbox.workers` at a
time). Group size and completion length are chosen so that generating a batch takes about as long
as scoring it (both times are reported, from the synchronous run's metrics). The synchronous loop
generates, scores and trains in turn; the asynchronous one (`pipeline.mode: async`,
`algorithm.max_staleness`) generates batch b+1 while batch b is scored and batch b-1 trained.

Generation runs with --threads torch threads (default 1) and scoring with --workers sandboxes
(default 2), so that on 2 cores the overlapped stages do not both ask for every core; with 2 torch
threads they slow each other down more (measured: 1.00x at --threads 2).

Reported: the wall time of the RL phase of each (from each run's summary), their ratio, and the
reward reached: the mean train reward of the last steps and the held-out pass rate after RL. The
result goes into the "## Async vs sync" section of bench/RESULTS.md.

    python bench/async_vs_sync.py                 # 6 steps of 2 tasks x 8 samples, 256 new tokens
    python bench/async_vs_sync.py --steps 4 --no-write
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import machine, write_section

SECTION = "## Async vs sync"
LAST = 3  # train reward: mean over this many last steps


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=6, help="RL steps per side (default 6)")
    parser.add_argument("--tasks", type=int, default=2, help="code tasks per step (default 2)")
    parser.add_argument("--group-size", type=int, default=8, help="samples per task (default 8)")
    parser.add_argument("--new-tokens", type=int, default=256, help="max_new_tokens (default 256)")
    parser.add_argument("--hidden", type=int, default=512, help="tiny model width (default 512)")
    parser.add_argument("--layers", type=int, default=8, help="tiny model layers (default 8)")
    parser.add_argument("--max-staleness", type=int, default=1, help="async side's algorithm.max_staleness (default 1)")
    parser.add_argument("--workers", type=int, default=2, help="concurrent scoring sandboxes (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--warm-start", type=int, default=3, help="warm-start steps before RL (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"), help="file to update")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    for name in ("steps", "tasks", "new_tokens", "workers", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.group_size < 2:
        parser.error("--group-size must be >= 2 (a GRPO group needs two samples)")
    return args


def config_text(args: argparse.Namespace) -> str:
    """The job both sides run (the mode is given as an override)."""
    return f"""\
model:
  path: tiny
  tiny: {{hidden_size: {args.hidden}, num_layers: {args.layers}, num_heads: 4, num_kv_heads: 2, intermediate_size: {3 * args.hidden}}}
rollout: {{group_size: {args.group_size}, max_new_tokens: {args.new_tokens}}}
tasks:
  tasks_per_step: {args.tasks}
  domains:
    code: {{family: code, weight: 1, n_train: 64, n_eval: 8, max_difficulty: 1}}
reward:
  sandbox: {{backend: bwrap, workers: {args.workers}}}
trainer: {{steps: {args.steps}, checkpoint_every: {args.steps}, lr: 1.0e-4}}
warm_start: {{steps: {args.warm_start}, batch_size: 8}}
eval: {{samples_per_task: 2}}
run: {{progress: false, seed: {args.seed}}}
"""


def run_side(config: Path, parent: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from tidal.pipeline import quickstart as qs
    from tidal.storage.run import RunFolder

    overrides = [f"pipeline.mode={mode}", f"algorithm.max_staleness={args.max_staleness}"]
    qs.run_quickstart(config, overrides, parent, mode)
    run = RunFolder.open(parent / mode)
    summary = json.loads((run.path / "summary.json").read_text())
    rows = [m for m in run.read_metrics() if m.get("phase") == "rl"]
    mean = lambda key: statistics.fmean(float(m.get(key, 0.0)) for m in rows)
    after = summary["after"].get("code", {}).get("pass_rate")
    return {
        "rl_s": float(summary["run"]["rl_seconds"]),
        "generate_s": mean("generate_s"),
        "score_s": mean("score_s"),
        "train_s": mean("train_s"),
        "trained_samples": sum(int(m.get("trained_samples", 0)) for m in rows),
        "train_reward_last": statistics.fmean(float(m["reward/mean"]) for m in rows[-LAST:]),
        "heldout_after": after,
        "trainer_idle_s": mean("trainer_idle_s") if mode == "async" else None,
        "scorer_idle_s": mean("scorer_idle_s") if mode == "async" else None,
        "sampler_idle_s": mean("sampler_idle_s") if mode == "async" else None,
    }


def report(args: argparse.Namespace, sides: dict[str, dict[str, Any]], command: str) -> str:
    sync, fast = sides["sync"], sides["async"]
    ratio = sync["rl_s"] / max(fast["rl_s"], 1e-9)
    fmt = lambda v: "n/a" if v is None else f"{v:.2f}"
    lines = [
        SECTION,
        "",
        f"`{command}` — {dt.date.today().isoformat()}, {machine()}.",
        "",
        (
            f"Workload: the built-in `code` family (answers scored by running the task's tests in bwrap sandboxes,"
            f" {args.workers} at a time), {args.threads} torch thread(s), the tiny model (hidden {args.hidden}, {args.layers} layers) after {args.warm_start} warm-start steps,"
            f" {args.steps} GRPO steps of {args.tasks} tasks x {args.group_size} samples, up to {args.new_tokens} new tokens,"
            f" seed {args.seed}; each side in a fresh run folder; async with `max_staleness: {args.max_staleness}`."
        ),
        (
            f"Per step in the synchronous run: generate {sync['generate_s']:.2f} s, score {sync['score_s']:.2f} s,"
            f" train {sync['train_s']:.2f} s."
        ),
        "",
        "| | RL wall time (s) | train reward, last steps | held-out pass rate after | trained samples |",
        "|---|---|---|---|---|",
    ]
    for name in ("sync", "async"):
        side = sides[name]
        lines.append(
            f"| {name} | {side['rl_s']:.1f} | {side['train_reward_last']:.3f} | {fmt(side['heldout_after'])}"
            f" | {side['trained_samples']} |"
        )
    lines += [
        "",
        (
            f"**Async / sync speed-up: {ratio:.2f}x** (RL-phase wall time, same steps and samples)."
            f" Async per step: generate {fast['generate_s']:.2f} s, score {fast['score_s']:.2f} s (overlapped, they"
            f" share the cores), trainer idle {fmt(fast['trainer_idle_s'])} s, scorer idle {fmt(fast['scorer_idle_s'])} s,"
            f" sampler idle {fmt(fast['sampler_idle_s'])} s."
        ),
        "",
    ]
    if max(side["trained_samples"] for side in sides.values()) == 0:
        lines += [
            (
                "No step trained: every group's rewards were equal (all 0), so the gate dropped them all and the"
                " reward comparison says nothing; the ratio is the overlap of generation and scoring alone."
            ),
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    command = "python bench/async_vs_sync.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    sides: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tidal-async-vs-sync-") as tmp:
        config = Path(tmp) / "job.yaml"
        config.write_text(config_text(args))
        for mode in ("sync", "async"):
            sides[mode] = run_side(config, Path(tmp), mode, args)
            print(mode, json.dumps(sides[mode]), flush=True)
    text = report(args, sides, command.strip())
    print(text)
    if not args.no_write:
        write_section(args.results, SECTION, text)


if __name__ == "__main__":
    main()
