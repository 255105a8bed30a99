"""Sandbox pool: what isolation costs per run, isolated runs per second, snapshot/restore, and
verification throughput of warm zygotes against bare `python -m pytest` per sample.

Four measurements, each in this one process, in interleaved rounds after a warm-up (medians):

1. overhead: one isolated run through a warm `SandboxPool` (a forked child of a zygote, in its own
   fresh workspace) of `pass` and of a small pytest file, against the same command as a bare
   subprocess on the host (no sandbox); also one cold bwrap sandbox per run, for reference;
2. runs/s: `pass`-like jobs through a pool of --workers zygotes, and through one zygote;
3. snapshot/restore of a session workspace, when the backend's sessions offer them;
4. verification: the `code` family's answers (8 variants per task) scored by `Scorer.score_many`
   (warm pool: per-task pytest templates, companions; cache off) against `python -m pytest` per
   sample in a temporary folder, --workers at a time; the verdicts (passed or not) must agree;
5. verdicts: those answers and seven hostile ones per task (one that hangs, exits 0 at import,
   rewrites its exit status at exit, returns an always-equal object, leaves a daemon, writes a
   conftest.py, reads the test file) scored by the pool and by the single path (a sandbox and a
   whole pytest session of its own per answer, the answer's process a fresh interpreter): value
   and outcome must be identical; bare pytest's passed-or-not is shown beside (the hostile answers
   fool it, which is the point of the checks).

The result is written into the "## Sandbox pool" section of bench/RESULTS.md.

    python bench/sandbox.py                          # the full run (several minutes on 2 cores)
    python bench/sandbox.py --runs 5 --jobs 40 --tasks 1 --repeats 1 --no-write   # a smoke run
    python bench/sandbox.py --verify-only --tasks 3  # parts 4 and 5 only (prints, writes nothing)
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import signal
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
from results_md import command_line, write_section  # noqa: E402
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
    parser.add_argument("--verify-only", action="store_true", help="only the verification parts (implies --no-write)")
    parser.add_argument("--traceback", default=None,
                        help="the code tasks' python_tests `traceback` style (pytest's --tb; default: the "
                             "verifier's own, line), e.g. short to compare")
    return parser.parse_args(argv)


def interleaved(runs: dict[str, Callable[[], Any]], repeats: int,
                cpu: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Seconds of each run per round, every run once per round, after one warm-up call each; with
    `cpu`, also the CPU seconds this process and every process below it spent on each run."""
    for run in runs.values():
        run()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            before = tree_cpu_s() if cpu is not None else {}
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
            if cpu is not None:
                after = tree_cpu_s()
                cpu.setdefault(name, []).append(sum(after.values()) - sum(before.get(pid, 0.0) for pid in after))
    return seconds


Tree = dict[int, tuple[int, float, float, int, int]]


def process_tree() -> Tree:
    """This process and each live process below it, from /proc (the warm sandboxes' processes are
    this process's descendants): pid -> (depth below this process, own CPU seconds, CPU seconds of
    the children it reaped (user + system), own minor page faults, those of the children it reaped)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float, float, int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                data = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            fields = data[data.rindex(b")") + 2:].split()
            stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick,
                                 (int(fields[13]) + int(fields[14])) / tick, int(fields[7]), int(fields[8]))
    children: dict[int, list[int]] = {}
    for pid, (parent, *_) in stats.items():
        children.setdefault(parent, []).append(pid)
    found: Tree = {}
    pending = [(os.getpid(), 0)]
    while pending:
        pid, depth = pending.pop()
        if pid in stats:
            found[pid] = (depth, *stats[pid][1:])
            pending += [(child, depth + 1) for child in children.get(pid, [])]
    return found


def tree_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system, own and reaped children's) of this process and each live process
    below it (`process_tree`)."""
    return {pid: own + reaped for pid, (_, own, reaped, *_) in process_tree().items()}


