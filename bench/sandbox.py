"""Sandbox pool: what isolation costs per run, isolated runs per second, snapshot/restore, and
verification throughput of warm zygotes against bare `python -m pytest` per sample.

Four measurements, each in this one process, in interleaved rounds after a warm-up (medians):

1. overhead: one isolated run through a warm `SandboxPool` (a forked child of a zygote, in its own
   fresh workspace) of `pass` and of a small pytest file, against the same command as a bare
   subprocess on the host (no sandbox); also one cold bwrap sandbox per run, for reference;
2. runs/s: `pass`-like jobs through a pool of --workers zygotes, and through one zygote;
3. snapshot/restore of a session workspace, when the backend's sessions offer them;
4. verification: the `code` family's answers (8 variants per task) scored by `Scorer.score_many`
   (warm pool, cache off) against `python -m pytest` per sample in a temporary folder, --workers
   at a time; the verdicts (passed or not) must agree.

The result is written into the "## Sandbox pool" section of bench/RESULTS.md.

    python bench/sandbox.py                          # the full run (a few minutes on 2 cores)
    python bench/sandbox.py --runs 5 --jobs 40 --tasks 1 --repeats 1 --no-write   # a smoke run
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import machine, write_section  # noqa: E402
from scoring import plain_pytest, variants  # noqa: E402

SECTION = "## Sandbox pool"
SMALL_TEST = {
    "solution.py": "def double(x):\n    return 2 * x\n",
    "test_solution.py": "from solution import double\n\ndef test_one():\n    assert double(1) == 2\n\n"
                        "def test_two():\n    assert double(2) == 4\n\ndef test_three():\n    assert double(-1) == -2\n",
}
PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--color=no", "test_solution.py"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="runs per way in each overhead round (default 20)")
    parser.add_argument("--jobs", type=int, default=400, help="pass-like jobs per runs/s round (default 400)")
    parser.add_argument("--tasks", type=int, default=6, help="code tasks for the verification round (default 6)")
    parser.add_argument("--workers", type=int, default=2, help="pool size and bare-pytest concurrency (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task generator")
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"), help="file to update")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return parser.parse_args(argv)


def interleaved(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each run per round, every run once per round, after one warm-up call each."""
    for run in runs.values():
        run()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def image_interpreter() -> tuple[str, dict[str, str]]:
    """The sandbox's own interpreter (the default image's) as the host sees it, and the environment
    that gives it the image's packages: the bare baseline runs exactly what the sandbox runs,
    minus the isolation (the venv's interpreter would load the host's site-packages and .pth files)."""
    from tidal.sandbox.bwrap import PYTHON_ROOT, SITE_ROOT, image_mounts

    mounts = image_mounts()
    host = {inside: path for path, inside in mounts.binds}
    python = host[PYTHON_ROOT] + mounts.python[len(PYTHON_ROOT):]
    return python, {"PYTHONPATH": host[SITE_ROOT], "PATH": "/usr/bin:/bin"}


def bare(argv: list[str], files: dict[str, str]) -> int:
    """`argv` as a plain subprocess in a temporary folder holding `files`; the exit code."""
    with tempfile.TemporaryDirectory(prefix="tidal-bench-") as folder:
        for name, content in files.items():
            Path(folder, name).write_text(content)
        env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1", **image_interpreter()[1]}
        return subprocess.run(argv, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=60).returncode


def overhead(args: argparse.Namespace, backend: Any, pool: Any) -> dict[str, float]:
    """Milliseconds per run of `pass` and of SMALL_TEST: isolated (warm pool, cold sandbox) and bare."""
    from tidal.sandbox.base import BatchJob
    from tidal.types import Limits

    limits = Limits(timeout_s=30)
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    flags = ["-s", "-B"]

    def isolated(module: list[str], files: dict[str, str]) -> Callable[[], None]:
        job = BatchJob([backend.python, *flags, "-m", *module], files, limits, env=env)

        def run() -> None:  # one job at a time: the latency of one isolated run
            for _ in range(args.runs):
                (result,) = pool.run_batch([job], preload=["pytest"])
                assert result is not None and result.exit_code in (0, None), result
        return run

    def cold(argv: list[str], files: dict[str, str]) -> Callable[[], None]:
        return lambda: [backend.run([backend.python, *flags, *argv], files, limits, env=env) for _ in range(args.runs)]

    def plain(argv: list[str], files: dict[str, str]) -> Callable[[], None]:
        return lambda: [bare([image_interpreter()[0], *flags, *argv], files) for _ in range(args.runs)]

    runs = {
        "pass, pool": isolated(["main"], {"main.py": "pass\n"}),
        "pass, bare": plain(["-c", "pass"], {}),
        "pass, cold sandbox": cold(["-c", "pass"], {}),
        "pytest, pool": isolated(["pytest", *PYTEST_ARGS], SMALL_TEST),
        "pytest, bare": plain(["-m", "pytest", *PYTEST_ARGS], SMALL_TEST),
        "pytest, cold sandbox": cold(["-m", "pytest", *PYTEST_ARGS], SMALL_TEST),
    }
    seconds = interleaved(runs, args.repeats)
    row = {name: statistics.median(s) / args.runs * 1000 for name, s in seconds.items()}
    for what in ("pass", "pytest"):
        row[f"{what} ratio"] = statistics.median(
            p / b for p, b in zip(seconds[f"{what}, pool"], seconds[f"{what}, bare"]))
    for name, value in row.items():
        print(f"overhead  {name:22s} {value:8.2f}{'x' if 'ratio' in name else ' ms/run'}")
    return row


