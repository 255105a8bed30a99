"""An RL sweep from one warm start: several arms (each a set of dotted overrides) run from the same
warm-started weights and the same held-out evaluation before RL, in parallel, with held-out
evaluations every `--eval-every` steps, and a table of paired differences (before vs each
evaluation, 95% CI over the eval tasks) per arm.

Issue 2's question is whether RL improves held-out pass rates at all in the quickstart's setup,
and which settings (learning rate, KL to the reference, replay) keep it from drifting. The arms
share everything but their overrides, so their differences are the overrides' doing.

    python scripts/rl_sweep.py --steps 60 --eval-every 20 --parallel 3 \\
        --arm base= --arm lr1e-4=trainer.lr=1e-4 --arm kl="trainer.lr=1e-4 algorithm.kl_coef=0.05"
    python scripts/rl_sweep.py --config configs/smoke.yaml --steps 2 --eval-every 1 --arm a= --no-write

The base run folder (tasks, warm start, evaluation before) is made once under --out/base (or taken
from --base); each arm is a copy of it resumed with the arm's overrides (`tidal train RUN`
semantics). The table goes to docs/experiments/<--name>.md with the exact command.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from seesaw import cell, fresh_copy, shared_base, train_rewards, write_doc


def parse_arm(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition("=")
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise SystemExit(f"--arm {text!r}: expected NAME=OVERRIDES (NAME of letters, digits, '-', '_')")
    if name == "base":
        raise SystemExit("--arm base=...: 'base' is the shared warm start's run folder; name the arm otherwise")
    return name, shlex.split(overrides)


def comparisons(run: Path) -> dict[str, dict[str, Any]]:
    """Eval tag -> `compare(before, tag)` for each evaluation after `before` in the run folder."""
    from tidal.eval.heldout import compare

    folder = run / "eval"
    load = lambda tag: [json.loads(l) for l in (folder / f"{tag}.jsonl").read_text().splitlines() if l.strip()]
    before = load("before")
    tags = sorted(p.stem for p in folder.glob("step-*.jsonl")) + (["after"] if (folder / "after.jsonl").exists() else [])
    return {tag: compare(before, load(tag)) for tag in tags}


def render(name: str, results: dict[str, dict[str, Any]], command: str, info: dict[str, Any], seconds: float) -> str:
    domains = sorted({d for r in results.values() for c in r["comparisons"].values() for d in c["domains"]})
    lines = [
        f"# RL sweep: {name}",
        "",
        (f"Produced by `{command}` on {dt.date.today().isoformat()} ({seconds / 60:.0f} min; {info['machine']}). "
         "Every number below is read from the arms' run folders."),
        "",
        (f"One warm start and one held-out evaluation before RL are shared by every arm; each arm runs up to "
        f"{info['steps']} RL steps of {info['tasks_per_step']} tasks x {info['group_size']} samples and is "
        "evaluated on the held-out tasks every few steps. Cells: held-out pass rate before → at that evaluation "
        "(paired difference [95% CI] over the eval tasks; **bold** when the interval excludes 0)."),
        "",
        "| arm | evaluation | " + " | ".join(domains) + " | overall |",
        "|---|---|" + "---|" * (len(domains) + 1),
    ]
    for arm, result in results.items():
        for tag, comparison in result["comparisons"].items():
            row = [cell(comparison["domains"].get(d, {})) for d in domains] + [cell(comparison["overall"])]
            lines.append(f"| {arm} | {tag} | " + " | ".join(row) + " |")
    lines += ["", "Train reward per domain, mean of the first → last fifth of the arm's RL steps:", ""]
    lines += ["| arm | steps | " + " | ".join(domains) + " |", "|---|---|" + "---|" * len(domains)]
    for arm, result in results.items():
        rewards = result["train_rewards"]
        row = [f"{rewards[d][0]:.2f} → {rewards[d][1]:.2f}" if d in rewards else "-" for d in domains]
        lines.append(f"| {arm} | {result['steps']} | " + " | ".join(row) + " |")
    lines += ["", "Arm overrides (on top of the base config and the common ones):", ""]
    lines += [f"- {arm}: `{' '.join(result['overrides']) or '(none)'}`" for arm, result in results.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "quickstart.yaml")
    parser.add_argument("--name", default="rl_sweep", help="the experiment's name (its doc file)")
    parser.add_argument("--steps", type=int, default=40, help="RL steps per arm")
    parser.add_argument("--eval-every", type=int, default=20, help="held-out evaluation every N steps")
    parser.add_argument("--arm", action="append", type=parse_arm, default=[], help="NAME=OVERRIDES (repeatable)")
    parser.add_argument("--parallel", type=int, default=1, help="arms run at once (subprocesses)")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds; arms still running are stopped")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "sweep")
    parser.add_argument("--base", type=Path, default=None, help="reuse this run folder's warm start and eval before")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for the base run and every arm")
    args = parser.parse_args(argv)
    if not args.arm:
        raise SystemExit("give at least one --arm NAME=OVERRIDES")
    sys.path.insert(0, str(ROOT / "src"))
    from tidal.config import load_config
    from tidal.storage.run import RunFolder

    began = time.perf_counter()
    common = [*args.overrides, "run.progress=false"]
    base_dir = shared_base(args.config, args.out, args.base, common)
    cfg = load_config(RunFolder.open(base_dir).config_path, [])
    arm_overrides = {
        name: [*common, f"trainer.steps={args.steps}", f"eval.every={args.eval_every}", *overrides]
        for name, overrides in args.arm
    }
    script = "import sys; from pathlib import Path; from tidal.pipeline.run import run_training; " \
             "run_training(Path(sys.argv[1]), sys.argv[2:])"
    pending, running = list(arm_overrides), {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    deadline = None if args.time_limit is None else time.monotonic() + args.time_limit
    while pending or running:
        while pending and len(running) < args.parallel:
            name = pending.pop(0)
            arm_dir = args.out / name
            fresh_copy(base_dir, arm_dir)
            log = (args.out / f"{name}.log").open("w")
            print(f"[sweep] {name}: {' '.join(arm_overrides[name])}", flush=True)
            running[name] = subprocess.Popen([sys.executable, "-c", script, str(arm_dir), *arm_overrides[name]],
                                             stdout=log, stderr=subprocess.STDOUT, env=env)
        for name, process in list(running.items()):
            if process.poll() is not None:
                print(f"[sweep] {name}: exit {process.returncode}", flush=True)
                del running[name]
        if deadline is not None and time.monotonic() > deadline:
            for name, process in running.items():
                print(f"[sweep] {name}: stopped at the time limit", flush=True)
                process.kill()
                process.wait()
            running.clear()
            pending.clear()
        time.sleep(1.0)

    results: dict[str, dict[str, Any]] = {}
    for name, overrides in arm_overrides.items():
        arm_dir = args.out / name
        rows = [json.loads(l) for l in (arm_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
        results[name] = {
            "comparisons": comparisons(arm_dir),
            "train_rewards": train_rewards(arm_dir),
            "steps": max((r["step"] for r in rows if r.get("phase") == "rl"), default=0),
            "overrides": [o for o in overrides if o not in common and not o.startswith(("trainer.steps=", "eval.every="))],
        }
    import platform

    gpu = ""
    try:
        import torch

        if torch.cuda.is_available():
            gpu = f", {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    info = {"steps": args.steps, "tasks_per_step": cfg.tasks.tasks_per_step, "group_size": cfg.rollout.group_size,
            "machine": f"{os.cpu_count()} CPU cores{gpu}, {platform.system()}"}
    command = "python scripts/rl_sweep.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    text = render(args.name, results, command.strip(), info, time.perf_counter() - began)
    print(text)
    (args.out / f"{args.name}.md").write_text(text)
    if not args.no_write:
        doc = ROOT / "docs" / "experiments" / f"{args.name}.md"
        write_doc(doc, text)
        print(f"[sweep] wrote {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
