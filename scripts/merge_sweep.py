"""Held-out pass rates of merges between a run's start and one of its RL checkpoints.

`merge.weight` (trainer/merge.py) evaluates and exports `start + w * (trained - start)`. This
script measures that line for several `w` after the fact, from a run folder: the start (the warm
start, else the run's model) is evaluated at w = 0 with the same samples per task, seed and
temperature as every other point, and each point is compared with it (paired over the eval tasks,
95% CI). `--export W DIR` also writes the merge at W as a Hugging Face folder.

    python scripts/merge_sweep.py runs/sweep7/lr7e-4_150 --weights 0.3,0.5,0.7,1 --samples 16
    python scripts/merge_sweep.py runs/qs1/seed1234 --checkpoint step-000100 --export 0.5 /tmp/policy
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def parse_weights(text: str) -> list[float]:
    try:
        weights = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"--weights {text!r}: expected numbers separated by commas, e.g. 0.3,0.5,1") from None
    bad = [w for w in weights if not 0 < w <= 1]
    if not weights or bad:
        raise SystemExit(f"--weights {text!r}: every weight must be in (0, 1]")
    return weights


def cell(result: dict[str, Any]) -> str:
    if result.get("diff") is None:
        return "-"
    text = f"{result['diff']:+.3f} [{result['ci_low']:+.3f}, {result['ci_high']:+.3f}]"
    return f"**{text}**" if result["ci_low"] > 0 or result["ci_high"] < 0 else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder with RL checkpoints")
    parser.add_argument("--checkpoint", default=None, help="an RL checkpoint's folder name (default: the latest)")
    parser.add_argument("--weights", type=parse_weights, default=parse_weights("0.3,0.5,0.7,1"))
    parser.add_argument("--samples", type=int, default=None, help="samples per eval task (default: the run's)")
    parser.add_argument("--export", nargs=2, metavar=("W", "DIR"), default=None, help="write the merge at W to DIR")
    args = parser.parse_args()

    import torch

    from tidal.config import load_config
    from tidal.errors import CheckpointError
    from tidal.eval.heldout import compare, evaluate_policy
    from tidal.models.io import load_model, save_checkpoint
    from tidal.reward.scorer import Scorer
    from tidal.rollout.engine import EmbeddedEngine
    from tidal.storage.run import RunFolder
    from tidal.tasks import load_tasks
    from tidal.trainer.checkpoint import MODEL_DIR, latest_checkpoint
    from tidal.trainer.merge import Merge

    run = RunFolder.open(args.run)
    cfg = load_config(run.config_path, [])
    rl_root = run.checkpoints_dir / "rl"
    checkpoint = rl_root / args.checkpoint if args.checkpoint else latest_checkpoint(rl_root)
    if checkpoint is None or not (checkpoint / MODEL_DIR).is_dir():
        raise CheckpointError(f"{args.run}: no RL checkpoint {args.checkpoint or '(latest)'} under {rl_root}")
    warm = run.checkpoints_dir / "warm-start"
    start_path = str(warm) if cfg.warm_start.enabled else cfg.model.path
    device = torch.device("cpu")
    start = load_model(cfg.model.model_copy(update={"path": start_path}), device)
    trained = load_model(cfg.model.model_copy(update={"path": str(checkpoint / MODEL_DIR)}), device)
    merge = Merge(start.model, 1.0)  # the anchor: the start's weights
    model, tokenizer = trained.model, trained.tokenizer
    trained_state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    tasks = load_tasks([run.path / "tasks" / "eval.jsonl"])
    samples = args.samples or cfg.eval.samples_per_task

    def set_weight(weight: float) -> None:
        model.load_state_dict(trained_state)
        merge.weight = weight
        model.load_state_dict(merge.merged_state(model))

    def evaluate(weight: float) -> list[dict[str, Any]]:
        set_weight(weight)
        return evaluate_policy(
            EmbeddedEngine(model, tokenizer, device), tasks, scorer.score_many, samples_per_task=samples,
            temperature=cfg.eval.temperature, top_p=cfg.rollout.top_p, max_new_tokens=cfg.rollout.max_new_tokens,
            stop=list(cfg.rollout.stop), seed=cfg.run.seed + 7_777, batch_prompts=cfg.rollout.batch_prompts,
        )

    began = time.perf_counter()
    with Scorer(cfg.reward) as scorer:
        before = evaluate(0.0)
        rows = []
        for weight in args.weights:
            comparison = compare(before, evaluate(weight))
            rows.append((weight, comparison))
            print(json.dumps({"weight": weight, "overall": comparison["overall"]}), flush=True)
        if args.export:
            export_weight = parse_weights(args.export[0])[0]
            set_weight(export_weight)
            print(f"merge at {export_weight} written to {save_checkpoint(model, tokenizer, args.export[1])}")

    domains = sorted({d for _, c in rows for d in c["domains"]})
    print(f"\n{checkpoint} merged with {start_path}, {len(tasks)} eval tasks x {samples} samples "
          f"({time.perf_counter() - began:.0f} s). Paired difference from weight 0 [95% CI]:\n")
    print("| weight | " + " | ".join(domains) + " | overall |")
    print("|---|" + "---|" * (len(domains) + 1))
    for weight, comparison in rows:
        print(f"| {weight:g} | " + " | ".join(cell(comparison["domains"][d]) for d in domains)
              + f" | {cell(comparison['overall'])} |")


if __name__ == "__main__":
    main()
