"""A real model's RL update on the CPU: time and peak memory of `Trainer.rl_step`, today's path
(fp32, full logits) against each memory and speed option, on one batch.

The batch is the real job's shape: --prompts chat-rendered arithmetic questions (~60 tokens) x
--samples completions sampled from the model itself at temperature 1, each exactly --new-tokens
long (~160-token rows), with the sampler's logprobs and GRPO-like advantages (+-1 within a
group). It is generated once and cached. Every configuration then runs in its own subprocess (so
its peak memory is its own) with --threads torch threads: one untimed update, then --steps timed
ones, each split into the decoder's forward passes, the optimizer step and the rest (head,
log-softmax, loss, backward). Peak memory is the highest resident set sampled every 10 ms during
the updates, above the process's resident set before them (model, batch and torch loaded). The
optimizer state is allocated in the untimed update, so it is in the baseline.

Also measured, each in its own subprocess: the matmul GFLOP/s of the model's shapes in fp32 and
bf16; AdamW's step over the model's parameters, fused vs foreach vs the per-tensor loop; the
log-prob difference between a bf16-autocast and an fp32 pass on the batch (mean and max |diff|
over completion tokens, the PPO ratio exp(diff) it implies) and the cosine between the two
passes' policy gradients; and the built-in tiny model's update in fp32 vs bf16 (why `precision:
auto` keeps small models in fp32). The result goes into the "## Real-model update on CPU" section
of bench/RESULTS.md.

    python bench/update_cpu.py --model /tmp/smolhf            # 8 x 8 samples of 96 tokens, 1 + 2 steps
    python bench/update_cpu.py --model /tmp/smolhf --configs fp32-full bf16-chunked --no-write
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import command_line, write_section
from typing_extensions import Self

SECTION = "## Real-model update on CPU"
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
# name -> TrainerConfig options; the first is the baseline (today's defaults on a CPU)
CONFIGS: dict[str, dict[str, Any]] = {
    "fp32-full": {"precision": "fp32", "logprob_chunk_tokens": 0},
    "fp32-chunked": {"precision": "fp32"},
    "fp32-chunked-ckpt": {"precision": "fp32", "gradient_checkpointing": True},
    "bf16-full": {"precision": "bf16", "logprob_chunk_tokens": 0},
    "bf16-chunked": {"precision": "bf16"},
    "bf16-chunked-ckpt": {"precision": "bf16", "gradient_checkpointing": True},
    "bf16-chunked-ckpt-mmap": {"precision": "bf16", "gradient_checkpointing": True},
    "auto": {"precision": "auto", "micro_batch_size": "auto"},
}
# Environment of a configuration's process: glibc returns every allocation of 1 MiB or more to the
# system when it is freed, instead of keeping it in its heap (the resident set then follows the
# live tensors; each allocation costs page faults).
CONFIG_ENV = {"bf16-chunked-ckpt-mmap": {"MALLOC_MMAP_THRESHOLD_": "1048576"}}
QUESTIONS = [f"Tom has {a} apples and buys {b} more, then gives {c} away. How many apples does Tom have now?"
             for a, b, c in ((7, 5, 3), (12, 9, 4), (23, 14, 8), (31, 7, 19), (45, 26, 13), (16, 38, 21),
                             (54, 17, 29), (62, 33, 47))]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a Hugging Face checkpoint folder")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--micro-batch", type=int, default=16, help="trainer.micro_batch_size of the fixed configs")
    parser.add_argument("--min-free-gib", type=float, default=9.0,
                        help="wait (up to 10 minutes) for this much available memory before each configuration: the "
                        "machine is shared, and a memory kill takes the largest process, maybe another's")
    parser.add_argument("--steps", type=int, default=1, help="timed updates per configuration and round (after 1 untimed)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over all configurations (interleaved: the "
                        "machine's load moves)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--batch-file", type=Path, default=Path("/tmp/tidal_update_cpu_batch.pt"))
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing RESULTS.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ------------------------------------------------------------------ the batch


def load_model(folder: Path) -> tuple[Any, Any]:
    from tidal.config.schema import ModelConfig
    from tidal.models.io import load_model as load

    loaded = load(ModelConfig(path=str(folder), device="cpu"))
    return loaded.model, loaded.tokenizer


def make_batch(args: argparse.Namespace) -> Any:
    """The cached batch, or a new one sampled from the model (module docstring)."""
    import torch

    key = {"model": str(args.model.resolve()), "prompts": args.prompts, "samples": args.samples,
           "new_tokens": args.new_tokens}
    if args.batch_file.exists():
        saved = torch.load(args.batch_file, weights_only=False)
        if saved["key"] == key:
            return saved["batch"]
    from tidal.models.io import render_prompt
    from tidal.trainer.logprobs import token_logprobs
    from tidal.types import TrainBatch

    model, tokenizer = load_model(args.model)
    torch.manual_seed(0)
    rows, prompt_lengths = [], []
    for question in QUESTIONS[: args.prompts]:
        prompt = render_prompt(tokenizer, [{"role": "user", "content": question}])
        ids = torch.tensor([prompt] * args.samples)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                                 max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 pad_token_id=tokenizer.pad_token_id)
        rows += out.tolist()
        prompt_lengths += [len(prompt)] * args.samples
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    completion_mask = torch.zeros(len(rows), length)
    for b, (row, start) in enumerate(zip(rows, prompt_lengths)):
        input_ids[b, : len(row)] = torch.tensor(row)
        attention_mask[b, : len(row)] = 1
        completion_mask[b, start : len(row)] = 1.0
    with torch.no_grad():
        old, _ = token_logprobs(model, input_ids, attention_mask, positions=completion_mask)
    advantages = torch.tensor([1.0 if (b // 2) % 2 else -1.0 for b in range(len(rows))])
    batch = TrainBatch(input_ids, attention_mask, completion_mask, old, advantages,
                       prompt_lengths=torch.tensor(prompt_lengths))
    torch.save({"key": key, "batch": batch}, args.batch_file)
    return batch


def first_rows(batch: Any, count: int) -> Any:
    """The batch's first `count` rows (every per-row field)."""
    import dataclasses

    import torch

    return dataclasses.replace(batch, **{field.name: getattr(batch, field.name)[:count]
                                         for field in dataclasses.fields(batch)
                                         if isinstance(getattr(batch, field.name), torch.Tensor)})


