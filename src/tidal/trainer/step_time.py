"""The step time of `tidal plan` (trainer/plan.py): FLOPs of one RL step over the machine's matmul
rates, with the costs that are not matmuls.

The rates are measured briefly on this machine (pipeline/planning.py: one thread's CPU time times
the threads, so that a busy machine gives about an idle one's) or given. Sampling is 2 M per
prompt token (once per group) and per completion token, at the engine dtype's rate; the no-grad
log-prob passes (reference, decoupled PPO's proximal pass) 2 M per token and the update per epoch
(4 M + 2 M_trainable [+ 2 M recomputed under checkpointing]) per token, at the trainer precision's
rate; M is the parameters of the linear layers and the LM head (attention scores are not counted).
The FLOPs are reported at the longest prompt and completion (a bound) and timed at the mean prompt
and the train tasks' mean reference answer + eos (what a row holds on average).

Sampling divides by the rate times SAMPLING_EFFICIENCY and adds DECODE_STEP_SECONDS per engine
step (a wave of rows runs max_new_tokens steps); the update divides by the rate times
UPDATE_EFFICIENCY and adds MICRO_BATCH_SECONDS per micro-batch; sandboxed verification costs
SANDBOX_CPU_SECONDS of CPU per answer. A sync step is their sum. Async on a CPU the rollout workers
and the trainer run at once on their shares of the threads (`Overlap`) and scoring beside them:
the step is the slowest of the three. The efficiencies are the
real-model main job's (`tidal quickstart --model smollm2`: sampling ~32 s and the update ~40 s a
step, each on one of two threads, docs/experiments/real_model.md); bench/RESULTS.md ("Planner:
whole runs") compares the prediction with whole runs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import torch

from tidal.algos.advantages import needs_critic
from tidal.config.schema import TidalConfig

if TYPE_CHECKING:
    from tidal.trainer.plan_inputs import ModelShape, Workload

# Shares of the probe's rate the main job's sampling and update reach at the expected FLOPs (module
# docstring): decode steps of 128 rows, and bf16 micro-batches of rows padded to their longest.
SAMPLING_EFFICIENCY = 0.22
UPDATE_EFFICIENCY = 0.12
DECODE_STEP_SECONDS = 0.008  # the scheduler, the sampler over (rows, vocab), per engine step
MICRO_BATCH_SECONDS = 0.05
SANDBOX_CPU_SECONDS = 0.05  # CPU per answer verified in a warm sandbox pool (bench/RESULTS.md, "Sandbox pool")


@dataclasses.dataclass(frozen=True)
class MatmulRate:
    gflops: float  # of one matmul of the model's MLP shape in the trainer's precision, all threads
    source: str  # "measured: ..." or "given"
    sampling_gflops: float | None = None  # the same in the engine's dtype (fp32 unless bf16 sampling); None: gflops


@dataclasses.dataclass(frozen=True)
class Overlap:
    """Async mode on a CPU: the rollout workers and the trainer run at once, each on its share of
    the machine's threads (pipeline/backends/local.py, `cpu_thread_split`)."""

    sampling_share: float  # of the threads, all rollout workers together
    update_share: float


