"""A run's memory plan from its config (`tidal plan`), and the check `tidal train` and `tidal
quickstart` run before they launch anything.

The planner itself (trainer/plan.py) is arithmetic over the model's shapes; this module gathers
its inputs: the model on the meta device (models/meta.py: config.json and the tokenizer, no
weights), the longest prompt among the config's tasks rendered through the chat template, the
memory available and a brief matmul probe. `check_plan` raises `PlanError` with the numbers when
the prediction does not fit, before any run folder, model or rank exists (`trainer.plan_check:
false` skips that refusal), and returns the config with the plan's KV pool in rollout.kv_blocks,
which every engine of the run is then built with.
"""

from __future__ import annotations

import math
import random
import re
import time
from pathlib import Path
from typing import Any

import torch

from tidal.config.schema import TidalConfig
from tidal.errors import PlanError
from tidal.models.io import render_prompt, resolve_device
from tidal.models.meta import meta_model
from tidal.rollout.engine import ACCELERATOR_BATCH_ROWS, CPU_BATCH_ROWS
from tidal.rollout.scheduler import KVPoolTooSmall
from tidal.tasks.reference import reference_answer
from tidal.trainer.memory import available_memory
from tidal.trainer.plan import (
    GIB,
    Capacity,
    PlanInputError,
    RunPlan,
    Workload,
    plan_run,
    shape_of,
)
from tidal.trainer.step_time import MatmulRate, Overlap
from tidal.types import Task, is_multi_turn

LONGEST_CANDIDATES = 32  # prompts rendered to find the longest: the longest by characters
RATE_TOKENS = 2048  # rows of the CPU's matmul probe: enough that the call's overhead does not count
RATE_REPEATS = 5
TYPICAL_SAMPLE = 64  # tasks rendered for the step time's typical prompt and answer


def _longest(tokenizer: Any, tasks: list[Task], with_reference: bool = False) -> int:
    """Tokens of the longest of `tasks`' prompts (plus reference answer and eos), rendering only the
    LONGEST_CANDIDATES longest by characters: tokens follow characters closely enough to pick them."""
    def chars(task: Task) -> int:
        text = sum(len(str(m.get("content", ""))) for m in task.messages())
        return text + (len(reference_answer(task)) if with_reference else 0)

    longest = 0
    for task in sorted(tasks, key=chars, reverse=True)[:LONGEST_CANDIDATES]:
        tokens = len(render_prompt(tokenizer, task.messages()))
        if with_reference:
            tokens += len(tokenizer.encode(reference_answer(task), add_special_tokens=False)) + 1
        longest = max(longest, tokens)
    return longest


def _typical(tokenizer: Any, tasks: list[Task]) -> tuple[int, int]:
    """(mean prompt tokens, mean reference answer tokens + eos) of up to TYPICAL_SAMPLE of `tasks`
    (0 for the answer where none has a reference): what the step time expects a row to hold, where
    the memory plan takes the longest."""
    sample = random.Random(0).sample(tasks, min(TYPICAL_SAMPLE, len(tasks)))
    if not sample:
        return 0, 0
    prompts = [len(render_prompt(tokenizer, task.messages())) for task in sample]
    answers = [len(tokenizer.encode(reference_answer(task), add_special_tokens=False)) + 1
               for task in sample if task.reference is not None]
    return round(sum(prompts) / len(prompts)), round(sum(answers) / len(answers)) if answers else 0


def sandboxed_share(cfg: TidalConfig, train_by_domain: dict[str, list[Task]]) -> float:
    """The share of the train tasks a step draws (domains by weight) that a sandbox scores."""
    from tidal.reward.registry import needs_sandbox

    weights = {name: cfg.tasks.domains[name].weight if name in cfg.tasks.domains else 0.0 for name in train_by_domain}
    total = sum(weight for name, weight in weights.items() if train_by_domain[name])
    if total <= 0:
        return 0.0
    return sum(weights[name] * sum(needs_sandbox(t.verifier.name) for t in tasks) / len(tasks)
               for name, tasks in train_by_domain.items() if tasks) / total