# ------------------------------------------------------------------ children


class PeakRSS:
    """The highest resident set (bytes) seen every 10 ms while inside the block."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    @staticmethod
    def now() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.01)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def run_config(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """One configuration's updates: seconds and phase split per timed step, peak memory."""
    import torch

    from tidal.config.schema import AlgorithmConfig, TrainerConfig
    from tidal.trainer.logprobs import token_logprobs
    from tidal.trainer.memory import plan_memory
    from tidal.trainer.trainer import Trainer

    batch = make_batch(args)
    model, _ = load_model(args.model)
    options = {"micro_batch_size": args.micro_batch, "lr": 1e-6, **CONFIGS[name]}
    trainer = Trainer(model, TrainerConfig(**options), AlgorithmConfig(clip_high=0.28), "cpu", total_steps=100)
    phases = {"forward": 0.0, "optimizer": 0.0}
    marks: dict[str, float] = {}

    def started(key: str) -> Any:
        return lambda *_: marks.__setitem__(key, time.perf_counter())

    def ended(key: str) -> Any:
        return lambda *_: phases.__setitem__(key, phases[key] + time.perf_counter() - marks[key])

    body = model.get_decoder()
    body.register_forward_pre_hook(started("forward"))
    body.register_forward_hook(ended("forward"))
    trainer.optimizer.register_step_pre_hook(started("optimizer"))
    trainer.optimizer.register_step_post_hook(ended("optimizer"))
    trainer.rl_step(first_rows(batch, 8))  # untimed: allocates the optimizer state, warms the kernels
    before = PeakRSS.now()
    seconds, cpu_seconds, splits = [], [], []
    with PeakRSS() as rss:
        for _ in range(args.steps):
            phases.update(forward=0.0, optimizer=0.0)
            began, cpu_began = time.perf_counter(), time.process_time()
            metrics = trainer.rl_step(batch)
            seconds.append(time.perf_counter() - began)
            cpu_seconds.append(time.process_time() - cpu_began)
            splits.append({**phases, "rest": seconds[-1] - phases["forward"] - phases["optimizer"]})
    began = time.perf_counter()
    with torch.no_grad():  # a frozen pass (reference / proximal logprobs) of the whole batch
        for start in range(0, batch.input_ids.shape[0], trainer.micro_batch_size):
            rows = slice(start, start + trainer.micro_batch_size)
            token_logprobs(model, batch.input_ids[rows], batch.attention_mask[rows], positions=batch.completion_mask[rows],
                           autocast_dtype=trainer.autocast_dtype, chunk_tokens=trainer.cfg.logprob_chunk_tokens)
    frozen = time.perf_counter() - began
    length = int(batch.attention_mask.sum(dim=1).max())
    plan = plan_memory(model, trainer.device, trainer.autocast_dtype, trainer.cfg.gradient_checkpointing,
                       trainer.cfg.logprob_chunk_tokens, trainer.setup["logprobs"] != "full logits")
    gradients = 4 * sum(p.numel() for p in model.parameters())
    estimate = gradients + plan.head + trainer.micro_batch_size * length * plan.token_bytes(length)
    return {"name": name, "seconds": seconds, "cpu_seconds": cpu_seconds, "splits": splits, "frozen_pass_s": frozen, "estimate": estimate,
            "length": length,
            "rss_before": before, "peak": rss.peak, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "setup": trainer.setup, "micro_batch_size": trainer.micro_batch_size, "skipped": metrics["skipped"],
            "threads": torch.get_num_threads()}


