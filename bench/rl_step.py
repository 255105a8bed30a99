"""One RL step, tidal against TRL's `GRPOTrainer`, on the same tiny model, task and batch.

A step is: sample a GRPO batch, score it, compute group advantages, one AdamW update (lr 1e-5,
fp32, no KL). Both sides start from the same weights (the built-in tiny Qwen2 from one seed) and
tokenizer, answer the same arithmetic prompts ("What is 12 + 7?" through the chat template) and
use the same reward function (1 if the completion contains the right number, else 0). Every
completion is forced to exactly --new-tokens tokens: tidal samples with `ignore_eos=True`, TRL
generates with `min_new_tokens` (the eos logit is masked until then). TRL generates with its own
`model.generate` (no vLLM). Each side runs in its own subprocess with the same torch thread
count, pinned to that many cores; after --warmup untimed steps, --steps steps are timed, from the
end of one optimizer step to the end of the next. tidal runs synchronously (on-policy, as TRL does)
and, as a fourth side, asynchronously: the next batch sampled while the update runs, one step
off-policy (bench/rl_step_tidal.py). One more step per side runs untimed under torch's `FlopCounterMode`: the
FLOPs each side computes, so the ratio splits into less work and work done faster. The result
(completions/s, the ratio tidal / TRL, the work) is written into the "## RL step" section of
bench/RESULTS.md.

With `--model DIR` both sides load that Hugging Face checkpoint folder (`tidal model import` writes
one) with its tokenizer and chat template instead of the tiny model; only tidal (synchronous) and
TRL run, each step split by phase (bench/rl_step_phases.py: generate, score, log-prob pass,
forward + backward, optimizer, other), into the "## RL step, real model" section. `--kl` adds a
reference model on both sides, and with it the no-grad log-prob pass neither runs without one
(its own section, "## RL step, real model, with a reference model").

    python bench/rl_step.py                     # 2 prompts x 8 samples, 1 warm-up + 5 timed steps
    python bench/rl_step.py --threads 1 2 --rounds 3   # one comparison per thread count
    python bench/rl_step.py --profile tidal     # cProfile of tidal's timed steps, top functions
    python bench/rl_step.py --model /tmp/smolhf # a real checkpoint: 2 x 8 samples of 48 tokens, 1 + 3 steps
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rl_step_phases  # noqa: E402
from results_md import command_line, write_section  # noqa: E402

SECTION = "## RL step"
# tidal-unshared: tidal with trainer.shared_prefix=false; tidal-async: generation overlapping the
# update, one step off-policy (bench/rl_step_tidal.py)
SIDES = ("tidal", "trl", "tidal-unshared", "tidal-async")
MODEL_SIDES = ("tidal", "trl")  # with --model: the on-policy comparison only, each step split by phase
# --steps and --new-tokens when not given: the tiny model's, and a real checkpoint's (a few minutes on 2 cores)
DEFAULTS = {"tiny": {"steps": 5, "new_tokens": 32}, "model": {"steps": 3, "new_tokens": 48}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=2, help="distinct prompts per step (default 2)")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt, the GRPO group size (default 8)")
    parser.add_argument(
        "--new-tokens", type=int, help="tokens per completion, forced (default 32; with --model 48)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first, at least 1 (default 1)")
    parser.add_argument("--steps", type=int, help="timed steps per side (default 5; with --model 3)")
    parser.add_argument(
        "--model", type=Path, metavar="DIR",
        help="a Hugging Face checkpoint folder both sides load (tokenizer and chat template too) instead of the "
        "tiny model; runs tidal and TRL only, split by phase, into the '## RL step, real model' section",
    )
    parser.add_argument(
        "--kl", type=float, nargs="+", default=[0.0], metavar="COEF",
        help="KL-to-reference coefficients, one comparison each, on both sides (TRL beta, tidal algorithm.kl_coef; "
        "k3 in the loss): > 0 adds a reference model and its no-grad log-prob pass; needs --model (default 0)",
    )
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[2], help="torch CPU thread counts, one comparison each (default 2)"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="run tidal then TRL this many times; medians count (default 1)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the model init, prompts and sampling")
    parser.add_argument(
        "--max-load", type=float, metavar="LOAD",
        help="on a shared machine: before each side's run, wait (up to 30 min) until the 1-minute load average is "
        "at most LOAD",
    )
    parser.add_argument(
        "--profile",
        choices=SIDES,
        help="cProfile one side (tidal: its timed steps; TRL: all of train()), print the top functions, write nothing",
    )
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"), help="file to update")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # internal: run one side, print JSON
    args = parser.parse_args(argv)
    for name, default in DEFAULTS["model" if args.model else "tiny"].items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    for name in ("prompts", "new_tokens", "steps", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if min(args.threads) < 1:
        parser.error("--threads must be >= 1")
    if args.samples < 2:
        parser.error("--samples must be >= 2 (a GRPO group needs two samples; TRL refuses fewer)")
    if args.warmup < 1:
        parser.error("--warmup must be >= 1 (TRL's first timed step starts where the last warm-up step ends)")
    if min(args.kl) < 0:
        parser.error("--kl must be >= 0")
    if any(args.kl) and not args.model:
        parser.error("--kl needs --model: TRL loads its reference model from the checkpoint folder, and the tiny "
                     "model has none")
    if args.model:
        if not (args.model / "config.json").is_file():
            parser.error(f"--model {args.model}: no config.json there; pass a Hugging Face checkpoint folder "
                         "(`tidal model import FILE.gguf --out DIR` writes one)")
        if "quantization_config" in json.loads((args.model / "config.json").read_text()):
            # transformers then marks the model quantized, and TRL's Trainer refuses to train it.
            parser.error(f"--model {args.model}: config.json has a quantization_config (a folder saved from a "
                         "GGUF-loaded model keeps it); re-import it with `tidal model import FILE.gguf --out DIR`, "
                         "which drops it, or delete that key if the weights are plain floats")
        if args.profile in ("tidal-unshared", "tidal-async"):
            parser.error(f"--profile {args.profile}: with --model only the sides {', '.join(MODEL_SIDES)} run")
        args.model = args.model.resolve()
    return args


def sides(args: argparse.Namespace) -> tuple[str, ...]:
    return MODEL_SIDES if args.model else SIDES


# ------------------------------------------------------------------ the task, shared by both sides


def arithmetic_questions(seed: int, count: int = 64) -> list[tuple[str, int]]:
    """(question, answer) pairs such as ("What is 12 + 7?", 19), the same list for a given seed."""
    rng = random.Random(seed)
    return [(f"What is {a} + {b}?", a + b) for a, b in ((rng.randint(1, 99), rng.randint(1, 99)) for _ in range(count))]


def arithmetic_reward(text: str, answer: int) -> float:
    """1.0 if `text` contains `answer` as a whole number (so 17 does not match 170), else 0.0."""
    return 1.0 if str(answer) in re.findall(r"\d+", text) else 0.0


class WorkCounter:
    """The model FLOPs of one step, counted by torch's `FlopCounterMode` (matmuls and attention,
    forward and backward, as the ops actually ran), in all and inside `generate` calls."""

    def __init__(self) -> None:
        import torch
        from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

        def attention(query: Any, key: Any, value: Any, *_: Any, **__: Any) -> int:
            return sdpa_flop_count(query, key, value)

        def attention_backward(grad: Any, query: Any, key: Any, value: Any, *_: Any, **__: Any) -> int:
            return sdpa_backward_flop_count(grad, query, key, value)

        aten = torch.ops.aten
        # torch's counter has no entry for the CPU attention kernels; the CUDA ones' formulas fit them.
        mapping = {aten._scaled_dot_product_flash_attention_for_cpu: attention,
                   aten._scaled_dot_product_flash_attention_for_cpu_backward: attention_backward}
        self.mode = FlopCounterMode(display=False, custom_mapping=mapping)
        self.active = False
        self.generate_flops = 0

    def __enter__(self) -> WorkCounter:
        self.mode.__enter__()
        self.active = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.active = False
        self.mode.__exit__(*exc)

    def wrap_generate(self, owner: Any) -> None:
        """Count what `owner.generate` computes (while counting) as generation."""
        generate = owner.generate

        def counted(*args: Any, **kwargs: Any) -> Any:
            before = self.mode.get_total_flops()
            try:
                return generate(*args, **kwargs)
            finally:
                if self.active:
                    self.generate_flops += self.mode.get_total_flops() - before

        owner.generate = counted

    def result(self) -> dict[str, float]:
        total = self.mode.get_total_flops()
        return {"total": total, "generate": self.generate_flops, "train": total - self.generate_flops}


def build_model_and_tokenizer(seed: int, model_dir: Path | None = None) -> tuple[Any, Any]:
    """The tiny model from `seed`, or the checkpoint in `model_dir`, fp32 on the CPU (as tidal loads it)."""
    from tidal.config.schema import ModelConfig, TinyModelConfig
    from tidal.models.io import load_model
    from tidal.models.tiny import build_tiny_model
    from tidal.models.tokenizer import build_tiny_tokenizer

    if model_dir is not None:
        loaded = load_model(ModelConfig(path=str(model_dir), device="cpu"))
        return loaded.model, loaded.tokenizer
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(TinyModelConfig(), tokenizer, seed=seed)  # hidden 256, 4 layers, 4/2 heads, MLP 768
    return model, tokenizer


# ------------------------------------------------------------------ the sides (tidal's: bench/rl_step_tidal.py)


def run_trl(args: argparse.Namespace) -> tuple[list[float], list[dict[str, Any]], dict[str, float]]:
    """Step seconds of the timed steps (end of one optimizer step to the next), per-step facts (with
    the step's phases), and the FLOPs of one more step, counted (untimed)."""
    import warnings

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    # transformers 5 deprecation notices raised from inside TRL: not ours to act on, and noisy.
    warnings.filterwarnings("ignore", category=FutureWarning)
    model, tokenizer = build_model_and_tokenizer(args.seed, args.model)
    questions = arithmetic_questions(args.seed)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "answer": a} for q, a in questions])
    facts: list[dict[str, float]] = []

    def reward(
        completions: list[list[dict[str, str]]], answer: list[int], completion_ids: list[list[int]], **_: Any
    ) -> list[float]:
        rewards = [arithmetic_reward(c[-1]["content"], a) for c, a in zip(completions, answer)]
        facts.append(
            {
                "completions": len(completions),
                "tokens": sum(len(ids) for ids in completion_ids),
                "reward": sum(rewards) / len(rewards),
            }
        )
        return rewards

    timed_steps = args.warmup + args.steps
    counter = WorkCounter()
    counter.wrap_generate(model)  # TRL samples through the model's own `generate`
    phases = rl_step_phases.PhaseClock()

    class PhasedGRPOTrainer(GRPOTrainer):
        """TRL's trainer with its sampling, scoring and no-grad log-prob passes timed around its own
        methods (the update's phases come from torch hooks, rl_step_phases.UpdateMarks)."""

        def _prepare_inputs(self, *args: Any, **kwargs: Any) -> Any:
            # Tokenising the prompts, sampling, rewards, advantages, padding and splitting the batch;
            # the sampling and log-prob passes inside are counted as their own phases.
            with phases.phase("score"):
                return super()._prepare_inputs(*args, **kwargs)

        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            with phases.phase("generate"):
                return super()._generate(*args, **kwargs)

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():  # the policy loss's forward: the update's hooks time it
                return super()._get_per_token_logps_and_entropies(*args, **kwargs)
            with phases.phase("logprob"):
                return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    class StepClock(TrainerCallback):
        """Marks the end of every optimizer step; a step's time is the gap between two marks, and
        its phases are those seen since the mark before. The step after the timed ones runs under
        the FLOP counter."""

        def __init__(self) -> None:
            self.marks: list[float] = []
            self.phases: list[dict[str, float]] = []

        def on_step_begin(self, _args: Any, state: Any, *_: Any, **__: Any) -> None:
            if state.global_step == timed_steps:
                counter.__enter__()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            if counter.active:
                counter.__exit__(None, None, None)
                phases.take()
            else:
                now = time.perf_counter()
                self.phases.append(phases.take(now - self.marks[-1] if self.marks else None))
                self.marks.append(now)

    clock = StepClock()
    with tempfile.TemporaryDirectory() as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            per_device_train_batch_size=args.prompts * args.samples,
            gradient_accumulation_steps=1,
            num_generations=args.samples,
            max_completion_length=args.new_tokens,
            generation_kwargs={"min_new_tokens": args.new_tokens},  # no eos before the cap: fixed lengths
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=args.kl[0],
            epsilon=0.2,
            epsilon_high=0.28,  # tidal's default clip-higher, so both optimise the same loss
            learning_rate=1e-5,
            lr_scheduler_type="constant",
            adam_beta2=0.99,  # tidal's AdamW betas are (0.9, 0.99)
            weight_decay=0.0,
            max_grad_norm=1.0,
            max_steps=timed_steps + 1,  # the last one is counted, not timed
            use_cpu=True,
            bf16=False,
            fp16=False,
            seed=args.seed,
            report_to="none",
            save_strategy="no",
            logging_steps=10_000,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = PhasedGRPOTrainer(
            model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tokenizer
        )
        torch.set_num_threads(args.threads[0])  # after the trainer is built, in case anything reset it
        trainer.add_callback(clock)
        update = rl_step_phases.UpdateMarks(phases, trainer.model)
        with profiled(args.profile == "trl"):
            trainer.train()
        update.close()
    marks = clock.marks[args.warmup - 1 :]
    seconds = [b - a for a, b in zip(marks, marks[1:])]
    timed = [{**fact, "phases": split} for fact, split in zip(facts, clock.phases)][args.warmup : timed_steps]
    return seconds, timed, counter.result()