def workload_of(cfg: TidalConfig, tokenizer: Any, device: torch.device, train: list[Task],
                evaluation: list[Task], sandboxed: float = 0.0) -> Workload:
    """What a step of `cfg` processes: its tasks' longest prompt and the rows of an engine batch.
    `train` and `evaluation` are its tasks (`pipeline.run.build_tasks`, which the caller runs);
    `sandboxed`: `sandboxed_share`."""
    single = [task for task in [*train, *evaluation] if not is_multi_turn(task)]
    prompt = _longest(tokenizer, single)
    rollout = cfg.rollout
    sequence = prompt + rollout.max_new_tokens
    drawn = math.ceil(cfg.tasks.tasks_per_step * cfg.tasks.oversample)
    rows = min(drawn, rollout.batch_prompts) * rollout.group_size
    eval_rows = min(len(evaluation), rollout.batch_prompts) * cfg.eval.samples_per_task
    if any(is_multi_turn(task) for task in train):
        sequence = max(sequence, rollout.agent_max_tokens)
        rows = max(rows, rollout.agent_concurrency)
    cap = CPU_BATCH_ROWS if device.type == "cpu" else ACCELERATOR_BATCH_ROWS  # the engine's max_batch_rows
    mean_prompt, expected_completion = _typical(tokenizer, [task for task in train if not is_multi_turn(task)])
    warm = 0
    if cfg.warm_start.enabled and cfg.warm_start.steps:
        warm = _longest(tokenizer, [task for task in train if task.reference is not None], with_reference=True)
    return Workload(prompt_tokens=prompt, sequence_tokens=sequence, generation_rows=min(rows, cap),
                    eval_rows=min(eval_rows, cap), warm_start_tokens=warm, sandboxed_share=sandboxed,
                    mean_prompt_tokens=mean_prompt, expected_completion_tokens=expected_completion)