def run_kernels(args: argparse.Namespace) -> dict[str, Any]:
    """Matmul GFLOP/s of the model's shapes in both dtypes, and AdamW's step three ways."""
    import torch

    from tidal.trainer.precision import matmul_rates

    model, _ = load_model(args.model)
    config = model.config
    hidden, mlp, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    tokens = args.prompts * args.samples * (args.new_tokens + 60)
    shapes = {"probe 512 x H x I": (512, hidden, mlp), f"MLP {tokens} x H x I": (tokens, hidden, mlp),
              "LM head 1024 x H x V": (1024, hidden, vocab)}
    rates = {label: matmul_rates(*shape, torch.get_num_threads(), repeats=3) for label, shape in shapes.items()}
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    adam: dict[str, float] = {}
    for label, flags in (("fused", {"fused": True}), ("foreach", {"foreach": True}),
                         ("for-loop", {"foreach": False, "fused": False})):
        optimizer = torch.optim.AdamW(params, lr=1e-6, **flags)
        optimizer.step()  # allocates the state
        began = time.perf_counter()
        for _ in range(3):
            optimizer.step()
        adam[label] = (time.perf_counter() - began) / 3
        del optimizer
    return {"rates": rates, "adamw": adam, "parameters": sum(p.numel() for p in params)}


def run_precision(args: argparse.Namespace) -> dict[str, Any]:
    """bf16 autocast against fp32 on the same batch: logprobs, and the policy gradient's direction."""
    import torch

    from tidal.algos.losses import get_loss, loss_denominator
    from tidal.trainer.logprobs import token_logprobs, trim_padding

    batch = make_batch(args)
    model, _ = load_model(args.model)
    mask = batch.completion_mask
    denominator = loss_denominator(mask, "token")
    values, grads = {}, {}
    for label, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        model.zero_grad(set_to_none=True)
        parts = []
        for start in range(0, mask.shape[0], 16):
            rows = slice(start, start + 16)
            ids, attn, length = trim_padding(batch.input_ids[rows], batch.attention_mask[rows])
            lp, _ = token_logprobs(model, ids, attn, positions=mask[rows, :length], autocast_dtype=dtype)
            loss, _ = get_loss("ppo_clip")(lp, batch.old_logprobs[rows, :length], batch.advantages[rows], mask[rows, :length],
                                      clip_low=0.2, clip_high=0.28, aggregation="token", denominator=denominator)
            loss.backward()
            parts.append(torch.nn.functional.pad(lp.detach(), (0, mask.shape[1] - length)))
        values[label] = torch.cat(parts)
        grads[label] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    diff = (values["bf16"] - values["fp32"])[mask > 0]
    wide, narrow = grads["fp32"].double(), grads["bf16"].double()
    return {"mean_abs": float(diff.abs().mean()), "max_abs": float(diff.abs().max()),
            "ratio_dev": float((diff.exp() - 1).abs().mean()),
            "outside_clip": float(((diff.exp() - 1).abs() > 0.2).double().mean()),
            "grad_cosine": float(wide @ narrow / (wide.norm() * narrow.norm())),
            "grad_norm_ratio": float(narrow.norm() / wide.norm())}


