"""Trainer ranks: one RL update at 1 process, DDP and FSDP2 ranks (gloo on a CPU, NCCL on GPUs),
the same batch and loss; step seconds, peak memory per rank and the seconds per GB of gathering
FSDP2's shards into rank 0's full model (what rollout reads after every update).

Baseline: `trainer.parallel.strategy none` (one process, all threads) in the same script. Each
configuration runs in its own subprocess (a fresh process group and a clean peak resident set);
the ranks of a configuration split the cores (torch threads = cores // world size).

    python bench/parallel_step.py                       # the built-in tiny model (3.2M), 2 ranks
    python bench/parallel_step.py --model ~/.cache/tidal/models/smollm2 --rows 16 --steps 3
    python bench/parallel_step.py --device cuda --world 1 --model DIR   # a GPU: FSDP2 at world size 1

On this 2-core machine two ranks have one core each where one process has both: the bench shows
what the ranks cost (communication, duplicated work), not a speed-up; on GPUs each rank has its own
device. Results go to the "## Trainer ranks" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

SECTION = "## Trainer ranks"


def _peak_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _batch(vocab: int, rows: int, prompt: int, completion: int, seed: int) -> Any:
    import torch

    from tidal.types import TrainBatch

    generator = torch.Generator().manual_seed(seed)
    group = 8
    prompts = [torch.randint(3, vocab, (prompt,), generator=generator) for _ in range(max(1, rows // group))]
    length = prompt + completion
    input_ids = torch.cat([torch.cat([prompts[r // group % len(prompts)],
                                      torch.randint(3, vocab, (completion,), generator=generator)])[None]
                           for r in range(rows)])
    attention = torch.ones(rows, length, dtype=torch.long)
    completion_mask = torch.zeros(rows, length)
    completion_mask[:, prompt:] = 1.0
    old = -3.0 * completion_mask
    return TrainBatch(input_ids, attention, completion_mask, old, torch.randn(rows, generator=generator),
                      prompt_lengths=torch.full((rows,), prompt))


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration in this process: build, warm up, time `args.steps` updates."""
    import torch

    from tidal.config.scale import ParallelConfig
    from tidal.config.schema import AlgorithmConfig, ModelConfig, TrainerConfig
    from tidal.models.io import load_model
    from tidal.trainer.parallel.trainer import ParallelTrainer
    from tidal.trainer.trainer import Trainer

    model_cfg = ModelConfig(path=args.model or "tiny", device=args.device)
    device = torch.device(args.device if args.device != "auto" else "cpu")
    model = load_model(model_cfg, device).model
    parallel = ParallelConfig(strategy=args.strategy, world_size=args.world, param_dtype=args.param_dtype)
    cfg = TrainerConfig(lr=1e-5, micro_batch_size=args.micro_batch, precision=args.precision, parallel=parallel)
    algo = AlgorithmConfig()
    trainer: Any
    if args.strategy == "none":
        trainer = Trainer(model, cfg, algo, device, total_steps=100)
    else:
        trainer = ParallelTrainer(model, cfg, algo, device, total_steps=100, model_cfg=model_cfg)
    vocab = int(model.config.vocab_size)
    seconds, gather = [], []
    try:
        for step in range(args.warmup + args.steps):
            batch = _batch(vocab, args.rows, args.prompt, args.completion, step)
            began = time.perf_counter()
            trainer.rl_step(batch)
            if step >= args.warmup:
                seconds.append(time.perf_counter() - began)
        if args.strategy == "fsdp2":  # the gather alone, as the update ends with it
            for _ in range(3):
                began = time.perf_counter()
                trainer.gather()
                gather.append(time.perf_counter() - began)
        if device.type == "cuda":  # rank 0's device memory (the other ranks' devices are theirs to read)
            ranks = [int(torch.cuda.max_memory_allocated(device)) // 1024]
        else:
            ranks = [_peak_kib()] + ([_peak_kib(p.pid) for p in trainer.workers.processes]
                                     if args.strategy != "none" and trainer.workers is not None else [])
    finally:
        if args.strategy != "none":
            trainer.close()
    weights_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    return {"step_s": statistics.median(seconds), "peak_gib": [k / 2**20 for k in ranks],
            "gather_s": statistics.median(gather) if gather else None, "weights_gb": weights_gb,
            "parameters": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads()}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a Hugging Face folder (default: the built-in tiny model)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--world", type=int, default=2, help="ranks of the DDP and FSDP2 runs (default 2)")
    parser.add_argument("--rows", type=int, default=64, help="sequences per update (groups of 8 share a prompt)")
    parser.add_argument("--prompt", type=int, default=40)
    parser.add_argument("--completion", type=int, default=48)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--child", nargs=2, metavar=("STRATEGY", "PARAM_DTYPE"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def run_child(argv: list[str], strategy: str, param_dtype: str, world: int) -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // world)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, __file__, *argv, "--child", strategy, param_dtype]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{strategy}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(args: argparse.Namespace, argv: list[str], results: dict[str, dict[str, Any]]) -> str:
    import torch

    from results_md import command_line

    base = results["none"]
    name = Path(args.model).name if args.model else "the built-in tiny model"
    lines = [SECTION, "",
             f"One RL update (GRPO, PPO clip, AdamW) of {name} ({base['parameters'] / 1e6:.1f}M parameters) on "
             f"{args.rows} sequences of {args.prompt} prompt + {args.completion} completion tokens (groups of 8 "
             f"share a prompt), micro-batch {args.micro_batch}, precision {args.precision}, on {args.device}; median "
             f"of {args.steps} timed updates after {args.warmup} warm-up. The baseline is one process "
             f"(`trainer.parallel.strategy none`); the ranks split the cores. Peak memory: each rank's peak "
             "resident set (VmHWM).", "",
             command_line("python bench/parallel_step.py " + " ".join(argv), f"torch {torch.__version__}"), "",
             "| configuration | ranks x threads | update (s) | vs one process | peak memory per rank (GiB) | "
             "gather to rank 0 (s per GB) |", "|---|---:|---:|---:|---|---:|"]
    for key, result in results.items():
        world = 1 if key == "none" else args.world
        gather = (f"{result['gather_s'] / result['weights_gb']:.2f}" if result.get("gather_s") else "")
        peaks = ", ".join(f"{g:.2f}" for g in result["peak_gib"])
        lines.append(f"| {key} | {world} x {result['threads']} | {result['step_s']:.3f} | "
                     f"{base['step_s'] / result['step_s']:.2f}x | {peaks} | {gather} |")
    load = os.getloadavg()[0]
    lines += ["", "Where the time goes: the ranks split the cores, so a rank has one core where one process has "
              "all; two single-threaded ranks can still beat one two-threaded process where the matmuls are too "
              "small to use two threads well. What the ranks add is the batch broadcast, the gradient all-reduce "
              "(DDP), the per-layer all-gathers and reduce-scatters (FSDP2; bf16 parameters halve them), and under "
              "FSDP2 the gather of the full weights into rank 0's model after every update (the last column, "
              "measured alone). FSDP2 shards weights, gradients and AdamW state over the ranks; rank 0 also holds "
              f"the full model rollout reads. 1-minute load average at the end: {load:.2f} (the bench keeps "
              "about 2 cores busy; more is other work).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.child:
        args.strategy, args.param_dtype = args.child
        args.world = 1 if args.strategy == "none" else args.world
        print(json.dumps(child(args)))
        return
    configurations = [("none", "fp32"), ("ddp", "fp32"), ("fsdp2", "fp32"), ("fsdp2", "bf16")]
    results = {}
    for strategy, dtype in configurations:
        key = strategy if dtype == "fp32" else f"{strategy}, bf16 parameters"
        results[key] = run_child(argv, strategy, dtype, 1 if strategy == "none" else args.world)
        print(key, results[key], flush=True)
    text = report(args, argv, results)
    print(text)
    if not args.no_write:
        from results_md import write_section

        write_section(args.results, SECTION if args.device == "cpu" else f"{SECTION} (CUDA)", text)


if __name__ == "__main__":
    main()
