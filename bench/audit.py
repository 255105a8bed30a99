"""Task audit throughput: tasks audited per minute with every check on a sample of each built-in
family, and the share of the audit's time each check takes. Code tasks dominate (each runs the
reference k times, null answers, exploit probes, mutants and the impossible variant in the
sandbox); text families score in-process. The baseline for the ratio is the cheap checks alone
(schema, no_reference, leakage, duplicates) on the same tasks, measured in the same run. The
result goes into the "## Task audit" section of bench/RESULTS.md.

    python bench/audit.py                         # 4 tasks per family and split, 2 jobs, k = 5
    python bench/audit.py --per-family 1 --reference-runs 2 --no-write   # a smoke run
    python bench/audit.py --corpus [--baseline-src DIR]   # recall on bench/audit_corpus (audit_recall.py)
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import command_line, write_section

SECTION = "## Task audit"
FAMILIES = ("code", "math", "knowledge", "reasoning", "general")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-family", type=int, default=4, help="tasks per family and split (default 4)")
    parser.add_argument("--jobs", type=int, default=2, help="tasks audited at once (default 2)")
    parser.add_argument("--reference-runs", type=int, default=5, help="runs of each reference (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task generators")
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"), help="file to update")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict[str, object]:
    from tidal.audit import audit_tasks
    from tidal.config.schema import AuditConfig
    from tidal.tasks import generate_tasks, write_tasks

    config = AuditConfig(reference_runs=args.reference_runs)
    rows: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as folder:
        every: list = []
        for family in FAMILIES:
            tasks = [t for split in ("train", "eval") for t in
                     generate_tasks(family, args.per_family, split, args.seed, 1, 5)]  # type: ignore[arg-type]
            every += tasks
            path = Path(folder) / f"{family}.jsonl"
            write_tasks(tasks, path)
            result = audit_tasks([path], config, jobs=args.jobs, progress=False)
            rows[family] = result.summary
            print(f"{family:10s} {result.summary['tasks']:4d} tasks  {result.summary['tasks_per_minute']:8.1f} tasks/min  "
                  f"verdicts {result.summary['verdicts']}")
        path = Path(folder) / "all.jsonl"
        write_tasks(every, path)
        began = time.perf_counter()
        cheap = audit_tasks([path], config, cheap_only=True, jobs=args.jobs, progress=False)
        rows["cheap_only"] = {**cheap.summary, "seconds": round(time.perf_counter() - began, 3)}
    return rows


def section(args: argparse.Namespace, rows: dict[str, object]) -> str:
    command = "python bench/audit.py" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])
    lines = [SECTION, "",
             (f"Tasks audited per minute with every check, on {args.per_family} tasks per family and split (difficulty "
              f"1-5), k = {args.reference_runs} reference runs, {args.jobs} tasks at a time, and the checks that take the "
              "largest shares of the time; the baseline is the cheap checks alone (schema, no_reference, leakage, "
              "duplicates) on all the tasks, in the same run."), "",
             command_line(command), "",
             "| family | tasks | tasks/min | quarantine | warn | largest shares of time |", "|---|---|---|---|---|---|"]
    for family in FAMILIES:
        summary = rows[family]
        assert isinstance(summary, dict)
        shares = sorted(summary["time_share_by_check"].items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"| {family} | {summary['tasks']} | {summary['tasks_per_minute']} | {summary['verdicts']['quarantine']} | "
                     f"{summary['verdicts']['warn']} | {', '.join(f'{k} {v:.0%}' for k, v in shares)} |")
    cheap = rows["cheap_only"]
    assert isinstance(cheap, dict)
    lines += [f"| all, cheap checks only (the baseline) | {cheap['tasks']} | {cheap['tasks_per_minute']} | | | |", "",
              ("Where the time goes: code tasks dominate, since each runs its reference k times, null answers, exploit "
               "probes, mutants and the impossible variant in the sandbox; text families score in-process, so there "
               "the cheap checks (leakage, duplicates) take the largest shares.")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--corpus" in argv and not any(a.startswith("--corpus=") for a in argv):
        # The corpus measurement: broken tasks flagged and sound ones not (bench/audit_recall.py).
        from audit_recall import main as recall

        recall([a for a in argv if a != "--corpus"])
        return
    args = parse_args(argv)
    start_load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = measure(args)
    end_load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at start {start_load}, at the end {end_load}")
    if not args.no_write:
        write_section(args.results, SECTION, section(args, rows))
        print(f"wrote the {SECTION!r} section of {args.results}")


if __name__ == "__main__":
    main()