def _own_resident_set() -> int:
    """This process's resident set: it is the run's own process, which the plan counts whole."""
    try:
        status = Path("/proc/self/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) * 1024  # type: ignore[union-attr]
    except (OSError, AttributeError):
        import psutil

        return int(psutil.Process().memory_info().rss)


def measure_capacity(device: torch.device) -> Capacity:
    """The memory a run may use: on a CPU, the least of MemAvailable and the cgroup's limit minus
    its usage (trainer/memory.py), plus this process's own resident set (the plan counts the run's
    process whole); on CUDA, the device's free memory plus what torch already holds there."""
    own = _own_resident_set()
    host = available_memory(torch.device("cpu")) + own
    source = f"MemAvailable or the cgroup's headroom, whichever is less, + this process's {own / GIB:.2f} GiB"
    if device.type != "cuda":
        return Capacity(device=host, host=host, source=source)
    free, total = torch.cuda.mem_get_info(device)
    held = torch.cuda.memory_reserved(device)
    return Capacity(device=int(free + held), host=host,
                    source=f"{source}; CUDA: free device memory of {total / GIB:.1f} GiB")


def _thread_seconds(run: Any, repeats: int) -> float:
    """The least CPU time of this thread one `run()` took, of `repeats` after an untimed one, with
    torch on one thread: on a machine busy with other work the wall clock counts the waits for a
    core, and several threads spin at their barriers while one waits, but one thread's own CPU
    time is what the work needs on a core of its own."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run()
        best = math.inf
        for _ in range(repeats):
            began = time.thread_time()
            run()
            best = min(best, time.thread_time() - began)
    finally:
        torch.set_num_threads(threads)
    return max(best, 1e-9)


def measure_rate(plan_precision: str, hidden: int, intermediate: int, device: torch.device,
                 sampling_dtype: str = "model") -> MatmulRate:
    """GFLOP/s of one (RATE_TOKENS, hidden) @ (hidden, intermediate) matmul in the trainer's precision
    and in the engine's dtype (`rollout.engine_dtype`: fp32 unless bfloat16), timed briefly on
    `device`. On a CPU: one thread's rate by its CPU time, the best of RATE_REPEATS
    (`_thread_seconds`), times torch's threads, so that a busy machine gives about the rate of an
    idle one (the wall clock of a contended probe swung the estimate several-fold)."""
    if device.type != "cuda":
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(RATE_TOKENS, hidden, generator=generator)
        w = torch.randn(hidden, intermediate, generator=generator)
        w16 = w.to(torch.bfloat16)
        flops = 2.0 * RATE_TOKENS * hidden * intermediate * torch.get_num_threads()
        with torch.no_grad():
            fp32 = flops / _thread_seconds(lambda: x @ w, RATE_REPEATS) / 1e9
            # As autocast does: the activation cast each time, the weight once.
            bf16 = flops / _thread_seconds(lambda: x.to(torch.bfloat16) @ w16, RATE_REPEATS) / 1e9 if (
                plan_precision == "bf16" or sampling_dtype == "bfloat16") else fp32
        return MatmulRate(bf16 if plan_precision == "bf16" else fp32,
                          f"measured: {RATE_TOKENS}x{hidden}x{intermediate} matmul, one thread's CPU time x "
                          f"{torch.get_num_threads()} threads", sampling_gflops=bf16 if sampling_dtype == "bfloat16" else fp32)
    dtype = torch.bfloat16 if plan_precision == "bf16" else torch.float32
    tokens = 8192  # enough rows to fill the device
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    w = torch.randn(hidden, intermediate, device=device, dtype=dtype)
    best = math.inf
    for _ in range(4):  # the first run picks the kernel
        torch.cuda.synchronize(device)
        began = time.perf_counter()
        for _ in range(10):
            x @ w
        torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - began) / 10)
    return MatmulRate(2.0 * tokens * hidden * intermediate / best / 1e9,
                      f"measured: {tokens}x{hidden}x{intermediate} {plan_precision} matmul on {device}")


def overlap_of(cfg: TidalConfig, device: torch.device) -> Overlap | None:
    """The thread shares async rollout workers and the trainer run with at once on a CPU (None:
    sync, or an accelerator): the local backend's split of torch's threads, scaled down where they
    outnumber them."""
    if cfg.pipeline.mode != "async" or device.type != "cpu":
        return None
    from tidal.pipeline.backends.local import cpu_thread_split

    total, workers = torch.get_num_threads(), cfg.pipeline.rollout_workers
    trainer, each = cpu_thread_split(total, workers, cfg.pipeline.rollout_threads, cfg.pipeline.trainer_threads)
    scale = min(1.0, total / (trainer + each * workers))
    return Overlap(sampling_share=min(1.0, each * workers * scale / total), update_share=trainer * scale / total)


def plan_config(cfg: TidalConfig, tasks: tuple[dict[str, list[Task]], list[Task]], fetch: bool = False,
                gflops: float | None = None, throughput: bool = True, capacity: Capacity | None = None) -> RunPlan:
    """The plan of `cfg` on this machine; `tasks`: (train tasks by domain, eval tasks), as
    `pipeline.run.build_tasks` gives them. `fetch`: fetch a registry model that is not in the cache
    (else that is an error); `gflops`: the matmul rate to use instead of measuring one; `throughput`
    false skips the rate; `capacity` replaces the memory measured here."""
    device = resolve_device(cfg.model.device)
    loaded = meta_model(cfg.model, fetch=fetch)
    shape = shape_of(loaded.model)
    train = [task for domain in tasks[0].values() for task in domain]
    workload = workload_of(cfg, loaded.tokenizer, device, train, tasks[1], sandboxed_share(cfg, tasks[0]))
    capacity = capacity or measure_capacity(device)
    try:
        plan = plan_run(cfg, shape, workload, device, capacity)
        if throughput:
            rate = MatmulRate(gflops, "given") if gflops else measure_rate(
                plan.precision, shape.dims.hidden, shape.dims.intermediate, device, cfg.rollout.engine_dtype)
            plan = plan_run(cfg, shape, workload, device, capacity, rate, overlap_of(cfg, device))
    except PlanInputError as error:
        raise PlanError(f"cannot plan this config: {error}") from None
    return plan


def refusal(plan: RunPlan) -> str:
    """Why `plan` does not fit, with its numbers and what to change."""
    lines = ["the run's predicted peak memory does not fit (tidal plan):"]
    for what, predicted, available in plan.checks:
        verdict = "does not fit" if predicted > available else "fits"
        lines.append(f"  {what}: {predicted / GIB:.2f} GiB predicted, {available / GIB:.2f} GiB available: {verdict}")
    _, phase = plan.peak()
    lines.append(f"  rank 0 peaks in the {phase} phase; its largest parts:")
    alive = sorted((p for p in plan.parts if phase in p.phases and p.rank0), key=lambda p: -p.rank0)
    lines += [f"    {part.name}: {part.rank0 / GIB:.2f} GiB" + (f" ({part.note})" if part.note else "")
              for part in alive[:5]]
    lines.append("  lower trainer.micro_batch_size (or auto), turn on trainer.gradient_checkpointing, train a LoRA "
                 "adapter, shard with trainer.parallel.strategy fsdp2, or shorten rollout.max_new_tokens; "
                 "trainer.plan_check=false skips this check")
    return "\n".join(lines)


def check_plan(cfg: TidalConfig, tasks: tuple[dict[str, list[Task]], list[Task]]) -> TidalConfig:
    """`cfg` with rollout.kv_blocks set to its plan's KV pool, which every engine of the run is
    built with (one budget: no engine sizes its pool from the memory free when it starts). Refuses
    (`PlanError`) a config whose predicted peak memory does not fit here, unless
    `trainer.plan_check` is off, and (`KVPoolTooSmall`) a rollout.kv_blocks too small for one of its
    sequences. `tasks` as for `plan_config`. Fetches a registry model that is not cached yet (the
    run would next)."""
    plan = plan_config(cfg, tasks, fetch=True, throughput=False)
    if plan.kv_blocks < plan.sequence_blocks:
        raise KVPoolTooSmall(
            f"rollout.kv_blocks={plan.kv_blocks}: a sequence of this run (the longest prompt + rollout.max_new_tokens, "
            f"{plan.sequence_tokens} tokens) needs {plan.sequence_blocks} blocks of {plan.kv_block_size} positions; "
            f"raise rollout.kv_blocks to at least {plan.sequence_blocks}, or leave it unset for the plan's choice")
    if cfg.trainer.plan_check and not plan.fits:
        raise PlanError(refusal(plan), plan.record())
    sized = cfg.model_copy(deep=True)
    sized.rollout.kv_blocks = plan.kv_blocks
    return sized