@contextlib.contextmanager
def profiled(enabled: bool) -> Iterator[None]:
    """cProfile the block when `enabled`, then print the costliest functions to stderr."""
    if not enabled:
        yield
        return
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        stats = pstats.Stats(profile, stream=sys.stderr)
        stats.sort_stats("cumulative").print_stats(30)
        stats.sort_stats("tottime").print_stats(20)


def run_side(args: argparse.Namespace) -> None:
    """Run one side in this process and print its result as one JSON line."""
    import torch
    from rl_step_tidal import run_tidal, run_tidal_async

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > args.threads[0]:  # n threads get n cores, whatever threads a side starts
        os.sched_setaffinity(0, cpus[: args.threads[0]])
    torch.set_num_threads(args.threads[0])
    run = {"trl": run_trl, "tidal-async": run_tidal_async}.get(args.side, run_tidal)
    seconds, facts, flops = run(args)
    result = {"side": args.side, "seconds": seconds, "facts": facts, "flops": flops, "threads": torch.get_num_threads()}
    print(json.dumps(result))


# ------------------------------------------------------------------ the comparison


def run_subprocess(args: argparse.Namespace, side: str, threads: int, kl: float = 0.0) -> dict[str, Any]:
    """One side in a fresh process with `threads` threads (and KL coefficient `kl`); its result, checked."""
    env = dict(os.environ)
    # Identical native thread pools on both sides, set before torch loads.
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    env["TOKENIZERS_PARALLELISM"] = "false"
    options = {
        "--prompts": args.prompts, "--samples": args.samples, "--new-tokens": args.new_tokens,
        "--warmup": args.warmup, "--steps": args.steps, "--seed": args.seed, "--threads": threads, "--side": side,
    }
    if args.profile:
        options["--profile"] = args.profile
    if args.model:
        options.update({"--model": args.model, "--kl": kl})
    command = [sys.executable, str(Path(__file__).resolve()), *(str(x) for item in options.items() for x in item)]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {side} run failed (exit {done.returncode}); rerun `{shlex.join(command)}` to see why")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    expected = args.prompts * args.samples
    for fact in result["facts"]:
        if fact["completions"] != expected or fact["tokens"] != expected * args.new_tokens:
            raise SystemExit(f"{side}: a step had {fact}, expected {expected} completions of {args.new_tokens} tokens")
    if len(result["seconds"]) != args.steps:
        raise SystemExit(f"{side}: timed {len(result['seconds'])} steps, expected {args.steps}")
    if result["threads"] != threads:
        raise SystemExit(f"{side}: ran with {result['threads']} torch threads, expected {threads}")
    return result


