"""The seesaw experiment (issue 7): does single-domain RL trade one capability for another, and does
joint training with normalisation, a curriculum and replay avoid it?

From ONE warm start and its held-out evaluation (shared, so every arm starts from the same weights
and is compared on the same "before" numbers), three RL arms with the same compute budget (steps
x tasks per step x group size):

  (a) code only: every task of every step is a code task;
  (b) joint, static weights: the config's domain weights, nothing else;
  (c) joint + per-domain running reward normalisation + a difficulty curriculum + replay of the
      warm start's data (supervised loss, `algorithm.replay_weight`).

Each arm is a copy of the base run folder resumed with its overrides (`tidal train RUN` semantics:
finished phases are skipped), so its summary.json holds per-domain held-out pass rates before and
after RL with paired 95% confidence intervals over the eval tasks. The script writes the table to
docs/experiments/seesaw.md, with the exact command, and nothing it did not measure.

    python scripts/seesaw.py                      # configs/quickstart.yaml, 40 steps per arm
    python scripts/seesaw.py --steps 10 --out /tmp/seesaw --no-write
    python scripts/seesaw.py --base runs/<quickstart run>   # reuse its warm start and eval before
    python scripts/seesaw.py --config configs/quickstart_smollm2.yaml --steps 20 \
        --doc docs/experiments/seesaw_real_model.md          # the real model (no warm start)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "experiments" / "seesaw.md"

ARMS: dict[str, tuple[str, list[str]]] = {
    "a_code_only": ("(a) code only", ["tasks.domains.{d}.weight=0"]),  # {d}: every domain but code
    "b_joint_static": ("(b) joint, static weights", []),
    "c_joint_norm_curr_replay": (
        "(c) joint + normalisation + curriculum + replay",
        [
            "tasks.domains.{all}.normaliser={kind: running}",
            ("tasks.domains.{all}.curriculum={band_start: [0.05, 0.95], band_end: [0.1, 0.9], min_observations: 8, "
            "suspect_after: 16, retire_after: 16}"),
            "replay.source=base",
            "replay.batch_size=32",
            "algorithm.replay_weight=0.5",
        ],
    ),
}


def expand(overrides: list[str], domains: list[str]) -> list[str]:
    """`{d}` repeats an override for every domain but code, `{all}` for every domain."""
    out: list[str] = []
    for override in overrides:
        if "{d}" in override:
            out += [override.replace("{d}", d) for d in domains if d != "code"]
        elif "{all}" in override:
            out += [override.replace("{all}", d) for d in domains]
        else:
            out.append(override)
    return out


def fresh_copy(base: Path, target: Path) -> None:
    """The base run folder after its evaluation before RL, as a new arm: later phases forgotten."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(base, target, ignore=shutil.ignore_patterns("trajectories", "rl", "summary.json", "report.html"))
    (target / "trajectories").mkdir(exist_ok=True)
    state_path = target / "state.json"
    state = json.loads(state_path.read_text())
    for key in ("rl", "eval_after", "done"):
        state.pop(key, None)
    state_path.write_text(json.dumps(state, indent=2))
    metrics = target / "metrics.jsonl"
    if metrics.exists():  # keep the warm start's rows, drop the base's (empty) RL and eval rows
        rows = [r for r in metrics.read_text().splitlines() if '"phase":"warm_start"' in r.replace(" ", "")]
        metrics.write_text("".join(r + "\n" for r in rows))


def shared_base(config: Path, out: Path, base: Path | None, overrides: list[str]) -> Path:
    """`out/base`: the run every arm copies (tasks, warm start, evaluation before RL), copied from
    `base` when given, else made here from `config` and `overrides` (unless already there)."""
    from tidal.config import load_config
    from tidal.pipeline.run import Job, start_run

    out.mkdir(parents=True, exist_ok=True)
    base_dir = out / "base"
    if base is not None and not (base_dir / "state.json").exists():
        fresh_copy(base, base_dir)
    if not (base_dir / "state.json").exists() or "eval_before" not in json.loads((base_dir / "state.json").read_text()):
        if base_dir.exists():
            shutil.rmtree(base_dir)
        cfg = load_config(config, [*overrides, "trainer.steps=0"])
        Job(cfg, start_run(cfg, out, "base")).execute()  # tasks, warm start, eval before (and a 0-step RL)
    return base_dir


def write_doc(doc: Path, text: str) -> None:
    """Write the measured `text` to `doc`, keeping its hand-written "## What it shows" section."""
    doc.parent.mkdir(parents=True, exist_ok=True)
    previous = doc.read_text() if doc.exists() else ""
    notes = previous.split("\n## What it shows\n", 1)[1] if "\n## What it shows\n" in previous else ""
    doc.write_text(text + ("\n## What it shows\n" + notes if notes else ""))