def image_interpreter() -> tuple[str, dict[str, str]]:
    """The sandbox's own interpreter (the default image's) as the host sees it, and the environment
    that gives it the image's packages: the bare baseline runs exactly what the sandbox runs,
    minus the isolation (the venv's interpreter would load the host's site-packages and .pth files)."""
    from tidal.sandbox.mounts import PYTHON_ROOT, SITE_ROOT, image_mounts

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


def code_tasks(args: argparse.Namespace, mode: str, count: int, timeout_s: float | None = None) -> list[Any]:
    from tidal.tasks import generate_tasks
    from tidal.types import Limits

    tasks = []
    for task in generate_tasks("code", count, "train", args.seed):
        verifier = {"mode": mode, **({"traceback": args.traceback} if args.traceback else {})}
        update: dict[str, Any] = {"verifier": task.verifier.model_copy(update=verifier)}
        if timeout_s is not None:
            update["limits"] = Limits(timeout_s=timeout_s)
        tasks.append(task.model_copy(update=update))
    return tasks


def ratios(seconds: dict[str, list[float]], cpu: dict[str, list[float]], samples: int) -> dict[str, float]:
    """Samples/s and CPU ms per sample of the pool and of bare pytest (medians over rounds of
    `samples` each), and the medians of the per-round ratios."""
    row: dict[str, float] = {"samples": samples}
    row.update({f"samples/s, {name}": samples / statistics.median(s) for name, s in seconds.items()})
    row.update({f"cpu ms, {name}": statistics.median(c) / samples * 1000 for name, c in cpu.items()})
    row["speedup"] = statistics.median(b / p for p, b in zip(seconds["pool"], seconds["bare pytest"]))
    row["cpu speedup"] = statistics.median(b / p for p, b in zip(cpu["pool"], cpu["bare pytest"]))
    return row


def verification(args: argparse.Namespace, mode: str) -> dict[str, float]:
    """Samples/s of `Scorer.score_many` on a warm pool (python_tests `mode`) and of bare pytest
    per sample; agreement."""
    from tidal.config.schema import RewardConfig, SandboxConfig
    from tidal.reward import Scorer
    from tidal.tasks import reference_answer
    from tidal.types import Outcome

    items = [(task, answer) for task in code_tasks(args, mode, args.tasks) for answer in variants(reference_answer(task))]
    verdicts: dict[str, list[bool]] = {}
    with Scorer(RewardConfig(sandbox=SandboxConfig(workers=args.workers), cache=False)) as scorer, \
            ThreadPoolExecutor(max_workers=args.workers) as threads:

        def pool() -> None:
            verdicts["pool"] = [s.outcome is Outcome.PASSED for s in scorer.score_many(items)]

        def plain() -> None:
            python, env = image_interpreter()
            verdicts["bare"] = [code == 0 for code in threads.map(lambda item: plain_pytest(*item, python, env), items)]

        cpu: dict[str, list[float]] = {}
        seconds = interleaved({"pool": pool, "bare pytest": plain}, args.repeats, cpu)
    row = ratios(seconds, cpu, len(items))
    row["agree"] = sum(a == b for a, b in zip(verdicts["pool"], verdicts["bare"]))
    print(f"verify    {mode:14s} pool {row['samples/s, pool']:.1f} samples/s, bare pytest {row['samples/s, bare pytest']:.1f} "
          f"samples/s: {row['speedup']:.2f}x; CPU per sample {row['cpu ms, pool']:.1f} ms vs "
          f"{row['cpu ms, bare pytest']:.1f} ms: {row['cpu speedup']:.2f}x; verdicts agree on {row['agree']:.0f}/{len(items)}")
    if row["agree"] != len(items):
        raise SystemExit("the pool's verdicts differ from bare pytest's")
    return row