def run_tiny(args: argparse.Namespace) -> dict[str, Any]:
    """The built-in tiny model's update (hidden 256, 4 layers) on 64 random rows, fp32 vs bf16."""
    import torch

    from tidal.config.schema import AlgorithmConfig, TinyModelConfig, TrainerConfig
    from tidal.models.tiny import build_tiny_model
    from tidal.models.tokenizer import build_tiny_tokenizer
    from tidal.trainer.trainer import Trainer
    from tidal.types import TrainBatch

    tokenizer = build_tiny_tokenizer()
    ids = torch.randint(1, len(tokenizer), (64, 96), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    completion = torch.zeros(64, 96)
    completion[:, 32:] = 1.0
    batch = TrainBatch(ids, mask, completion, torch.zeros(64, 96) - 5, torch.randn(64))
    seconds = {}
    for precision in ("fp32", "bf16"):
        model = build_tiny_model(TinyModelConfig(), tokenizer, seed=0)
        trainer = Trainer(model, TrainerConfig(precision=precision), AlgorithmConfig(), "cpu", total_steps=10)
        trainer.rl_step(batch)
        began = time.process_time()
        for _ in range(3):
            trainer.rl_step(batch)
        seconds[precision] = (time.process_time() - began) / 3
    return {"seconds": seconds, "parameters": sum(p.numel() for p in model.parameters())}


def run_head(args: argparse.Namespace) -> dict[str, Any]:
    """The LM head + log-softmax + entropy of the whole batch's completion tokens (one micro-batch
    of 64 rows), forward and backward, by chunk size (0: the full logits, no checkpoint): CPU
    seconds and peak memory above the start, the least of 2 interleaved rounds."""
    import torch

    from tidal.trainer.logprobs import _row_logprobs, head_logprobs

    model, _ = load_model(args.model)
    head = model.get_output_embeddings()
    tokens = args.prompts * args.samples * args.new_tokens
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, head.in_features, generator=generator)
    targets = torch.randint(0, head.out_features, (tokens,), generator=generator)
    seconds: dict[int, list[float]] = {size: [] for size in HEAD_CHUNKS}
    cpu: dict[int, list[float]] = {size: [] for size in HEAD_CHUNKS}
    peaks: dict[int, int] = {}
    for _ in range(2):
        for size in HEAD_CHUNKS:
            features = hidden.clone().requires_grad_()
            start = PeakRSS.now()
            began, cpu_began = time.perf_counter(), time.process_time()
            with PeakRSS() as rss:
                if size:
                    logprobs, entropy = head_logprobs(features, targets, head, 1.0, True, False, size)
                else:
                    logprobs, entropy = _row_logprobs(head(features), targets, 1.0, True, False)
                (logprobs.sum() + 0 * entropy.sum()).backward()
            seconds[size].append(time.perf_counter() - began)
            cpu[size].append(time.process_time() - cpu_began)
            peaks[size] = max(peaks.get(size, 0), rss.peak - start)
            head.weight.grad = None
    return {"tokens": tokens, "seconds": {size: min(v) for size, v in seconds.items()},
            "cpu_seconds": {size: min(v) for size, v in cpu.items()}, "peaks": peaks}