def runs_per_second(args: argparse.Namespace, backend: Any, pool: Any, single: Any) -> dict[str, float]:
    """Isolated `pass`-like jobs per second through the pool (--workers zygotes) and one zygote."""
    from tidal.sandbox.base import BatchJob
    from tidal.types import Limits

    job = BatchJob([backend.python, "-s", "-B", "-m", "main"], {"main.py": "pass\n"}, Limits(timeout_s=30))

    def through(target: Any) -> Callable[[], None]:
        def run() -> None:
            results = target.run_batch([job] * args.jobs)
            assert all(r is not None and r.exit_code == 0 for r in results)
        return run

    seconds = interleaved({"pool": through(pool), "one zygote": through(single)}, args.repeats)
    row = {f"runs/s, {name}": args.jobs / statistics.median(s) for name, s in seconds.items()}
    row["scaling"] = statistics.median(o / p for p, o in zip(seconds["pool"], seconds["one zygote"]))
    print(f"runs/s    pool of {args.workers}: {row['runs/s, pool']:.0f}, one zygote: {row['runs/s, one zygote']:.0f} "
          f"({row['scaling']:.2f}x)")
    return row


def measure_snapshot_restore(backend: Any, repeats: int) -> dict[str, float] | None:
    """Milliseconds of `snapshot()` and `restore()` of a session holding SMALL_TEST plus 1 MiB, or
    None (with a printed note) when the backend's sessions offer neither."""
    try:
        from tidal.sandbox.session import open_session
        session = open_session(backend, {**SMALL_TEST, "data.bin": "x" * (1 << 20)})
    except (ImportError, TypeError) as error:
        print(f"snapshot  skipped: no sessions on this backend ({error})")
        return None
    with session:
        if not (hasattr(session, "snapshot") and hasattr(session, "restore")):
            print("snapshot  skipped: the session has no snapshot()/restore()")
            return None
        taken, restored = [], []
        for _ in range(max(3, repeats * 5)):
            start = time.perf_counter()
            snapshot = session.snapshot()
            taken.append(time.perf_counter() - start)
            start = time.perf_counter()
            session.restore(snapshot)
            restored.append(time.perf_counter() - start)
    row = {"snapshot ms": statistics.median(taken) * 1000, "restore ms": statistics.median(restored) * 1000}
    print(f"snapshot  {row['snapshot ms']:.1f} ms, restore {row['restore ms']:.1f} ms")
    return row


def verification(args: argparse.Namespace, mode: str) -> dict[str, float]:
    """Samples/s of `Scorer.score_many` on a warm pool (python_tests `mode`) and of bare pytest
    per sample; agreement."""
    from tidal.config.schema import RewardConfig, SandboxConfig
    from tidal.reward import Scorer
    from tidal.tasks import generate_tasks, reference_answer
    from tidal.types import Outcome

    tasks = [task.model_copy(update={"verifier": task.verifier.model_copy(update={"mode": mode})})
             for task in generate_tasks("code", args.tasks, "train", args.seed)]
    items = [(task, answer) for task in tasks for answer in variants(reference_answer(task))]
    verdicts: dict[str, list[bool]] = {}
    with Scorer(RewardConfig(sandbox=SandboxConfig(workers=args.workers), cache=False)) as scorer, \
            ThreadPoolExecutor(max_workers=args.workers) as threads:

        def pool() -> None:
            verdicts["pool"] = [s.outcome is Outcome.PASSED for s in scorer.score_many(items)]

        def plain() -> None:
            python, env = image_interpreter()
            verdicts["bare"] = [code == 0 for code in threads.map(lambda item: plain_pytest(*item, python, env), items)]

        seconds = interleaved({"pool": pool, "bare pytest": plain}, args.repeats)
    row = {f"samples/s, {name}": len(items) / statistics.median(s) for name, s in seconds.items()}
    row["speedup"] = statistics.median(b / p for p, b in zip(seconds["pool"], seconds["bare pytest"]))
    row["samples"] = len(items)
    row["agree"] = sum(a == b for a, b in zip(verdicts["pool"], verdicts["bare"]))
    print(f"verify    {mode:14s} pool {row['samples/s, pool']:.1f} samples/s, bare pytest {row['samples/s, bare pytest']:.1f} "
          f"samples/s: {row['speedup']:.2f}x; verdicts agree on {row['agree']:.0f}/{len(items)}")
    if row["agree"] != len(items):
        raise SystemExit("the pool's verdicts differ from bare pytest's")
    return row