def wait_for_load(limit: float | None, patience_s: float = 1800.0) -> float:
    """The 1-minute load average, once it is at most `limit` (None: now), or after `patience_s`."""
    give_up = time.monotonic() + patience_s
    load = os.getloadavg()[0]
    while limit is not None and load > limit and time.monotonic() < give_up:
        print(f"load average {load:.2f} > --max-load {limit}: waiting", flush=True)
        time.sleep(15)
        load = os.getloadavg()[0]
    return load


def compare(args: argparse.Namespace, threads: int, loads: list[float], kl: float = 0.0) -> dict[str, Any]:
    """Both sides at `threads` threads, `args.rounds` times; medians over all timed steps (the
    phases: means, rl_step_phases.means).

    Appends the 1-minute load average seen before each run to `loads`.
    """
    completions = args.prompts * args.samples
    step_seconds: dict[str, list[float]] = {side: [] for side in sides(args)}
    phase_seconds: dict[str, dict[str, list[float]]] = {side: {} for side in sides(args) if side != "trl"}
    split_steps: dict[str, list[dict[str, float]]] = {side: [] for side in sides(args)}  # rl_step_phases
    flops: dict[str, dict[str, float]] = {}
    staleness: list[int] = []  # of each tidal-async batch when trained
    for round_index in range(args.rounds):
        for side in sides(args):
            loads.append(wait_for_load(args.max_load))
            result = run_subprocess(args, side, threads, kl)
            step_seconds[side] += result["seconds"]
            flops[side] = result["flops"]  # the same every round: same seeds, same shapes
            rewards = [f["reward"] for f in result["facts"]]
            print(
                f"threads={threads}{f' kl={kl}' if args.model else ''} round {round_index + 1} {side:14s} step s: "
                + " ".join(f"{s:.3f}" for s in result["seconds"])
                + f"  (mean reward {statistics.fmean(rewards):.3f}, load {loads[-1]:.2f} before)"
            )
            for fact in result["facts"]:
                for key in (k for k in fact if k.endswith("_s")):
                    phase_seconds.get(side, {}).setdefault(key, []).append(fact[key])
                if "staleness" in fact:
                    staleness.append(int(fact["staleness"]))
                if "phases" in fact:
                    split_steps[side].append(fact["phases"])
    row: dict[str, Any] = {"threads": threads, "kl": kl}
    for side in sides(args):
        median = statistics.median(step_seconds[side])
        row[side] = {
            "median_step_s": median,
            "min_step_s": min(step_seconds[side]),
            "completions_per_s": completions / median,
            "tokens_per_s": completions * args.new_tokens / median,
            "flops": flops[side],
            "gflops_per_s": flops[side]["total"] / median / 1e9,
        }
    for key, side in (("ratio", "tidal"), ("unshared_ratio", "tidal-unshared"), ("async_ratio", "tidal-async")):
        if side in row:
            row[key] = row[side]["completions_per_s"] / row["trl"]["completions_per_s"]
    row["staleness"] = {k: staleness.count(k) for k in sorted(set(staleness))}
    row["phases"] = {side: {key.removesuffix("_s"): statistics.median(v) for key, v in by_key.items()}
                     for side, by_key in phase_seconds.items()}
    row["split"] = {side: rl_step_phases.means(steps) for side, steps in split_steps.items() if steps}
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| torch threads | side | median step (s) | fastest step (s) | completions/s | completion tokens/s "
        "| tidal / TRL |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        for side, label in (("tidal", "tidal"), ("trl", "TRL GRPOTrainer"),
                            ("tidal-unshared", "tidal, `trainer.shared_prefix=false`"),
                            ("tidal-async", "tidal async: next batch sampled during the update (`max_staleness: 1`)")):
            s = row[side]
            ratio = {"tidal": f"**{row['ratio']:.2f}x**", "tidal-unshared": f"{row['unshared_ratio']:.2f}x",
                     "tidal-async": f"**{row['async_ratio']:.2f}x**"}.get(side, "")
            lines.append(
                f"| {row['threads']} | {label} | {s['median_step_s']:.3f} | {s['min_step_s']:.3f} | "
                f"{s['completions_per_s']:.1f} | {s['tokens_per_s']:.0f} | {ratio} |"
            )
    return lines


