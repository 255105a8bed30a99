"""The asynchronous loop against the synchronous one, on sandboxed code rewards, on each backend.

All sides run the same job from the same warm-started weights, each in a fresh run folder: the
tiny model (--hidden, --layers), warm-started once (--warm-start steps on the `code` family's
references, shared by every side), then --steps GRPO steps on the built-in `code` family, whose
answers are scored by running the task's tests in bwrap sandboxes (`sandbox.workers` at a time).
The synchronous loop generates, scores and trains in turn; the asynchronous one (`pipeline.mode:
async`, `algorithm.max_staleness`) generates batch b+1 while batch b is scored and batch b-1
trained, once with the `local` backend (threads) and once with `ray` (Ray actors on a Ray started
in the process), unless --backends says otherwise.

Two workloads. By default the tests are the family's own, CPU-bound: generation and scoring then
compete for the same 2 cores, and the overlap can only win what one stage leaves idle, less than
the perfect-overlap bound the report gives (the synchronous step over its longest stage). With --test-wait-s W every task gets one more
test that waits W seconds, as integration tests waiting on I/O do: scoring then takes wall time
without CPU, the situation of a GPU cluster whose sandboxes run beside the accelerators (or a
remote sandbox service), where the two stages use different resources.

Generation runs with --threads torch threads (default 1) and scoring with --workers sandboxes.
Reported per side: the wall time of the RL phase (from each run's summary), the speed-up over the
synchronous run, and the reward reached (mean train reward of the last steps, held-out pass rate
after RL, samples trained). The result goes into the "## Async vs sync" section of bench/RESULTS.md
(or "## Async vs sync, I/O-bound tests" with --test-wait-s).

    python bench/async_vs_sync.py                      # CPU-bound tests, sync / async local / async ray
    python bench/async_vs_sync.py --test-wait-s 0.5    # tests that wait on I/O
    python bench/async_vs_sync.py --steps 4 --backends local --no-write
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import command_line, write_section

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
    parser.add_argument("--warm-start", type=int, default=300, help="warm-start steps, shared by all sides (default 300)")
    parser.add_argument("--backends", nargs="+", default=["local", "ray"], choices=["local", "ray"],
                        help="backends of the async side (default: local ray)")
    parser.add_argument("--test-wait-s", type=float, default=0.0,
                        help="one more test per task that waits this long (I/O-bound tests; default 0: none)")
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


def task_file(args: argparse.Namespace, folder: Path) -> Path:
    """The `code` family's tasks (train and eval), each with one more test that waits
    --test-wait-s seconds when that is set (it runs for every answer, after the others)."""
    from tidal.tasks import generate_tasks, write_tasks

    tasks = generate_tasks("code", 64, "train", args.seed, 1, 1) + generate_tasks("code", 8, "eval", args.seed, 1, 1)
    if args.test_wait_s > 0:
        for task in tasks:
            name = min(task.tests)
            task.tests[name] += f"\n\ndef test_zz_waits_on_io():\n    import time\n    time.sleep({args.test_wait_s})\n"
    path = folder / "code_tasks.jsonl"
    write_tasks(tasks, path)
    return path


def config_text(args: argparse.Namespace, tasks: Path, model: str = "tiny", warm_steps: int = 0) -> str:
    """The job every side runs (mode and backend are given as overrides)."""
    return f"""\
model:
  path: {model}
  tiny: {{hidden_size: {args.hidden}, num_layers: {args.layers}, num_heads: 4, num_kv_heads: 2, intermediate_size: {3 * args.hidden}}}
rollout: {{group_size: {args.group_size}, max_new_tokens: {args.new_tokens}}}
tasks:
  tasks_per_step: {args.tasks}
  domains:
    code: {{sources: [{tasks}], weight: 1}}
reward:
  sandbox: {{backend: bwrap, workers: {args.workers}}}