def verification_fresh(args: argparse.Namespace, mode: str, group: int) -> dict[str, float]:
    """As `verification`, in the shape of RL steps: every round scores tasks no earlier round saw
    (so each pays its templates), `group` answers each (the first variants: half right, half wrong);
    the first round is the warm-up."""
    from tidal.config.schema import RewardConfig, SandboxConfig
    from tidal.reward import Scorer
    from tidal.tasks import reference_answer

    tasks = code_tasks(args, mode, args.tasks * (args.repeats + 1))
    rounds = [[(task, answer) for task in tasks[r * args.tasks:(r + 1) * args.tasks]
               for answer in variants(reference_answer(task))[:group]] for r in range(args.repeats + 1)]
    seconds: dict[str, list[float]] = {"pool": [], "bare pytest": []}
    cpu: dict[str, list[float]] = {"pool": [], "bare pytest": []}
    python, env = image_interpreter()
    with Scorer(RewardConfig(sandbox=SandboxConfig(workers=args.workers), cache=False)) as scorer, \
            ThreadPoolExecutor(max_workers=args.workers) as threads:
        for index, items in enumerate(rounds):
            runs = {"pool": lambda items=items: scorer.score_many(items),
                    "bare pytest": lambda items=items: list(threads.map(lambda item: plain_pytest(*item, python, env),
                                                                        items))}
            for name, run in runs.items():
                before, start = tree_cpu_s(), time.perf_counter()
                run()
                took, after = time.perf_counter() - start, tree_cpu_s()
                if index:
                    seconds[name].append(took)
                    cpu[name].append(sum(after.values()) - sum(before.get(pid, 0.0) for pid in after))
    row = {**ratios(seconds, cpu, len(rounds[0])), "group": group}
    print(f"verify-rl {mode:14s} fresh tasks, {group} answers each: pool {row['samples/s, pool']:.1f} samples/s, bare "
          f"pytest {row['samples/s, bare pytest']:.1f}: {row['speedup']:.2f}x; CPU per sample {row['cpu ms, pool']:.1f} ms "
          f"vs {row['cpu ms, bare pytest']:.1f} ms: {row['cpu speedup']:.2f}x")
    return row


