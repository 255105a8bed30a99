"""How much of a chat model's base pass rate is answer format: its held-out evaluation before RL
under three ways of posing the same tasks, from one config (default: the real-model main job).

  none      the task's question alone (the chat template's own default system message, if any);
  system    the domain's `system_prompt` (the format described);
  few-shot  the domain's `system_prompt` and `examples` (the format shown), as the config has it.

Each variant is a run with `trainer.steps=0` (evaluation only) in its own folder under --out; the
script prints one Markdown table (pass rate per domain and variant, mean completion tokens) for
docs/experiments/real_model.md.

    python scripts/prompt_ablation.py                       # configs/quickstart_smollm2.yaml
    python scripts/prompt_ablation.py --config my.yaml --out /tmp/ablation
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("none", "system", "few-shot")


def variant_overrides(variant: str, domains: list[str]) -> list[str]:
    """Overrides that strip what `variant` leaves out, for every domain."""
    out: list[str] = []
    for domain in domains:
        if variant in ("none", "system"):
            out.append(f"tasks.domains.{domain}.examples=[]")
        if variant == "none":
            out.append(f"tasks.domains.{domain}.system_prompt=null")
    return out


def evaluate(config: Path, overrides: list[str], out: Path, name: str) -> list[dict]:
    """The before-RL evaluation records of one variant (reused when its folder has them)."""
    from tidal.config import load_config
    from tidal.pipeline.run import Job, start_run

    records = out / name / "eval" / "before.jsonl"
    if not records.is_file():
        cfg = load_config(config, [*overrides, "trainer.steps=0", "run.progress=false"])
        Job(cfg, start_run(cfg, out, name)).execute()
    return [json.loads(line) for line in records.read_text().splitlines()]


def table(results: dict[str, list[dict]]) -> str:
    from tidal.eval.heldout import pass_rates

    rates = {variant: pass_rates(records) for variant, records in results.items()}
    domains = [d for d in next(iter(rates.values())) if d != "overall"] + ["overall"]
    lines = ["| domain | " + " | ".join(results) + " |", "|---" * (len(results) + 1) + "|"]
    for domain in domains:
        cells = [f"{rates[v][domain]['pass_rate']:.3f}" if rates[v].get(domain, {}).get("pass_rate") is not None else "-"
                 for v in results]
        lines.append(f"| {domain} | " + " | ".join(cells) + " |")
    tokens = [sum(r["completion_tokens"] for r in recs) / max(1, sum(r["samples"] for r in recs)) for recs in results.values()]
    lines.append("| mean completion tokens | " + " | ".join(f"{t:.0f}" for t in tokens) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "quickstart_smollm2.yaml")
    parser.add_argument("--out", type=Path, default=Path("runs/prompt_ablation"))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every variant")
    args = parser.parse_args(argv)
    from tidal.config import load_config

    domains = list(load_config(args.config, args.overrides).tasks.domains)
    began = time.monotonic()
    results = {v: evaluate(args.config, [*args.overrides, *variant_overrides(v, domains)], args.out, v)
               for v in args.variants}
    print(f"    python {shlex.join(['scripts/prompt_ablation.py', *(argv if argv is not None else sys.argv[1:])])}"
          f"   # {time.monotonic() - began:.0f} s\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