def work(row: dict[str, Any]) -> str:
    """How much of the ratio is less work and how much is work done faster."""

    def gflop(side: str) -> str:
        f = row[side]["flops"]
        return (f"{f['total'] / 1e9:.2f} GFLOP ({f['generate'] / 1e9:.2f} sampling, {f['train'] / 1e9:.2f} update) "
                f"at {row[side]['gflops_per_s']:.1f} GFLOP/s")

    tidal, trl = row["tidal"], row["trl"]
    less = trl["flops"]["total"] / tidal["flops"]["total"]
    faster = tidal["gflops_per_s"] / trl["gflops_per_s"]
    rate = {phase: tidal["flops"][phase] / row["phases"]["tidal"][phase] / 1e9 for phase in ("generate", "train")}
    return (f"work of one step at {row['threads']} thread(s): TRL {gflop('trl')}; tidal {gflop('tidal')}; "
            f"tidal unshared {gflop('tidal-unshared')}. TRL computes {less:.2f}x tidal's FLOPs, and tidal runs "
            f"{faster:.2f}x TRL's FLOPs per second: {less:.2f} x {faster:.2f} = {less * faster:.2f}x. tidal's "
            f"sampling ran at {rate['generate']:.1f} GFLOP/s, its update at {rate['train']:.1f} (phase medians)")


