"""Where a warm pool's verification CPU goes, per sample: the host, the zygotes, their helpers,
the answers' jobs and the templates.

`bench/sandbox.py` measures the pool against bare pytest; this script splits the pool's side. It
scores the `code` family's answers (bench/scoring.py `variants`) with `Scorer.score_many` on a warm
pool of --workers zygotes, one kind of answer at a time (right, wrong: `return 0`, does not import:
a syntax error), --per-task copies of it for each of --tasks tasks per round, and reads the CPU of
every process below this one from /proc before and after the timed rounds:

- host: this process (the scorer, the pool's threads, reading and judging each job's report);
- zygotes: the zygotes' own work (forks, sweeps between jobs, messages);
- helpers: the zygotes' live helper processes (the nursery, the current templates);
- jobs: what the zygotes report as each job's CPU (`SandboxResult.cpu_s`: the answer's pytest
  process and, out of process, the answer's process, with everything they started), summed;
- templates and the rest: what the zygotes reaped beyond the jobs (the templates that served the
  rounds' tasks, one per task and round here, and processes reaped outside a job's accounting),
  also shown per template started.

The bwrap processes above the zygotes are counted with the helpers. Medians over --repeats rounds
of each kind, in milliseconds per sample. The same readings give each part's minor page faults per
sample (the jobs' and the templates' together: what the zygotes reaped): in a pool, copies of the
pages a fork shares with the process it was forked from, and fresh pages (the count does not tell
them apart). What one copy-on-write fault costs on this host is measured once (`fault_cost_us`: a forked child writing one byte on
each page of its parent's 32 MiB). The section "## Sandbox pool: where a sample's CPU goes" of
bench/RESULTS.md gets both in one table unless --no-write.

    python bench/sandbox_costs.py                      # both modes, about two minutes on 2 cores
    python bench/sandbox_costs.py --modes in_process --repeats 1 --no-write   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from results_md import command_line, write_section  # noqa: E402
from sandbox import Tree, code_tasks, process_tree  # noqa: E402  # bench/sandbox.py
from scoring import variants  # noqa: E402

SECTION = "## Sandbox pool: where a sample's CPU goes"
KINDS = {"right": 0, "wrong (return 0)": 2, "does not import": 5}  # index into scoring.variants
PARTS = ("host", "zygotes", "helpers", "jobs", "templates and the rest")
FAULT_PARTS = ("host", "zygotes", "helpers", "jobs and templates")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["out_of_process", "in_process"],
                        help="python_tests modes (default: out_of_process in_process)")
    parser.add_argument("--tasks", type=int, default=6, help="code tasks per round (default 6)")
    parser.add_argument("--per-task", type=int, default=8, help="answers per task and round (default 8)")
    parser.add_argument("--workers", type=int, default=2, help="pool size (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per kind (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task generator")
    parser.add_argument("--traceback", default=None, help="python_tests verifier arg `traceback` (default: the verifier's)")
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"), help="file to update")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return parser.parse_args(argv)


def zygote_depth(tree: Tree) -> int:
    """The depth of the zygotes below this process: the shallowest Python processes that run
    tidal_zygote (the bwrap processes above them name it among their arguments)."""
    depths = []
    for pid, (depth, *_) in tree.items():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if Path(argv[0].decode()).name.startswith("python") and any(b"tidal_zygote" in arg for arg in argv):
                depths.append(depth)
        except OSError:
            continue
    if not depths:
        raise SystemExit("no zygote found below this process: is the bwrap backend available?")
    return min(depths)


def split(before: Tree, after: Tree, zygotes: int, jobs_s: float, samples: int) -> dict[str, float]:
    """Between two `process_tree` readings: milliseconds per sample of each part of PARTS, and
    minor page faults per sample of each part of FAULT_PARTS (keys prefixed "faults ")."""
    def delta(keep: Callable[[int], bool], field: int) -> float:
        return sum(values[field] - (before[pid][field] if pid in before else 0)
                   for pid, values in after.items() if keep(values[0]))

    def host(depth: int) -> bool:
        return depth == 0

    def zygote(depth: int) -> bool:
        return depth == zygotes

    def helper(depth: int) -> bool:
        return depth != 0 and depth != zygotes

    reaped = delta(zygote, 2)
    parts = {
        "host": delta(host, 1),
        "zygotes": delta(zygote, 1),
        "helpers": delta(helper, 1),
        "jobs": jobs_s,
        "templates and the rest": reaped - jobs_s,
    }
    faults = {"host": delta(host, 3), "zygotes": delta(zygote, 3), "helpers": delta(helper, 3),
              "jobs and templates": delta(zygote, 4)}
    return {**{name: value * 1000 / samples for name, value in parts.items()},
            **{f"faults {name}": value / samples for name, value in faults.items()}}


def fault_cost_us(mib: int = 32, repeats: int = 5) -> float:
    """Microseconds of CPU per copy-on-write page fault on this host: the median over `repeats`
    forked children, each writing one byte on every page of `mib` MiB its parent had written."""
    page = resource.getpagesize()
    memory = bytearray(mib * 2**20)
    for at in range(0, len(memory), page):
        memory[at] = 1
    costs = []
    for _ in range(repeats):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: nothing but the writes between the two readings
            try:
                cpu, faults = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                for at in range(0, len(memory), page):
                    memory[at] = 2
                cpu, faults = time.process_time() - cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
                os.write(write, json.dumps([cpu, faults]).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as reply:
            cpu, faults = json.loads(reply.read())
        os.waitpid(pid, 0)
        costs.append(cpu / max(1, faults) * 1e6)
    return statistics.median(costs)


def measure(args: argparse.Namespace, mode: str) -> dict[str, dict[str, float]]:
    """Per kind of answer: the medians of PARTS, their total, and templates started per round."""

    from tidal.config.schema import RewardConfig, SandboxConfig
    from tidal.reward import Scorer
    from tidal.sandbox import batch
    from tidal.tasks import reference_answer

    jobs: list[float] = []
    templates: list[str] = []
    run_job, open_template = batch.BatchDriver._run_job, batch.BatchDriver._open_template

    def counted_job(self: Any, *rest: Any, **options: Any) -> Any:
        result = run_job(self, *rest, **options)
        jobs.append(result.cpu_s or 0.0)
        return result

    def counted_template(self: Any, job: Any, template: Any, *rest: Any) -> Any:
        templates.append(template.key)
        return open_template(self, job, template, *rest)

    batch.BatchDriver._run_job, batch.BatchDriver._open_template = counted_job, counted_template  # type: ignore[method-assign]
    rows: dict[str, dict[str, float]] = {}
    try:
        tasks = code_tasks(args, mode, args.tasks)
        with Scorer(RewardConfig(sandbox=SandboxConfig(workers=args.workers), cache=False)) as scorer:
            scorer.score_many([(task, answer) for task in tasks for answer in variants(reference_answer(task))])
            zygotes = zygote_depth(process_tree())
            for kind, index in KINDS.items():
                items = [(task, variants(reference_answer(task))[index]) for task in tasks for _ in range(args.per_task)]
                rounds: list[dict[str, float]] = []
                started: list[int] = []
                for _ in range(args.repeats):
                    jobs.clear()
                    templates.clear()
                    before = process_tree()
                    scorer.score_many(items)
                    rounds.append(split(before, process_tree(), zygotes, sum(jobs), len(items)))
                    started.append(len(templates))
                row = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
                row["total"] = statistics.median(sum(r[name] for name in PARTS) for r in rounds)
                row["faults total"] = statistics.median(sum(r[f"faults {name}"] for name in FAULT_PARTS) for r in rounds)
                row["templates"] = statistics.median(started)
                row["per template"] = row["templates and the rest"] * len(items) / max(1.0, row["templates"])
                rows[kind] = row
                print(f"{mode:14s} {kind:18s} " + ", ".join(f"{name} {row[name]:.1f}" for name in (*PARTS, "total"))
                      + f" ms/sample; {row['templates']:.0f} templates, {row['per template']:.0f} ms each; minor faults "
                      + ", ".join(f"{name} {row['faults ' + name]:.0f}" for name in (*FAULT_PARTS, "total")) + " per sample")
    finally:
        batch.BatchDriver._run_job, batch.BatchDriver._open_template = run_job, open_template  # type: ignore[method-assign]
    return rows


def section(args: argparse.Namespace, results: dict[str, dict[str, dict[str, float]]], fault_us: float) -> str:
    every = [row for rows in results.values() for row in rows.values()]
    jobs = [row["jobs"] / row["total"] for row in every]
    faults = [row["faults total"] * fault_us / 1000 / row["total"] for row in every]
    lines = [
        SECTION, "",
        (f"CPU per sample of a warm pool's verification, split by process (bench/sandbox.py measures the pool against "
         f"bare pytest): {args.tasks} `code` tasks x {args.per_task} copies of one kind of answer per round, "
         f"{args.workers} zygotes, medians of {args.repeats} rounds per kind after a warm-up; each round starts each "
         "task's template anew (a zygote holds one template at a time)."), "",
        command_line(f"python bench/sandbox_costs.py{' --no-write' if args.no_write else ''}"), "",
        "| mode | answers | host | zygotes | helpers | jobs | templates and the rest | total | per template "
        "| minor faults | their cost |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, rows in results.items():
        for kind, row in rows.items():
            lines.append(f"| {mode} | {kind} | " + " | ".join(f"{row[name]:.1f}" for name in (*PARTS, "total"))
                         + f" | {row['per template']:.0f} | {row['faults total']:.0f} "
                         + f"| {row['faults total'] * fault_us / 1000:.1f} |")
    lines += ["",
              ("Milliseconds of CPU per sample; per template: per template started; minor page faults per sample, and "
               f"their cost at {fault_us:.1f} us each (`fault_cost_us`: a forked child writing one byte on each page "
               "of its parent's 32 MiB). Host: this process; zygotes: their own work; helpers: the nursery and the "
               "current templates; jobs: what the zygotes report for each job (the answer's pytest process and, out "
               "of process, the answer's own process); templates and the rest: what they reaped beyond the jobs."), "",
              (f"Where the time goes: the jobs take {min(jobs):.0%}-{max(jobs):.0%} of a sample; the templates and the host, zygotes and helpers share the rest. Minor faults (copies "
               "of the pages a fork shares with its zygote or template, and fresh pages) cost "
               f"{min(faults):.0%}-{max(faults):.0%} of the total. Out of process, "
               "the answer's own process and the nursery that forks it add to the jobs and the helpers. "
               "docs/design/sandbox.md, \"Cost\", lists what a sample still pays for.")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"load average (1 min) at the start: {os.getloadavg()[0]:.1f}")
    fault_us = fault_cost_us()
    print(f"a copy-on-write page fault: {fault_us:.1f} us of CPU")
    results = {mode: measure(args, mode) for mode in args.modes}
    if not args.no_write:
        write_section(args.results, SECTION, section(args, results, fault_us))
        print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