def bare_pytest_passes(task: Any, answer: str, timeout_s: float) -> bool:
    """`python -m pytest` on the answer and the tests in a temporary folder, as `plain_pytest` runs
    it, killed (and so not passing) at `timeout_s`: whether it exited 0."""
    from tidal.reward.verifiers.python_tests import extract_code, pytest_targets

    python, extra = image_interpreter()
    with tempfile.TemporaryDirectory(prefix="tidal-bench-") as folder:
        Path(folder, "solution.py").write_text(extract_code(answer))
        for name, content in task.tests.items():
            Path(folder, name).write_text(content)
        env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1", **extra}
        process = subprocess.Popen(
            [python, "-s", "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir=.",
             *pytest_targets(task.tests)], cwd=folder, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            return process.wait(timeout=timeout_s) == 0
        except subprocess.TimeoutExpired:
            return False
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # and whatever the answer left in its session
            except ProcessLookupError:
                pass
            process.wait()


def hostile(reference: str) -> dict[str, str]:
    """Answers to a task whose reference answer is `reference` that try to score without solving it,
    or misbehave, each a fenced block."""
    from tidal.reward.verifiers.python_tests import extract_code

    code = extract_code(reference)
    fn = re.search(r"^def (\w+)\(", code, re.MULTILINE).group(1)  # type: ignore[union-attr]
    wrong = f"def {fn}(*args):\n    return 0\n"
    answers = {
        "hangs": f"def {fn}(*args):\n    while True:\n        pass\n",
        "exits 0 at import": "import os\nos._exit(0)\n" + code,
        "rewrites its exit status": "import atexit, os\natexit.register(lambda: os._exit(0))\n" + wrong,
        "always equal": f"class _Any:\n    def __eq__(self, other):\n        return True\n\n\ndef {fn}(*args):\n    return _Any()\n",
        "leaves a daemon": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(20)\n    os._exit(0)\n" + code,
        "writes a conftest": "open('conftest.py', 'w').write('')\n" + code,
        "reads the tests": "print(open('test_solution.py').read()[:10])\n" + wrong,
    }
    return {name: f"```python\n{answer}```" for name, answer in answers.items()}


def same_verdicts(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """Every answer (variants and hostile ones) through the pool and through the single path:
    (value, outcome) must be identical. Bare pytest's passed-or-not beside, for the record."""
    from tidal.config.schema import RewardConfig, SandboxConfig
    from tidal.reward import Scorer, ScoringContext, get_verifier
    from tidal.sandbox import get_backend
    from tidal.tasks import reference_answer
    from tidal.types import Outcome

    items: list[tuple[Any, str, str]] = []  # (task, kind, answer)
    for task in code_tasks(args, mode, min(args.tasks, 2), timeout_s=4.0):
        reference = reference_answer(task)
        items += [(task, f"variant {n}", answer) for n, answer in enumerate(variants(reference))]
        items += [(task, kind, answer) for kind, answer in hostile(reference).items()]
    with Scorer(RewardConfig(sandbox=SandboxConfig(workers=args.workers), cache=False)) as scorer:
        fast = scorer.score_many([(task, answer) for task, _, answer in items])
    single_path = ScoringContext(get_backend("bwrap"))
    with ThreadPoolExecutor(max_workers=args.workers) as threads:
        alone = list(threads.map(lambda item: get_verifier("python_tests")(item[0], item[2], single_path), items))
        bare = list(threads.map(lambda item: bare_pytest_passes(item[0], item[2], timeout_s=8.0), items))
    differ = [f"{kind}: {(round(a.value, 6), a.outcome.value)} vs {(round(b.value, 6), b.outcome.value)}"
              for (_, kind, _), a, b in zip(items, fast, alone)
              if (round(a.value, 6), a.outcome) != (round(b.value, 6), b.outcome)]
    honest = [index for index, (_, kind, _) in enumerate(items) if kind.startswith("variant")]
    fooled = sorted({kind for (_, kind, _), passed, score in zip(items, bare, fast)
                     if passed and score.outcome is not Outcome.PASSED})
    row = {"answers": len(items), "identical": len(items) - len(differ), "kinds": len({kind for _, kind, _ in items}),
           "outcomes": sorted({score.outcome.value for score in fast}),
           "bare agrees on honest": sum(bare[i] == (fast[i].outcome is Outcome.PASSED) for i in honest),
           "honest": len(honest), "bare fooled by": fooled}
    print(f"verdicts  {mode:14s} pool = single path on {row['identical']}/{len(items)} answers "
          f"(outcomes {', '.join(row['outcomes'])}); bare pytest passed-or-not agrees on "
          f"{row['bare agrees on honest']}/{len(honest)} honest answers and is fooled by: {', '.join(fooled) or 'none'}")
    if differ:
        raise SystemExit(f"the pool's verdicts differ from the single path's: {differ[:5]}")
    return row


def section(args: argparse.Namespace, rows: dict[str, Any]) -> str:
    import pytest

    o, r, v, snap = rows["overhead"], rows["runs"], rows["verify"], rows["snapshot"]
    vi, d, di, vf = rows["verify in_process"], rows["verdicts"], rows["verdicts in_process"], rows["verify fresh"]
    command = "python bench/sandbox.py" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])

    def verification_rows(name: str, row: dict[str, float]) -> list[str]:
        return [f"| {name}, samples/s | {row['samples/s, pool']:.1f} | {row['samples/s, bare pytest']:.1f} "
                f"| **{row['speedup']:.2f}x** faster |",
                f"| {name}, CPU ms per sample | {row['cpu ms, pool']:.1f} | {row['cpu ms, bare pytest']:.1f} "
                f"| **{row['cpu speedup']:.2f}x** less |"]

    lines = [
        SECTION, "",
        "What isolation costs through a warm `SandboxPool` (a zygote's forked child in a fresh workspace, cleaned up "
        "after) against the same command as a bare host subprocess with the sandbox's interpreter, and verification "
        f"of `code` answers ({args.tasks} tasks x 8, {args.workers} at a time) by `Scorer.score_many` on the pool "
        f"against bare `python -m pytest` per sample; the RL-step shape gives every round {args.tasks} tasks no earlier "
        f"round saw, {vf['group']} answers each, half right. Medians of {args.repeats} interleaved rounds after a "
        "warm-up, in one process.", "",
        command_line(command, f"Python {platform.python_version()}", f"pytest {pytest.__version__}"), "",
        "| measure | sandboxed | bare | sandboxed vs bare |",
        "|---|---:|---:|---:|",
        f"| `pass`, ms per run, warm pool | {o['pass, pool']:.1f} | {o['pass, bare']:.1f} "
        f"| **{o['pass ratio']:.2f}x** the time |",
        f"| `pass`, ms per run, cold bwrap sandbox | {o['pass, cold sandbox']:.1f} | {o['pass, bare']:.1f} "
        f"| {o['pass, cold sandbox'] / o['pass, bare']:.2f}x the time |",
        f"| 3-test pytest file, ms per run, warm pool | {o['pytest, pool']:.1f} | {o['pytest, bare']:.1f} "
        f"| **{o['pytest ratio']:.2f}x** the time |",
        f"| 3-test pytest file, ms per run, cold bwrap sandbox | {o['pytest, cold sandbox']:.1f} | {o['pytest, bare']:.1f} "
        f"| {o['pytest, cold sandbox'] / o['pytest, bare']:.2f}x the time |",
        *verification_rows("verification, mode auto", v),
        *verification_rows("verification, mode in_process", vi),
        *verification_rows("verification, RL-step shape (auto)", vf),
        "",
        f"Also measured: isolated `pass`-like runs, {r['runs/s, pool']:.0f}/s with a pool of {args.workers} zygotes "
        f"and {r['runs/s, one zygote']:.0f}/s with one ({r['scaling']:.2f}x); snapshot / restore of a session "
        "workspace (3 files + 1 MiB): "
        + (f"{snap['snapshot ms']:.1f} / {snap['restore ms']:.1f} ms" if snap else "not measured (no snapshot()/restore())")
        + f". Verdicts: the pool and bare pytest agreed on {v['agree']:.0f}/{v['samples']:.0f} (auto) and "
        f"{vi['agree']:.0f}/{vi['samples']:.0f} (in_process) answers; on {d['answers']} answers per mode (8 variants "
        "and 7 hostile kinds per task) the pool's value and outcome equal the single path's (a sandbox and a pytest "
        f"session per answer) on {d['identical']}/{d['answers']} (auto) and {di['identical']}/{di['answers']} "
        f"(in_process), while bare pytest passes these hostile ones: {', '.join(d['bare fooled by']) or 'none'}.",
        "",
        "Where the time goes: a pool job is a fork of a zygote that has imported pytest, and per task a template "
        "collected once per zygote forks each answer, so an answer pays neither an interpreter start nor pytest's "
        "import and collection, which bare pytest pays per sample (the target is 10x). What a pool sample still "
        "costs (pytest's per-test protocol, pages a fork copies on write, the answer's own process out of process, "
        "a template per task and zygote) is in docs/design/sandbox.md, \"Cost\", and split by bench/sandbox_costs.py "
        "below. Load slows bare pytest's start-up more than the pool's forks, so the ratio rises with it.",
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
    if not args.verify_only:
        with SandboxPool(backend, size=args.workers) as pool, SandboxPool(backend, size=1) as single:
            load()
            rows["overhead"] = overhead(args, backend, pool)
            load()
            rows["runs"] = runs_per_second(args, backend, pool, single)
        load()
        rows["snapshot"] = measure_snapshot_restore(backend, args.repeats)
    load()
    rows["verify"] = verification(args, "auto")  # the code family's tasks run out of process under auto
    load()
    rows["verify in_process"] = verification(args, "in_process")
    load()
    rows["verify fresh"] = verification_fresh(args, "auto", group=4)
    load()
    rows["verdicts"] = same_verdicts(args, "auto")
    rows["verdicts in_process"] = same_verdicts(args, "in_process")
    load()
    print(f"load average (1 min) at the start of each part and the end: {', '.join(loads)}")
    if not (args.no_write or args.verify_only):
        write_section(args.results, SECTION, section(args, rows))
        print(f"wrote the {SECTION!r} section of {args.results}")


if __name__ == "__main__":
    main()