def section(args: argparse.Namespace, rows: dict[str, Any], loads: list[str]) -> str:
    import pytest

    o, r, v, snap = rows["overhead"], rows["runs"], rows["verify"], rows["snapshot"]
    vi = rows["verify in_process"]
    command = "python bench/sandbox.py" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])
    lines = [
        SECTION, "",
        "Isolated runs through a warm `SandboxPool` (a forked child of a zygote that imported pytest once, in a "
        "fresh workspace, every process killed and /tmp emptied after it) against the same command as a bare "
        f"subprocess on the host running the sandbox's own interpreter (the default image's, so both sides import the same "
        f"files). Medians of {args.repeats} interleaved rounds after a warm-up, same process.", "",
        f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}; load average (1 min) at the start of each part: {', '.join(loads)}",
        f"- versions: Python {platform.python_version()}, pytest {pytest.__version__}",
        f"- command: `{command}`", "",
        "| per run (ms) | pool | bare subprocess | pool / bare | cold sandbox | cold / bare |",
        "|---|---:|---:|---:|---:|---:|",
        f"| `pass` | {o['pass, pool']:.1f} | {o['pass, bare']:.1f} | **{o['pass ratio']:.2f}x** | {o['pass, cold sandbox']:.1f} "
        f"| {o['pass, cold sandbox'] / o['pass, bare']:.2f}x |",
        f"| 3-test pytest file | {o['pytest, pool']:.1f} | {o['pytest, bare']:.1f} | **{o['pytest ratio']:.2f}x** "
        f"| {o['pytest, cold sandbox']:.1f} | {o['pytest, cold sandbox'] / o['pytest, bare']:.2f}x |", "",
        f"- isolated `pass`-like runs per second: **{r['runs/s, pool']:.0f}** with a pool of {args.workers} zygotes, "
        f"{r['runs/s, one zygote']:.0f} with one ({r['scaling']:.2f}x)",
        "- snapshot / restore of a session workspace (3 files + 1 MiB): "
        + (f"{snap['snapshot ms']:.1f} ms / {snap['restore ms']:.1f} ms" if snap else "not measured (no snapshot()/restore())"),
        f"- verification, {args.tasks} `code` tasks x 8 answers, {args.workers} at a time, pool (`Scorer.score_many`, "
        "every check of `python_tests`) against bare `python -m pytest` per sample with the same interpreter:",
        f"  - mode auto (out of process: the answer in its own interpreter): **{v['samples/s, pool']:.1f}** samples/s "
        f"vs {v['samples/s, bare pytest']:.1f}: **{v['speedup']:.2f}x**; verdicts agreed on {v['agree']:.0f}/{v['samples']:.0f}",
        f"  - mode in_process: **{vi['samples/s, pool']:.1f}** samples/s vs {vi['samples/s, bare pytest']:.1f}: "
        f"**{vi['speedup']:.2f}x**; verdicts agreed on {vi['agree']:.0f}/{vi['samples']:.0f}",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from tidal.sandbox import get_backend
    from tidal.sandbox.pool import SandboxPool

    args = parse_args(argv)
    backend = get_backend("bwrap")
    loads: list[str] = []

    def load() -> None:
        loads.append(f"{os.getloadavg()[0]:.1f}")

    rows: dict[str, Any] = {}
    with SandboxPool(backend, size=args.workers) as pool, SandboxPool(backend, size=1) as single:
        load()
        rows["overhead"] = overhead(args, backend, pool)
        load()
        rows["runs"] = runs_per_second(args, backend, pool, single)
    load()
    rows["snapshot"] = measure_snapshot_restore(backend, args.repeats)
    rows["verify"] = verification(args, "auto")  # the code family's tasks run out of process under auto
    rows["verify in_process"] = verification(args, "in_process")
    load()
    print(f"load average (1 min) at the start of each part and the end: {', '.join(loads)}")
    if not args.no_write:
        write_section(args.results, SECTION, section(args, rows, loads))
        print(f"wrote the {SECTION!r} section of {args.results}")


if __name__ == "__main__":
    main()