HEAD_CHUNKS = (0, 256, 512, 1024, 4096)
# aten ops by what they are, for the profile's split
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
              "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}
CAST_OPS = {"aten::copy_", "aten::_to_copy"}


def run_profile(args: argparse.Namespace) -> dict[str, Any]:
    """Where a micro-batch's forward and backward spend their CPU time, fp32 against bf16: the
    self time of matmuls (and attention), of dtype casts, and of everything else (norms, RoPE,
    SiLU, residual adds, log-softmax), under torch.profiler, 16 rows, after a warm-up."""
    import torch

    from tidal.trainer.logprobs import token_logprobs

    batch = make_batch(args)
    model, _ = load_model(args.model)
    model.train()
    rows = slice(0, 16)
    ids, attn, mask = batch.input_ids[rows], batch.attention_mask[rows], batch.completion_mask[rows]
    shares = {}
    for label, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        for profiled in (False, True):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profiled else \
                    contextlib.nullcontext() as prof:
                logprobs, _ = token_logprobs(model, ids, attn, positions=mask, autocast_dtype=dtype)
                logprobs.sum().backward()
            model.zero_grad(set_to_none=True)
        totals = {"matmul": 0.0, "cast": 0.0, "other": 0.0}
        for event in prof.key_averages():
            kind = "matmul" if event.key in MATMUL_OPS else "cast" if event.key in CAST_OPS else "other"
            totals[kind] += event.self_cpu_time_total / 1e6
        shares[label] = totals
    return shares
CHILDREN = {"kernels": run_kernels, "precision": run_precision, "tiny": run_tiny, "head": run_head,
            "profile": run_profile}


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    run = CHILDREN.get(args.child)
    result = run(args) if run is not None else run_config(args, args.child)
    print(json.dumps(result))


def wait_for_memory(gib: float, name: str) -> None:
    """Block until `gib` GiB are available (`tidal.trainer.memory.available_memory`), at most 10 minutes."""
    import torch

    from tidal.trainer.memory import available_memory

    deadline = time.monotonic() + 600
    while (free := available_memory(torch.device("cpu")) / GIB) < gib:
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: only {free:.1f} GiB available after 10 minutes, {gib} needed (--min-free-gib)")
        time.sleep(10)


