"""LoRA against full fine-tuning: step time and peak memory of `Trainer.rl_step` on a real checkpoint.

Each side runs in its own subprocess (so its peak memory is its own) with --threads torch threads:
the model loaded from --model, the policy (full: every weight trains; lora: `trainer.lora` with
--rank on all linear layers), with --kl > 0 the KL reference (full: a copy of the model; lora: the
base with the adapter off, no copy), one untimed update (AdamW's state is allocated there), then
--steps timed ones on the same batch: --rows rows of --prompt random prompt tokens and --new
completion tokens, GRPO-like advantages (+-1), old logprobs = the model's own. Reported per side:
the mean update's wall and CPU seconds, the ratio against full fine-tuning measured in the same
run, trainable parameters, and peak resident set (the process's high-water mark, model load
included) and its growth from just after the model was loaded (the reference, gradients, AdamW
state and the updates' activations).

    python bench/lora_vs_full.py --model ~/.cache/tidal/models/smollm2
    python bench/lora_vs_full.py --model ~/.cache/tidal/models/smollm2 --rows 4 --prompt 32 --new 32 --steps 2 --no-write
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import command_line, write_section

SECTION = "## LoRA vs full fine-tuning"
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
SIDES = ("full", "lora")


def _rss_gib() -> float:
    """The resident set now (GiB), from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("/proc/self/status has no VmRSS line")


def _batch(model: Any, rows: int, prompt: int, new: int, seed: int) -> Any:
    import torch

    from tidal.trainer.logprobs import token_logprobs
    from tidal.types import TrainBatch

    generator = torch.Generator().manual_seed(seed)
    length = prompt + new
    device = next(model.parameters()).device
    input_ids = torch.randint(0, model.config.vocab_size, (rows, length), generator=generator).to(device)
    attention_mask = torch.ones_like(input_ids)
    completion_mask = torch.zeros(rows, length, device=device)
    completion_mask[:, prompt:] = 1.0
    with torch.no_grad():
        old, _ = token_logprobs(model, input_ids, attention_mask)
    advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(rows)], device=device)
    return TrainBatch(input_ids, attention_mask, completion_mask, old * completion_mask, advantages)


def run_side(args: argparse.Namespace) -> dict[str, Any]:
    """One side's measurement, in this process."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from tidal.config.scale import LoraConfig
    from tidal.config.schema import AlgorithmConfig, TrainerConfig
    from tidal.trainer.lora import apply_lora
    from tidal.trainer.trainer import Trainer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cuda = args.device == "cuda"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device)
    batch = _batch(model, args.rows, args.prompt, args.new, seed=0)
    loaded_rss = torch.cuda.memory_allocated() / 2**30 if cuda else _rss_gib()
    reference = None
    if args.side == "lora":
        apply_lora(model, LoraConfig(enabled=True, r=args.rank, alpha=2.0 * args.rank), seed=0)
    elif args.kl > 0:
        reference = copy.deepcopy(model).eval()
    algo = AlgorithmConfig(kl_coef=args.kl)
    cfg = TrainerConfig(lr=1e-5, micro_batch_size=args.rows, precision=args.precision)
    trainer = Trainer(model, cfg, algo, args.device, total_steps=args.steps + 1, ref_model=reference, max_tokens=args.new)
    trainer.rl_step(batch)  # untimed: AdamW's state is allocated here
    walls, cpus = [], []
    for _ in range(args.steps):
        wall, cpu = time.perf_counter(), time.process_time()
        metrics = trainer.rl_step(batch)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        if metrics["skipped"]:
            raise RuntimeError(f"{args.side}: an update was skipped ({metrics})")
    if cuda:
        torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() / 2**30 if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)  # KiB -> GiB
    return {
        "side": args.side, "wall_s": sum(walls) / len(walls), "cpu_s": sum(cpus) / len(cpus),
        "trainable": sum(p.numel() for p in trainer.params), "parameters": sum(p.numel() for p in model.parameters()),
        "peak_gib": peak, "growth_gib": peak - loaded_rss, "precision": trainer.setup["precision"],
    }


def _section(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> str:
    import torch
    import transformers

    full = results["full"]
    clock, key = ("wall", "wall_s") if args.device == "cuda" else ("CPU", "cpu_s")  # a GPU's work is no CPU time
    kl = (f"KL {args.kl} in the loss (full: a reference copy of the model; lora: the base with the adapter off)"
          if args.kl > 0 else "no KL")
    lines = [
        SECTION, "",
        f"One `Trainer.rl_step` (PPO-clip, token aggregation, one AdamW step, {kl}) of a real checkpoint "
        f"({Path(args.model).name}, {full['parameters'] / 1e6:.1f}M parameters, {args.precision}), full fine-tuning "
        f"against a LoRA adapter (r={args.rank}, alpha={2 * args.rank}, all linear layers), on {args.rows} rows of "
        f"{args.prompt} random prompt + {args.new} completion tokens. Each side in its own process with {args.threads} "
        f"torch threads; mean of {args.steps} timed update(s) after an untimed one. Peak: the process's resident-set "
        "high-water mark (model load included); growth: from just after the model was loaded (reference copy, "
        "gradients, AdamW state, activations).", "",
        # --no-write only says where this text goes, not what was measured.
        command_line(" ".join(["python", "bench/lora_vs_full.py", *(a for a in sys.argv[1:] if a != "--no-write")]),
                     f"torch {torch.__version__}", f"transformers {transformers.__version__}"), "",
        f"| side | trainable parameters | update, wall (s) | update, CPU (s) | {clock} vs full | "
        f"{'peak allocated' if args.device == 'cuda' else 'peak RSS'} (GiB) | growth (GiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for side in SIDES:
        r = results[side]
        lines.append(f"| {side} | {r['trainable'] / 1e6:.3f}M | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                     f"**{full[key] / r[key]:.2f}x** | {r['peak_gib']:.2f} | {r['growth_gib']:.2f} |")
    lora = results["lora"]
    lines += ["", f"Full fine-tuning's growth is its fp32 gradients and AdamW's two moments (3 x "
              f"{full['parameters'] * 4 / 2**30:.2f} GiB){' and the reference copy' if args.kl > 0 else ''}, plus the "
              f"activations; LoRA's is the adapter's {lora['trainable'] / 1e6:.1f}M parameters with their gradients and "
              "moments, plus the activations (the frozen base still runs forward and backward through every layer, so "
              "the update's compute shrinks far less than its memory). The two cores were shared with other work "
              "(wall above CPU time); the CPU-time ratio is the one to read."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face folder (e.g. ~/.cache/tidal/models/smollm2)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=96)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--kl", type=float, default=0.04)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the RESULTS.md to write the section into")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"])
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing RESULTS.md")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a subprocess's one side
    args = parser.parse_args()
    args.model = str(Path(args.model).expanduser())
    if args.side is not None:
        print(json.dumps(run_side(args)))
        return
    results = {}
    for side in SIDES:
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--side", side],
                             capture_output=True, text=True, check=False)
        if out.returncode:
            raise SystemExit(f"{side} failed ({out.returncode}):\n{out.stderr[-3000:]}")
        results[side] = json.loads(out.stdout.strip().splitlines()[-1])
    text = _section(args, results)
    print(text)
    if not args.no_write:
        write_section(args.results, SECTION if args.device == "cpu" else f"{SECTION} (CUDA)", text)


if __name__ == "__main__":
    main()