def phases(row: dict[str, Any], side: str) -> str:
    return ", ".join(f"{key} {value:.3f}" for key, value in row["phases"][side].items())


def section(args: argparse.Namespace, rows: list[dict[str, Any]], parameters: int, vocab: int) -> str:
    import torch
    import transformers
    from trl import __version__ as trl_version

    command = "python bench/rl_step.py" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])
    timed = args.steps * args.rounds
    row = rows[0]
    tidal, trl, unshared = row["tidal"]["flops"], row["trl"]["flops"], row["tidal-unshared"]["flops"]
    phase = row["phases"]["tidal"]
    less = trl["total"] / tidal["total"]
    faster = row["tidal"]["gflops_per_s"] / row["trl"]["gflops_per_s"]
    rate = {key: tidal[key] / phase[key] / 1e9 for key in ("generate", "train")}
    lines = [
        SECTION,
        "",
        f"One RL step ({args.prompts} arithmetic prompts x {args.samples} samples of exactly {args.new_tokens} tokens, "
        "reward, GRPO advantages, one AdamW update, fp32, no KL) of tidal against TRL `GRPOTrainer` (its own "
        f"`generate`, no vLLM) on the built-in tiny Qwen2 ({parameters / 1e6:.2f}M parameters, vocab {vocab}), same "
        "seed, weights and reward on both sides (bench/rl_step.py's docstring has the whole setup). Median of "
        f"{timed} timed steps per side ({args.rounds} rounds of {args.steps} after {args.warmup} warm-up), each side "
        "in its own subprocess pinned to as many cores as torch threads. tidal async is `pipeline.mode: async` with "
        "`max_staleness: 1` (bench/rl_step_tidal.py): one update off-policy, so not the on-policy rows' algorithm.",
        "",
        command_line(command, f"torch {torch.__version__}", f"transformers {transformers.__version__}",
                     f"trl {trl_version}"),
        "",
        *table(rows),
        "",
        f"Where the time goes, at {row['threads']} thread(s): tidal's step is generation {phase['generate']:.3f} s "
        f"and the update {phase['train']:.3f} s; reward, advantages and collation {phase['score_collate']:.3f} s. "
        f"TRL computes {less:.2f}x tidal's FLOPs ({trl['total'] / 1e9:.2f} against {tidal['total'] / 1e9:.2f} GFLOP "
        "a step: torch's `FlopCounterMode` over one untimed step, matmuls and attention, forward and backward) "
        f"and tidal runs at {faster:.2f}x TRL's FLOP rate: {less:.2f} x {faster:.2f} = {less * faster:.2f}x. Less work is "
        "most of the lead: TRL prefills every sample's copy of its prompt and runs every prompt token through the "
        "update once per sample, where tidal runs each distinct prompt once in both (`trainer.shared_prefix`; "
        f"without it the update is {unshared['train'] / 1e9:.2f} GFLOP instead of {tidal['train'] / 1e9:.2f}). "
        f"tidal's sampling runs at {rate['generate']:.1f} GFLOP/s against its update's {rate['train']:.1f}: decode "
        f"steps of {args.prompts * args.samples} rows are too small to keep the cores busy. The async row overlaps "
        "the sampler's thread with the trainer's; on one core there is nothing to overlap. The script prints the "
        "load average before each run: trust only runs where it stayed near the benchmark's own.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.side:
        run_side(args)
        return
    if args.profile:
        # One side, profiled (stats on stderr); no comparison and nothing written.
        for threads in args.threads:
            result = run_subprocess(args, args.profile, threads)
            print(f"threads={threads} {args.profile} step s: " + " ".join(f"{s:.3f}" for s in result["seconds"]))
        return
    loads: list[float] = []
    rows = [compare(args, threads, loads, kl) for kl in args.kl for threads in args.threads]
    loads.append(os.getloadavg()[0])
    if args.model:
        from tidal.models.io import render_prompt

        model, tokenizer = build_model_and_tokenizer(args.seed, args.model)
        parameters = sum(p.numel() for p in model.parameters())
        del model
        lengths = [len(render_prompt(tokenizer, [{"role": "user", "content": q}]))
                   for q, _ in arithmetic_questions(args.seed)]
        report = rl_step_phases.model_section(
            args, rows, loads, parameters, len(tokenizer), statistics.fmean(lengths)
        )
        print(report)
        if not args.no_write:
            write_section(args.results, rl_step_phases.section_title(args.kl), report)
            print(f"wrote the {rl_step_phases.section_title(args.kl)!r} section of {args.results}")
        return
    print("\n".join(table(rows)))
    for row in rows:
        for side in row["phases"]:
            print(f"{side}'s step by phase at {row['threads']} thread(s), median s: {phases(row, side)}")
        print(f"tidal and TRL by phase at {row['threads']} thread(s), mean s (bench/rl_step_phases.py):")
        print("\n".join(rl_step_phases.table(row["split"], rl_step_phases.not_run(row["kl"]))))
        print(work(row))
    print(f"1-minute load average before each run: {', '.join(f'{x:.2f}' for x in loads[:-1])}; after: {loads[-1]:.2f}")
    if not args.no_write:
        model, tokenizer = build_model_and_tokenizer(args.seed)
        parameters = sum(p.numel() for p in model.parameters())
        write_section(args.results, SECTION, section(args, rows, parameters, len(tokenizer)))
        print(f"wrote the {SECTION!r} section of {args.results}")


if __name__ == "__main__":
    main()