def train_rewards(run: Path) -> dict[str, tuple[float, float]]:
    """Per domain: mean train reward over the first and the last fifth of the RL steps."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("phase") == "rl"]
    if not rows:
        return {}
    fifth = max(1, len(rows) // 5)
    out: dict[str, tuple[float, float]] = {}
    for key in sorted({k for r in rows for k in r if k.startswith("reward/") and k != "reward/mean"}):
        first = [r[key] for r in rows[:fifth] if key in r]
        last = [r[key] for r in rows[-fifth:] if key in r]
        if first and last:
            out[key.split("/", 1)[1]] = (statistics.fmean(first), statistics.fmean(last))
    return out


def cell(entry: dict[str, Any]) -> str:
    if entry.get("diff") is None:
        return "n/a"
    sign = "**" if entry["ci_low"] > 0 or entry["ci_high"] < 0 else ""
    return f"{entry['before']:.3f} → {entry['after']:.3f} ({sign}{entry['diff']:+.3f}{sign} [{entry['ci_low']:+.3f}, {entry['ci_high']:+.3f}])"


def render(results: dict[str, dict[str, Any]], command: str, base_cfg: dict[str, Any], seconds: float) -> str:
    domains = sorted({d for r in results.values() for d in r["summary"]["domains"]})
    lines = [
        "# The seesaw experiment" + ("" if base_cfg.get("model") in (None, "tiny") else f" on {base_cfg['model']}"),
        "",
        (f"Produced by `{command}` on {dt.date.today().isoformat()} ({seconds / 60:.0f} min on this machine: "
        "2 CPU cores, no GPU). Every number below is read from the arms' `summary.json` and `metrics.jsonl`."),
        "",
        (f"One {'warm start and one ' if base_cfg.get('warm_start') else ''}held-out evaluation before RL "
        "is shared by the three arms; each arm then "
        f"runs {base_cfg['steps']} RL steps of {base_cfg['tasks_per_step']} tasks x {base_cfg['group_size']} "
        "samples (the same compute budget), and the held-out tasks are evaluated again. Cells: held-out pass "
        "rate before → after (paired difference [95% CI] over the domain's eval tasks; **bold** when the "
        "interval excludes 0)."),
        "",
        "| arm | " + " | ".join(domains) + " | overall |",
        "|---|" + "---|" * (len(domains) + 1),
    ]
    for name, result in results.items():
        summary = result["summary"]
        row = [cell(summary["domains"].get(d, {})) for d in domains] + [cell(summary["overall"])]
        lines.append(f"| {ARMS[name][0]} | " + " | ".join(row) + " |")
    lines += ["", "Train reward per domain, mean of the first → last fifth of the RL steps (tasks the arm trained on):", ""]
    lines += ["| arm | " + " | ".join(domains) + " |", "|---|" + "---|" * len(domains)]
    for name, result in results.items():
        rewards = result["train_rewards"]
        row = [f"{rewards[d][0]:.2f} → {rewards[d][1]:.2f}" if d in rewards else "-" for d in domains]
        lines.append(f"| {ARMS[name][0]} | " + " | ".join(row) + " |")
    lines += ["", "Arm overrides (on top of the base config):", ""]
    for name, result in results.items():
        lines.append(f"- {ARMS[name][0]}: `{' '.join(result['overrides']) or '(none)'}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "quickstart.yaml")
    parser.add_argument("--steps", type=int, default=40, help="RL steps per arm")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "seesaw")
    parser.add_argument("--base", type=Path, default=None,
                        help="start from this run folder's warm start and evaluation before RL (e.g. a "
                        "`tidal quickstart` run with the same config) instead of running them here")
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--no-write", action="store_true", help="print the table, do not write --doc")
    parser.add_argument("--doc", type=Path, default=DOC, help="the experiment record to write (default docs/experiments/seesaw.md)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every arm, e.g. trainer.lr=1e-4")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from tidal.config import load_config
    from tidal.pipeline.run import run_training
    from tidal.storage.run import RunFolder

    began = time.perf_counter()
    common = [*args.overrides, "run.progress=false"]
    base_dir = shared_base(args.config, args.out, args.base, common)
    cfg = load_config(RunFolder.open(base_dir).config_path, [])
    domains = list(cfg.tasks.domains)
    results: dict[str, dict[str, Any]] = {}
    for name in args.arms:
        overrides = [*common, f"trainer.steps={args.steps}", *expand(ARMS[name][1], domains)]
        arm_dir = args.out / name
        if not (arm_dir / "summary.json").exists():
            fresh_copy(base_dir, arm_dir)
            print(f"[seesaw] {name}: {' '.join(overrides)}", flush=True)
            run_training(arm_dir, overrides)
        results[name] = {
            "summary": json.loads((arm_dir / "summary.json").read_text()),
            "train_rewards": train_rewards(arm_dir),
            "overrides": [o for o in overrides if o != "run.progress=false"],
        }
    base_cfg = {"steps": args.steps, "tasks_per_step": cfg.tasks.tasks_per_step, "group_size": cfg.rollout.group_size,
                "model": cfg.model.path, "warm_start": cfg.warm_start.enabled}
    command = "python scripts/seesaw.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    text = render(results, command.strip(), base_cfg, time.perf_counter() - began)
    print(text)
    if not args.no_write:
        write_doc(args.doc, text)
        print(f"[seesaw] wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
