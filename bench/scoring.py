"""Sandboxed code scoring: batched `python_tests` (one sandbox and one pytest import per task)
against one sandbox per answer, and against plain unsandboxed `python -m pytest` subprocesses.

The answers are those of an RL step on the built-in `code` family: N tasks x 8 distinct answers
each (the reference, a reworded reference, and six wrong or broken variants). All three ways run
`--workers` at a time, in this one process, in interleaved rounds after a warm-up; answers/s is
the median over rounds, the ratios the medians of the per-round ratios. The script also checks
that the batched and the per-answer scores agree. The result is written into the
"## Sandbox scoring" section of bench/RESULTS.md.

    python bench/scoring.py                       # 6 tasks x 8 answers, 2 workers, 3 rounds
    python bench/scoring.py --tasks 2 --repeats 1 --no-write
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidal.types import Score, Task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import command_line, write_section  # noqa: E402

SECTION = "## Sandbox scoring"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=6, help="code tasks per step (default 6)")
    parser.add_argument("--workers", type=int, default=2, help="scoring jobs at a time, reward.sandbox.workers (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task generator")
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"), help="file to update")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return parser.parse_args(argv)


def variants(reference_answer: str) -> list[str]:
    """Eight distinct answers to a task whose reference answer is `reference_answer` (one function)."""
    from tidal.reward.verifiers.python_tests import extract_code

    reference = extract_code(reference_answer)
    name = re.search(r"^def (\w+)\(", reference, re.MULTILINE)
    assert name is not None, reference
    fn = name.group(1)
    renamed = reference.replace(f"def {fn}(", "def _reference(", 1)
    codes = [
        reference,
        f"# {fn}, as asked\n{reference}",
        f"def {fn}(*args):\n    return 0\n",
        f"def {fn}(*args):\n    return None\n",
        f"def {fn}(*args):\n    raise NotImplementedError\n",
        f"def {fn}(x) return x\n",  # syntax error
        f"{renamed}\ndef {fn}(*args):\n    return _reference(*args) + 1\n",  # off by one
        f"{renamed}\ndef {fn}(*args):\n    return _reference(*args) if len(repr(args)) % 2 else 0\n",  # partly right
    ]
    return [f"```python\n{code}```" for code in codes]


def plain_pytest(task: Task, answer: str, python: str = sys.executable, extra_env: dict[str, str] | None = None) -> int:
    """The baseline: the answer and the tests in a temporary folder, `python -m pytest` on the
    host (output capture off, as python_tests runs it), no sandbox, no report plugin, no checks;
    the exit code."""
    from tidal.reward.verifiers.python_tests import extract_code, pytest_targets

    with tempfile.TemporaryDirectory(prefix="tidal-bench-") as folder:
        Path(folder, "solution.py").write_text(extract_code(answer))
        for name, content in task.tests.items():
            Path(folder, name).write_text(content)
        env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1", **(extra_env or {})}
        return subprocess.run(
            [python, "-s", "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--capture=no", "-o", "addopts=",
             "--rootdir=.", *pytest_targets(task.tests)],
            cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
        ).returncode


def compare(args: argparse.Namespace) -> dict[str, float]:
    from tidal.config.schema import RewardConfig, SandboxConfig
    from tidal.reward import Scorer
    from tidal.tasks import generate_tasks, reference_answer

    tasks = generate_tasks("code", args.tasks, "train", args.seed)
    items = [(task, answer) for task in tasks for answer in variants(reference_answer(task))]
    # No cache: every round scores every answer again.
    scorer = Scorer(RewardConfig(sandbox=SandboxConfig(workers=args.workers), cache=False))
    pool = ThreadPoolExecutor(max_workers=args.workers)
    scores: dict[str, list[Score]] = {}

    def batched() -> None:
        scores["batched"] = scorer.score_many(items)

    def per_answer() -> None:  # the unbatched path: one sandbox per answer
        scores["per_answer"] = list(pool.map(lambda item: scorer.score(*item), items))

    def plain() -> None:
        list(pool.map(lambda item: plain_pytest(*item), items))

    runs: dict[str, Callable[[], None]] = {"batched": batched, "per_answer": per_answer, "plain_pytest": plain}
    for run in runs.values():  # warm-up
        run()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    pool.shutdown()
    agree = sum((a.value, a.outcome) == (b.value, b.outcome) for a, b in zip(scores["batched"], scores["per_answer"]))
    outcomes = sorted({s.outcome.value for s in scores["batched"]})
    row: dict[str, float] = {"answers": len(items), "agree": agree}
    for name in runs:
        row[name] = len(items) / statistics.median(seconds[name])
        print(f"{name:14s} {row[name]:6.1f} answers/s  (median of {args.repeats}: {statistics.median(seconds[name]):.2f} s "
              f"for {len(items)} answers)")
    row["vs_per_answer"] = statistics.median(p / b for p, b in zip(seconds["per_answer"], seconds["batched"]))
    row["vs_plain"] = statistics.median(p / b for p, b in zip(seconds["plain_pytest"], seconds["batched"]))
    row["sandbox_cost"] = statistics.median(s / p for s, p in zip(seconds["per_answer"], seconds["plain_pytest"]))
    print(f"batched / one sandbox per answer = {row['vs_per_answer']:.2f}x; batched / plain pytest = {row['vs_plain']:.2f}x")
    print(f"batched and per-answer scores agree on {agree}/{len(items)} answers; outcomes seen: {', '.join(outcomes)}")
    if agree != len(items):
        raise SystemExit("the batched scores differ from the per-answer scores")
    return row


def section(args: argparse.Namespace, row: dict[str, float]) -> str:
    import pytest

    command = "python bench/scoring.py" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])
    lines = [
        SECTION,
        "",
        f"Answers/s of `python_tests` scoring of one RL step's code answers ({args.tasks} `code` tasks x 8 distinct "
        f"answers: the reference, a reworded one, six wrong or broken), {args.workers} at a time, no score cache: "
        "`Scorer.score_many` against `Scorer.score` per answer (a sandbox each) and plain `python -m pytest` per "
        f"answer on the host (no sandbox, no checks). Median of {args.repeats} interleaved rounds after a warm-up in "
        "one process; each ratio is the median of the per-round ratios.",
        "",
        command_line(f"OMP_NUM_THREADS=1 {command}", f"Python {platform.python_version()}", f"pytest {pytest.__version__}"),
        "",
        "| way | answers/s | batched is |",
        "|---|---:|---:|",
        f"| batched (`Scorer.score_many`) | {row['batched']:.1f} | |",
        f"| one sandbox per answer | {row['per_answer']:.1f} | **{row['vs_per_answer']:.2f}x** faster |",
        f"| plain unsandboxed pytest subprocess | {row['plain_pytest']:.1f} | **{row['vs_plain']:.2f}x** faster |",
        "",
        "Where the time goes: an answer scored alone pays an interpreter start and the pytest import, which the "
        "batch pays once per task; per answer it then runs only the pytest session. One sandbox per answer took "
        f"{row['sandbox_cost']:.2f}x the time of plain pytest: both pay a start and an import per answer, and which "
        "is ahead moves with the load. Batched and per-answer scores (value and outcome) agreed on "
        f"{row['agree']:.0f}/{row['answers']:.0f} answers.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    start_load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    row = compare(args)
    end_load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average at start {start_load}, at the end {end_load}")
    if not args.no_write:
        write_section(args.results, SECTION, section(args, row))
        print(f"wrote the {SECTION!r} section of {args.results}")


if __name__ == "__main__":
    main()