def run_child(args: argparse.Namespace, name: str, argv: list[str]) -> dict[str, Any]:
    wait_for_memory(args.min_free_gib, name)
    # Passive OpenMP waits: a thread whose partner the shared machine descheduled sleeps instead of
    # spinning, so a process's CPU time is its work, the figure the table compares.
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_WAIT_POLICY="PASSIVE", **CONFIG_ENV.get(name, {}))
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[variable] = str(args.threads)
    command = [sys.executable, str(Path(__file__).resolve()), *argv, "--child", name]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode} (a memory kill is -9); rerun {' '.join(command)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


GIB = 1 << 30


def merge_rounds(kept: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """One configuration's rounds together: all timed steps, the highest peak above its baseline."""
    if kept is None:
        return new
    peak = max(kept["peak"] - kept["rss_before"], new["peak"] - new["rss_before"])
    return {**new, "seconds": kept["seconds"] + new["seconds"], "splits": kept["splits"] + new["splits"],
            "cpu_seconds": kept["cpu_seconds"] + new["cpu_seconds"],
            "frozen_pass_s": min(kept["frozen_pass_s"], new["frozen_pass_s"]), "rss_before": 0, "peak": peak}


def config_rows(runs: list[dict[str, Any]]) -> list[str]:
    """The table of the configurations, CPU-time ratios against the first, the baseline."""
    lines = [("| configuration | micro-batch | update, CPU (s) | vs baseline | update, wall (s) | its split: decoder "
              "forward / optimizer / rest (s) | frozen pass, wall (s) | peak above model + AdamW state (GiB) | "
              "estimate (GiB) |"),
             "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    base = min(runs[0]["cpu_seconds"])
    for run in runs:
        cpu, fastest = min(run["cpu_seconds"]), min(run["seconds"])
        split = run["splits"][run["seconds"].index(fastest)]
        precision = run["setup"]["precision"]["autocast"]
        label = f"`{run['name']}` ({precision}, {run['setup']['logprobs']}" + (
            ", checkpointing)" if run["setup"]["gradient_checkpointing"] else ")")
        lines.append(f"| {label} | {run['micro_batch_size']} | {cpu:.1f} | **{base / cpu:.2f}x** | {fastest:.1f} | "
                     f"{split['forward']:.1f} / {split['optimizer']:.2f} / {split['rest']:.1f} | "
                     f"{run['frozen_pass_s']:.1f} | {(run['peak'] - run['rss_before']) / GIB:.2f} | "
                     f"{run['estimate'] / GIB:.2f} |")
    return lines


def extra_lines(results: dict[str, Any]) -> list[str]:
    """The measurements beside the table, one bullet each."""
    kernels, precision, tiny, head = (results[name] for name in ("kernels", "precision", "tiny", "head"))
    rates = "; ".join(f"{label}: {fp32:.0f} fp32 vs {bf16:.0f} bf16 ({bf16 / fp32:.1f}x)"
                      for label, (fp32, bf16) in kernels["rates"].items())
    adam = kernels["adamw"]
    heads = ", ".join(f"{'full logits' if size == '0' else size + ' tokens'} {head['cpu_seconds'][size]:.1f} CPU s / "
                      f"{head['peaks'][size] / GIB:.2f} GiB" for size in head["seconds"])
    tiny_s = tiny["seconds"]
    return [
        f"- Matmul GFLOP/s (the model's shapes, {kernels['threads']} threads, best of 3): {rates}.",
        (f"- AdamW step over {kernels['parameters'] / 1e6:.1f}M parameters: fused {adam['fused']:.2f} s, foreach "
         f"{adam['foreach']:.2f} s, per-tensor loop {adam['for-loop']:.2f} s (trainer/optim.py uses fused)."),
        (f"- LM head + log-softmax + entropy of {head['tokens']} completion tokens (a 64-row micro-batch), forward "
         f"and backward, by chunk size: {heads}."),
        (f"- bf16 autocast against fp32 on this batch's completion tokens: mean |logprob difference| "
         f"{precision['mean_abs']:.4f} (max {precision['max_abs']:.3f}); mean |ratio - 1| {precision['ratio_dev']:.4f}, "
         f"{100 * precision['outside_clip']:.2f}% of the tokens outside a 0.2 clip range from bf16 alone; the PPO "
         f"policy gradients' cosine {precision['grad_cosine']:.4f}, norm ratio {precision['grad_norm_ratio']:.3f}."),
        (f"- The built-in tiny model ({tiny['parameters'] / 1e6:.2f}M parameters, 64 x 96 tokens): update fp32 "
         f"{tiny_s['fp32']:.3f} CPU s, bf16 {tiny_s['bf16']:.3f} CPU s ({tiny_s['fp32'] / tiny_s['bf16']:.2f}x)."),
    ]


def where_the_time_goes(runs: dict[str, dict[str, Any]], results: dict[str, Any]) -> str:
    """The paragraph under the table, from the baseline's split and the profile."""
    base = runs[next(iter(runs))]
    split = base["splits"][base["seconds"].index(min(base["seconds"]))]
    wall = split["forward"] + split["optimizer"] + split["rest"]
    shares = {label: {kind: value / sum(totals.values()) for kind, value in totals.items()}
              for label, totals in results["profile"].items()}
    fp32, bf16 = shares["fp32"], shares["bf16"]
    speedups = [b / f for f, b in results["kernels"]["rates"].values()]
    matmul_ratio = results["profile"]["fp32"]["matmul"] / results["profile"]["bf16"]["matmul"]
    return (
        f"Where the time goes: in the baseline the decoder's forward passes are {100 * split['forward'] / wall:.0f}% of "
        f"the update's wall time, the optimizer step {100 * split['optimizer'] / wall:.1f}%, the rest (LM head, "
        f"log-softmax, loss and the whole backward) {100 * split['rest'] / wall:.0f}%. Under torch.profiler (16 rows, "
        f"forward and backward) matmuls and attention take {100 * fp32['matmul']:.0f}% of the CPU time in fp32 and "
        f"{100 * bf16['matmul']:.0f}% in bf16, dtype casts {100 * fp32['cast']:.0f}% and {100 * bf16['cast']:.0f}%, "
        f"the other ops (norms, RoPE, SiLU, residual adds, log-softmax: memory-bound) {100 * fp32['other']:.0f}% and "
        f"{100 * bf16['other']:.0f}%. So bf16 runs a lone matmul {min(speedups):.0f}-{max(speedups):.0f}x faster, the "
        f"update's own matmuls (backward included) take {matmul_ratio:.1f}x less time, and the update gains less "
        "again: what is left is the elementwise work and autocast's casts. Chunking costs the "
        "recomputed head of all but the last chunk; checkpointing one more forward of every layer, and turns the "
        "shared-prompt path off for the pass with gradients (Hugging Face's checkpointed layers drop the KV cache), "
        "so it also runs every prompt token once per row."
    )


def section(args: argparse.Namespace, runs: dict[str, dict[str, Any]], results: dict[str, Any], load: str) -> str:
    import torch
    import transformers

    rows = list(runs.values())
    parameters = results["kernels"]["parameters"]
    command = "python bench/update_cpu.py --model " + str(args.model)
    lines = [
        SECTION, "",
        (f"One RL update (`Trainer.rl_step`: PPO-clip, token aggregation, one AdamW step, no KL) of a real checkpoint "
         f"({args.model.name}, {parameters / 1e6:.1f}M parameters) on a batch of the real job's shape: "
         f"{args.prompts} prompts x {args.samples} samples of exactly {args.new_tokens} tokens sampled from the model, "
         f"rows of {rows[0]['length']} tokens, shared prompts on. Each configuration in its own process with "
         f"{args.threads} torch threads, {args.steps} timed update(s) after an untimed one on 8 rows, in {args.rounds} "
         "round(s); the ratios are of CPU seconds (the update's process time, OpenMP waits passive), which the "
         "shared machine's load moves far less than wall time (both: the least over the rounds). The first row is "
         "today's path (fp32, full logits). Peak memory: resident set sampled every 10 ms during the updates, above "
         "the process before them (model, batch, AdamW state); the estimate is trainer/memory.py's for the same "
         "micro-batch. `-mmap` runs with `MALLOC_MMAP_THRESHOLD_=1048576`. The frozen pass is a no-grad log-prob "
         "pass over the batch (a reference or proximal pass)."),
        "", command_line(command, f"torch {torch.__version__}", f"transformers {transformers.__version__}",
                         f"load average before {load}"), "",
        *config_rows(rows), "", where_the_time_goes(runs, results), "", *extra_lines(results), "",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    argv = ["--model", str(args.model), "--prompts", str(args.prompts), "--samples", str(args.samples),
            "--new-tokens", str(args.new_tokens), "--micro-batch", str(args.micro_batch), "--steps", str(args.steps),
            "--threads", str(args.threads), "--batch-file", str(args.batch_file)]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    make_batch(args)  # sampled once, before the children read it
    runs: dict[str, dict[str, Any]] = {}
    for _ in range(args.rounds):
        for name in args.configs:
            result = run_child(args, name, argv)
            print(f"{name}: {result['seconds']} s, peak {(result['peak'] - result['rss_before']) / GIB:.2f} GiB, "
                  f"load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
            runs[name] = merge_rounds(runs.get(name), result)
    results = {name: run_child(args, name, argv) for name in ("kernels", "precision", "tiny", "head", "profile")}
    results["kernels"]["threads"] = args.threads
    load += " / after " + ", ".join(f"{x:.1f}" for x in os.getloadavg())
    text = section(args, runs, results, load)
    Path("/tmp/tidal_update_cpu_results.json").write_text(json.dumps({"runs": runs, "results": results}))
    if not args.no_write:
        write_section(RESULTS, SECTION, text)
    print(text)


if __name__ == "__main__":
    main()