trainer: {{steps: {args.steps}, checkpoint_every: {max(args.steps, 1)}, lr: 1.0e-4}}
warm_start: {{enabled: {str(warm_steps > 0).lower()}, steps: {max(warm_steps, 1)}, batch_size: 8, share: 0.5}}
eval: {{samples_per_task: 2}}
run: {{progress: false, seed: {args.seed}}}
"""


def warm_started(args: argparse.Namespace, folder: Path, tasks: Path) -> str:
    """Warm-start the tiny model once (a run with no RL steps); the checkpoint every side loads."""
    from tidal.pipeline import quickstart as qs

    config = folder / "warm.yaml"
    config.write_text(config_text(args, tasks, warm_steps=args.warm_start))
    qs.run_quickstart(config, ["trainer.steps=0"], folder, "warm")
    return str(folder / "warm" / "checkpoints" / "warm-start")


def run_side(config: Path, parent: Path, side: str, args: argparse.Namespace) -> dict[str, Any]:
    from tidal.pipeline import quickstart as qs
    from tidal.storage.run import RunFolder

    mode, _, backend = side.partition("-")
    overrides = [f"pipeline.mode={mode}", f"algorithm.max_staleness={args.max_staleness}"]
    if backend:
        overrides.append(f"pipeline.backend={backend}")
    qs.run_quickstart(config, overrides, parent, side)
    run = RunFolder.open(parent / side)
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
        "step_s": mean("step_s") if mode == "async" else None,
        # The first step holds the backend's start (Ray: its actors import torch and tidal, and
        # receive the model); the later ones are the steady state.
        "first_step_s": float(rows[0].get("step_s", 0.0)) if rows and mode == "async" else None,
        "later_step_s": (statistics.fmean(float(m.get("step_s", 0.0)) for m in rows[1:])
                         if len(rows) > 1 and mode == "async" else None),
    }


def report(args: argparse.Namespace, sides: dict[str, dict[str, Any]], command: str) -> str:
    sync = sides["sync"]
    fmt = lambda v: "n/a" if v is None else f"{v:.2f}"
    stages = [sync["generate_s"], sync["score_s"], sync["train_s"]]
    bound = sum(stages) / max(max(stages), 1e-9)
    workload = (
        f"the family's own CPU-bound tests plus one that waits {args.test_wait_s:g} s (as tests waiting on I/O do)"
        if args.test_wait_s > 0 else "the family's own tests (CPU-bound)"
    )
    lines = [
        section_name(args),
        "",
        (
            "Wall time of the RL phase, the synchronous loop against the asynchronous one (`pipeline.mode: async`,"
            f" `max_staleness: {args.max_staleness}`) on each backend, same job from the same warm-started weights:"
            f" the built-in `code` family, difficulty 1, {workload}, scored in bwrap sandboxes ({args.workers} at a"
            f" time); the tiny model (hidden {args.hidden}, {args.layers} layers, warm-started {args.warm_start} steps);"
            f" {args.steps} GRPO steps of {args.tasks} tasks x {args.group_size} samples, up to {args.new_tokens} new"
            f" tokens, {args.threads} torch thread(s), seed {args.seed}."
        ),
        "",
        command_line(command),
        "",
        "| side | RL wall time (s) | speed-up over sync | train reward, last steps | held-out pass rate after | trained samples |",
        "|---|---|---|---|---|---|",
    ]
    for name, side in sides.items():
        ratio = sync["rl_s"] / max(side["rl_s"], 1e-9)
        lines.append(
            f"| {name} | {side['rl_s']:.1f} | {'**' + format(ratio, '.2f') + 'x**' if name != 'sync' else '1.00x'}"
            f" | {side['train_reward_last']:.3f} | {fmt(side['heldout_after'])} | {side['trained_samples']} |"
        )
    where = [
        f"Where the time goes: a synchronous step is generate {sync['generate_s']:.2f} s, score {sync['score_s']:.2f} s"
        f" and train {sync['train_s']:.2f} s; perfect overlap of the three (each on its own resources) would be"
        f" {bound:.2f}x. The staleness bound allows no step shorter than its chain, (generate + score + train) /"
        " (max_staleness + 1)."
    ]
    for name, side in sides.items():
        if name != "sync":
            where.append(
                f"{name}: a step of {side['step_s']:.2f} s (generate {side['generate_s']:.2f} s and score"
                f" {side['score_s']:.2f} s overlapped; idle: trainer {fmt(side['trainer_idle_s'])} s, scorer"
                f" {fmt(side['scorer_idle_s'])} s, sampler {fmt(side['sampler_idle_s'])} s), a chain of"
                f" {chain_s(side, args.max_staleness):.2f} s."
            )
    if "async-local" in sides and "async-ray" in sides:
        local, ray = sides["async-local"], sides["async-ray"]
        where.append(
            f"Ray's RL phase took {ray['rl_s'] - local['rl_s']:+.1f} s ({ray['rl_s'] / max(local['rl_s'], 1e-9):.2f}x)"
            f" against the local backend's: its first step {fmt(ray['first_step_s'])} s (local"
            f" {fmt(local['first_step_s'])} s: Ray starting, its actors importing torch and tidal and receiving the"
            f" model), its later steps {fmt(ray['later_step_s'])} s (local {fmt(local['later_step_s'])} s: each weight"
            " version goes through the object store)."
        )
    where.append(
        "Scoring here waits as well as computes, so the stages overlap up to the staleness bound (batch b + s + 1"
        " is not generated before batch b is trained: docs/design/loop.md, \"The staleness bound\")."
        if args.test_wait_s > 0 else
        "Here the three stages are CPU-bound and share the machine's cores, so the overlap can only fill what each"
        " stage leaves idle, and each overlapped stage runs slower than alone."
    )
    where.append(
        "Trained samples differ because the gate drops groups whose rewards are all equal, and which groups those are"
        f" depends on the weights that sampled them; the train reward is the mean of the last {LAST} steps."
    )
    lines += ["", " ".join(where), ""]
    if max(side["trained_samples"] for side in sides.values()) == 0:
        lines += [
            (
                "No step trained: every group's rewards were equal, so the gate dropped them all and the"
                " reward comparison says nothing; the ratio is the overlap of generation and scoring alone."
            ),
            "",
        ]
    return "\n".join(lines)


def chain_s(side: dict[str, Any], max_staleness: int) -> float:
    """The shortest step the staleness bound allows at one side's stage times: batch b + s + 1 is
    not generated before batch b is trained, so each s + 1 steps hold one generate, one score and
    one train of a batch one after another."""
    return (side["generate_s"] + side["score_s"] + side["train_s"]) / (max_staleness + 1)


def section_name(args: argparse.Namespace) -> str:
    return SECTION + (", I/O-bound tests" if args.test_wait_s > 0 else "")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    command = "python bench/async_vs_sync.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    sides: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tidal-async-vs-sync-") as tmp:
        folder = Path(tmp)
        tasks = task_file(args, folder)
        model = warm_started(args, folder, tasks)
        config = folder / "job.yaml"
        config.write_text(config_text(args, tasks, model=model))
        for side in ["sync", *(f"async-{backend}" for backend in args.backends)]:
            sides[side] = run_side(config, folder, side, args)
            print(side, json.dumps(sides[side]), flush=True)
    text = report(args, sides, command.strip())
    print(text)
    if not args.no_write:
        write_section(args.results, section_name(args), text)


if __name__ == "__main__":
    main()