@dataclasses.dataclass(frozen=True)
class Throughput:
    """FLOPs of one RL step and the time they take at `rate` (module docstring)."""

    sampling_flops: float
    logprob_flops: float
    update_flops: float
    rate: MatmulRate
    ranks_in_parallel: int  # ranks whose update shares run at once at `rate` each (GPUs; 1 on a CPU)
    completions: int
    decode_steps: int = 0  # engine steps of one RL batch: waves of max_batch_rows rows, max_new_tokens each
    micro_batches: int = 0  # the update's micro-batches (forward + backward each), all epochs
    overlap: Overlap | None = None  # async on a CPU: sampling and the update at once, on shares of the threads
    scoring_cpu_seconds: float = 0.0  # sandboxed verification of one step's answers, CPU seconds
    cores: int = 1  # the CPU's threads torch uses: what sampling, the update and scoring share
    # (sampling, log-prob passes, update) FLOPs at the mean prompt and the expected completion
    # (Workload); None: the bounds above
    expected_flops: tuple[float, float, float] | None = None

    def _rates(self) -> tuple[float, float]:
        return (self.rate.sampling_gflops or self.rate.gflops) * 1e9, self.rate.gflops * 1e9

    @property
    def seconds_at_rate(self) -> float:
        """A lower bound: every FLOP at the matmul rate, one phase after the other."""
        sampling, update = self._rates()
        return self.sampling_flops / sampling + (self.logprob_flops + self.update_flops) / (update * self.ranks_in_parallel)

    @property
    def phase_seconds(self) -> tuple[float, float]:
        """(sampling, update) seconds of one step at the measured efficiencies, each at its share
        of the threads when they overlap."""
        sampling_rate, update_rate = self._rates()
        sampling_share, update_share = (self.overlap.sampling_share, self.overlap.update_share) if self.overlap else (1, 1)
        sampling_flops, logprob_flops, update_flops = self.expected_flops or (
            self.sampling_flops, self.logprob_flops, self.update_flops)
        sampling = (sampling_flops / (sampling_rate * SAMPLING_EFFICIENCY) + self.decode_steps * DECODE_STEP_SECONDS
                    ) / sampling_share
        update = ((logprob_flops + update_flops) / (update_rate * UPDATE_EFFICIENCY * self.ranks_in_parallel)
                  + self.micro_batches * MICRO_BATCH_SECONDS) / update_share
        return sampling, update

    @property
    def seconds(self) -> float:
        """The expected step time: sampling, scoring, then the update; when they overlap (async on
        a CPU), the slowest of the three, sampling and the update each on its share of the threads
        and scoring in its sandboxes on all the cores."""
        sampling, update = self.phase_seconds
        scoring = self.scoring_cpu_seconds / self.cores
        return max(sampling, update, scoring) if self.overlap else sampling + scoring + update

    def record(self) -> dict[str, Any]:
        sampling, update = self.phase_seconds
        return {"sampling_gflop": round(self.sampling_flops / 1e9, 2), "logprob_gflop": round(self.logprob_flops / 1e9, 2),
                "update_gflop": round(self.update_flops / 1e9, 2), "matmul_gflops": round(self.rate.gflops, 1),
                "sampling_matmul_gflops": round(self.rate.sampling_gflops or self.rate.gflops, 1),
                "rate_source": self.rate.source, "seconds_at_matmul_rate": round(self.seconds_at_rate, 3),
                "sampling_seconds": round(sampling, 3), "update_seconds": round(update, 3),
                "scoring_cpu_seconds": round(self.scoring_cpu_seconds, 3),
                "overlapped": self.overlap is not None, "expected_step_seconds": round(self.seconds, 3),
                "completions_per_second": round(self.completions / self.seconds, 2) if self.seconds > 0 else None}


def step_throughput(cfg: TidalConfig, shape: ModelShape, workload: Workload, adapter: int, rate: MatmulRate,
                device: torch.device, micro_batch: int, per_rank: int, overlap: Overlap | None) -> Throughput:
    """FLOPs of one step, at the longest prompt and completion (a bound) and at the expected ones
    (module docstring)."""
    trainer, algo, rollout = cfg.trainer, cfg.algorithm, cfg.rollout
    matmul = shape.matmul_parameters
    tasks = cfg.tasks.tasks_per_step
    drawn = math.ceil(tasks * cfg.tasks.oversample)
    rows = tasks * rollout.group_size
    shared = trainer.shared_prefix and not trainer.gradient_checkpointing
    passes = int(algo.kl_coef > 0) + int(algo.loss == "decoupled_ppo") + int(needs_critic(algo.advantage))
    weight_grads = 2.0 * (adapter or matmul)  # LoRA: the base's activation gradients, the adapter's weight gradients
    per_token = 4.0 * matmul + weight_grads + (2.0 * matmul if trainer.gradient_checkpointing else 0.0)

    def flops(prompt: int, completion: int) -> tuple[float, float, float]:  # sampling, log-prob passes, update
        sampling = 2.0 * matmul * (drawn * prompt + drawn * rollout.group_size * completion)
        tokens = tasks * prompt + rows * completion if shared else rows * (prompt + completion)
        update = algo.epochs * per_token * tokens * (2 if needs_critic(algo.advantage) else 1)
        return sampling, 2.0 * matmul * tokens * passes, update

    completion = max(workload.sequence_tokens - workload.prompt_tokens, 1)
    bound = flops(workload.prompt_tokens, completion)
    expected = flops(workload.mean_prompt_tokens or workload.prompt_tokens,
                     min(workload.expected_completion_tokens or completion, completion))
    parallel = trainer.parallel.world_size if device.type == "cuda" else 1
    # Engine calls of batch_prompts prompts, each in waves of the engine's rows, each wave as many
    # steps as its longest completion.
    call_prompts = min(drawn, rollout.batch_prompts)
    waves = -(-call_prompts * rollout.group_size // max(workload.generation_rows, 1))
    decode_steps = -(-drawn // call_prompts) * waves * completion
    micro_batches = algo.epochs * -(-per_rank // max(micro_batch, 1))
    scoring = drawn * rollout.group_size * workload.sandboxed_share * SANDBOX_CPU_SECONDS
    cores = torch.get_num_threads() if device.type == "cpu" else 1
    return Throughput(*bound, rate, parallel, rows, decode_steps, micro_batches, overlap, scoring, cores,
                      expected_flops=expected)
