"""The memory planner (`tidal plan CONFIG`): a run's predicted peak memory per rank, part by part,
and its step time, from the config and the model's shapes alone (no weights are loaded).

A run goes through phases that do not overlap in a synchronous loop: the warm start (one
process), generation (sampling and evaluation: the rollout engine's KV cache) and the update (the
trainer's passes). Each `Part` is a number of bytes that exists during some of them; a rank's peak
is its largest phase, the sum of the parts alive in it. In async mode the rollout workers generate
while the trainer updates, so their generation parts count in the update phase too.

What is counted, per rank, for P parameters (T of them trainable: all, or LoRA's adapter of
r * (in + out) per targeted linear layer), W ranks and a micro-batch of m rows of L tokens
(L = the longest prompt + rollout.max_new_tokens):
- runtime: RUNTIME_BYTES per process (torch, transformers and tidal imported, the tasks, the
  scorer: the peak resident set of the smoke run, whose model adds under 5 MiB), plus
  CUDA_CONTEXT_BYTES of device memory per rank on CUDA;
- weights: 4 P (fp32) on rank 0, which keeps the whole model for rollout and evaluation under
  every strategy; DDP's other ranks hold it whole too. FSDP2 trains a copy sharded over the ranks,
  4 P / W each, and gathers in `param_dtype` the root's parameters (embeddings, head) plus, with
  `reshard_after_forward`, FSDP_GATHERED_LAYERS decoder layers at a time (the one running and the
  one prefetched), else every layer;
- gradients 4 T (FSDP2: / W), alive in the update; AdamW's two moments 8 T (FSDP2: / W), from the
  first update on; DDP adds its gradient buckets, 4 T. `cpu_offload` moves FSDP2's shards,
  gradients and moments to host memory;
- activations: m * L * `MemoryPlan.token_bytes(L)` (trainer/memory.py: what a Llama/Qwen2 layer
  keeps for its backward, fitted to the resident set on a CPU; about half of it under gradient
  checkpointing), whole rows even where shared prompts would save some;
- the log-prob head: HEAD_COPIES fp32 (tokens, vocab) tensors of one chunk of
  `logprob_chunk_tokens` (at most m * max_new_tokens tokens), or of the whole micro-batch when
  the full logits are computed;
- a reference model (kl_coef > 0), 4 P per rank; none under LoRA, whose reference is the base
  model with the adapter off. A value model (gae): 4 P weights and 12 P of state. `merge.weight`
  < 1 keeps a copy of the starting weights, 4 P;
- each rollout engine of the run (the loop's, which evaluates and, in sync mode, samples; and in
  async mode each rollout worker's): its KV pool, `kv_blocks` blocks of `kv_block_size` positions
  of 2 * layers * kv_heads * head_dim * 4 bytes (the engine runs the fp32 model), allocated when
  the engine starts and kept; its decode view (rollout/paged.py: a contiguous copy of the decoding
  rows' keys and values, kept once grown), rows * (the longest sequence + 1) positions; and
  SAMPLING_COPIES (rows, vocab) fp32 tensors of a decode step. rows = the larger of an RL engine
  batch (group_size * the prompts generated together, tasks_per_step * oversample, at most
  rollout.batch_prompts) and an evaluation batch (batch_prompts * samples_per_task), at most the
  engine's max_batch_rows. `kv_blocks` is rollout.kv_blocks, or the plan's: the blocks of the
  largest batch (each prompt's once, its samples fork from it, and each row's completion plus
  the partial prompt block it copies), the pool that batch never preempts in, fewer where the
  machine's memory cannot hold that, never fewer than one sequence's; the run builds every engine with it
  (pipeline/planning.py), so no engine sizes itself from the memory free when it starts;
- async: each rollout worker's copy of the model (4 P) and its engine, and the published weights'
  CPU snapshot (4 P); the ray backend's workers are processes of their own (RUNTIME_BYTES each)
  and Ray's object store holds one more copy.
- the warm start (one process, before any rank starts): gradients and AdamW state of the whole
  model and warm_start.batch_size rows of the longest prompt + reference.

The CPU fits the machine total of all ranks into the memory available (`capacity`); CUDA fits
each rank's device parts into its GPU and every process's host parts into the host. The
prediction's tolerance, measured against the peak resident set on this CPU, is in
docs/design/trainer.md ("Planning memory").

The step time is trainer/step_time.py's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch

from tidal.algos.advantages import needs_critic
from tidal.config.schema import TidalConfig, TrainerConfig
from tidal.trainer.logprobs import split_model
from tidal.trainer.lora import linear_layers
from tidal.trainer.memory import (
    HEAD_COPIES,
    STATE_BYTES,
    MemoryPlan,
    estimate_memory,
    model_dims,
)
from tidal.trainer.parallel.rank import decoder_layers
from tidal.trainer.plan_inputs import ModelShape, Workload
from tidal.trainer.precision import choose_precision_for, widest_linear
from tidal.trainer.step_time import MatmulRate, Overlap, Throughput, step_throughput

MIB, GIB = 1 << 20, 1 << 30
RUNTIME_BYTES = 560 * MIB
PEFT_BYTES = 104 * MIB  # measured: the resident set `import peft` adds (a LoRA run imports it)
CUDA_CONTEXT_BYTES = 512 * MIB  # assumed: the CUDA context and kernels of torch; not measured here
FSDP_GATHERED_LAYERS = 2
SAMPLING_COPIES = 4  # logits, softmax, the top-p sort and its cumulative sum
WEIGHT_BYTES = 4  # the model is loaded in fp32: autocast computes in bf16, the weights stay fp32
ADAM_BYTES = STATE_BYTES - 4  # the two moments; the other 4 of STATE_BYTES are the gradient

Phase = Literal["warm start", "generation", "update"]
PHASES: tuple[Phase, ...] = ("warm start", "generation", "update")
ALL: frozenset[Phase] = frozenset(PHASES)
RL: frozenset[Phase] = frozenset({"generation", "update"})
UPDATE: frozenset[Phase] = frozenset({"update"})
GENERATION: frozenset[Phase] = frozenset({"generation"})
WARM: frozenset[Phase] = frozenset({"warm start"})


class PlanInputError(ValueError):
    """A config the planner cannot size (e.g. LoRA target modules that match no layer)."""


def shape_of(model: torch.nn.Module) -> ModelShape:
    """The `ModelShape` of a Hugging Face causal LM (its weights are not read: meta is fine)."""
    dims = model_dims(model)
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kv_heads = int(getattr(text, "num_key_value_heads", None) or dims.heads)
    head_dim = int(getattr(text, "head_dim", None) or dims.hidden // dims.heads)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    linears = tuple((name, i, o) for name, (i, o) in linear_layers(model).items())  # GPT-2's Conv1D too
    head_size = head.in_features * head.out_features if isinstance(head, torch.nn.Linear) else dims.hidden * dims.vocab
    parameters = sum(p.numel() for p in model.parameters())
    layer_sizes = [sum(p.numel() for p in layer.parameters()) for layer in decoder_layers(model)]
    return ModelShape(
        dims=dims, kv_heads=kv_heads, head_dim=head_dim, parameters=parameters,
        matmul_parameters=sum(i * o for _, i, o in linears) + head_size,
        root_parameters=parameters - sum(layer_sizes), largest_layer=max(layer_sizes, default=parameters),
        linears=linears, widest_linear=widest_linear(model), chunked_head=split_model(model) is not None,
        attention=str(getattr(config, "_attn_implementation", None) or "sdpa"),
    )


def adapter_parameters(shape: ModelShape, cfg: TrainerConfig) -> int:
    """LoRA's trainable parameters, r * (in + out) per targeted linear layer (peft's matching: a
    module whose name is a target or ends in '.' + target; all-linear: every one but the LM head)."""
    lora = cfg.lora
    if not lora.enabled:
        return 0
    targets = lora.target_modules
    hits = [(i, o) for name, i, o in shape.linears
            if targets == "all-linear" or any(name == t or name.endswith("." + t) for t in targets)]
    if not hits:
        known = sorted({name.rsplit(".", 1)[-1] for name, _, _ in shape.linears})
        raise PlanInputError(f"trainer.lora.target_modules {targets} match no linear layer of the model; "
                             f"its linear layers are named {', '.join(known)}")
    return sum(lora.r * (i + o) for i, o in hits)


@dataclasses.dataclass(frozen=True)
class Capacity:
    """Bytes available to the run: on the training device, and on the host (equal on a CPU)."""

    device: int
    host: int
    source: str  # where the numbers come from


@dataclasses.dataclass(frozen=True)
class Part:
    """Bytes that exist during `phases`: on rank 0, on each other rank, and in processes that are
    no trainer rank (the ray backend's rollout workers and object store)."""

    name: str
    rank0: int
    other_ranks: int
    phases: frozenset[Phase]
    host: bool = False  # in host memory on a CUDA run (offloaded shards, CPU copies)
    outside: int = 0
    note: str = ""

    def record(self) -> dict[str, Any]:
        return {"part": self.name, "rank0_bytes": self.rank0, "other_rank_bytes": self.other_ranks,
                "outside_bytes": self.outside, "phases": sorted(self.phases), "host": self.host, "note": self.note}


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The parts of a run's memory, where they must fit, and its throughput."""

    parts: tuple[Part, ...]
    parameters: int
    trainable: int
    world_size: int
    device: str  # "cpu" or "cuda"
    capacity: Capacity
    micro_batch_size: int
    sequence_tokens: int
    precision: str
    activations_flipped: int  # the activations with trainer.gradient_checkpointing the other way
    throughput: Throughput | None  # None when no matmul rate was given (the fit check needs none)
    assumptions: tuple[str, ...]
    kv_blocks: int  # every engine's KV pool: the run builds each engine with this many blocks
    kv_block_size: int
    sequence_blocks: int  # blocks of one longest sequence: the least a pool may hold

    def _pooled(self, host: bool) -> list[Part]:
        if self.device == "cpu":
            return list(self.parts)
        return [part for part in self.parts if part.host == host]

    def phase_bytes(self, phase: Phase, rank0: bool = True, host: bool = False) -> int:
        return sum(part.rank0 if rank0 else part.other_ranks for part in self._pooled(host) if phase in part.phases)

    def peak(self, rank0: bool = True, host: bool = False) -> tuple[int, Phase]:
        """A rank's peak (of its device memory, or its host memory on CUDA) and the phase it is in."""
        return max(((self.phase_bytes(phase, rank0, host), phase) for phase in PHASES), key=lambda item: item[0])

    def machine_peak(self, host: bool) -> int:
        """All processes' peak in one memory pool (each rank at its own peak: an upper bound)."""
        outside = sum(part.outside for part in self._pooled(host))
        return self.peak(True, host)[0] + (self.world_size - 1) * self.peak(False, host)[0] + outside

    @property
    def checks(self) -> list[tuple[str, int, int]]:
        """(what, predicted bytes, available bytes) that must each fit."""
        if self.device == "cpu":
            return [("machine memory, all ranks", self.machine_peak(True), self.capacity.host)]
        return [("device memory per rank (rank 0)", self.peak(True, False)[0], self.capacity.device),
                ("host memory, all processes", self.machine_peak(True), self.capacity.host)]

    @property
    def fits(self) -> bool:
        return all(predicted <= available for _, predicted, available in self.checks)

    def record(self) -> dict[str, Any]:
        """The whole plan as JSON-friendly values (bytes as integers)."""
        peak, phase = self.peak()
        return {
            "parts": [part.record() for part in self.parts], "parameters": self.parameters,
            "trainable_parameters": self.trainable, "world_size": self.world_size, "device": self.device,
            "micro_batch_size": self.micro_batch_size, "sequence_tokens": self.sequence_tokens,
            "precision": self.precision, "rank0_peak_bytes": peak, "rank0_peak_phase": phase,
            "other_rank_peak_bytes": self.peak(False)[0] if self.world_size > 1 else None,
            "activations_with_checkpointing_flipped_bytes": self.activations_flipped,
            "checks": [{"what": w, "predicted_bytes": p, "available_bytes": a, "fits": p <= a} for w, p, a in self.checks],
            "capacity_source": self.capacity.source, "fits": self.fits,
            "throughput": self.throughput.record() if self.throughput else None, "assumptions": list(self.assumptions),
            "kv_blocks": self.kv_blocks, "kv_block_size": self.kv_block_size, "sequence_blocks": self.sequence_blocks,
        }


def _memory_plan(shape: ModelShape, trainer: TrainerConfig, trainable: int, free: int,
                 autocast: torch.dtype | None, checkpointing: bool, value_model: bool) -> MemoryPlan:
    return estimate_memory(shape.dims, trainable, free, autocast, checkpointing, trainer.logprob_chunk_tokens,
                           shape.chunked_head, value_model, shape.attention)


def _update_transients(shape: ModelShape, memory: MemoryPlan, rows: int, length: int, completion: int
                       ) -> tuple[int, int]:
    """(activations, log-prob head) of one micro-batch of `rows` rows of `length` tokens."""
    activations = rows * length * (memory.per_token + memory.attention_per_token_per_position * length)
    if memory.head:
        chunk = min(memory.head // (HEAD_COPIES * shape.dims.vocab * 4), max(rows * completion, 1))
        head = HEAD_COPIES * chunk * shape.dims.vocab * 4
    else:
        head = rows * length * memory.full_logits_per_token
    return activations, head


def _state_parts(cfg: TidalConfig, shape: ModelShape, adapter: int) -> list[Part]:
    """The policy's weights, gradients and optimizer state on each rank (module docstring)."""
    parallel = cfg.trainer.parallel
    world, fsdp = parallel.world_size, parallel.strategy == "fsdp2"
    trainable = adapter or shape.parameters
    full = WEIGHT_BYTES * (shape.parameters + adapter)
    shards = world if fsdp else 1
    offload = fsdp and parallel.cpu_offload
    what = "the adapter's" if adapter else "every parameter's"
    parts = [Part("weights (fp32)", full, 0 if fsdp else full, ALL,
                  note="rank 0 keeps the whole model for rollout and evaluation" if parallel.strategy != "none" else "")]
    if fsdp:
        gathered_dtype = 2 if parallel.param_dtype == "bf16" else 4
        layers = FSDP_GATHERED_LAYERS * shape.largest_layer if parallel.reshard_after_forward else (
            shape.parameters - shape.root_parameters)
        gathered = gathered_dtype * (shape.root_parameters + layers)
        parts += [Part("training shard (FSDP2)", full // world, full // world, RL, host=offload,
                       note=f"a copy of the weights sharded over {world} ranks"),
                  Part("gathered parameters (FSDP2)", gathered, gathered, UPDATE,
                       note=f"root + {FSDP_GATHERED_LAYERS if parallel.reshard_after_forward else 'all'} layers "
                            f"in {parallel.param_dtype}")]
    gradients = 4 * trainable // shards
    parts.append(Part("gradients (fp32)", gradients, gradients, UPDATE, host=offload, note=f"{what}, freed after each step"))
    if parallel.strategy == "ddp":
        parts.append(Part("gradient buckets (DDP)", 4 * trainable, 4 * trainable, RL, note="DDP's all-reduce buffers"))
    adam = ADAM_BYTES * trainable // shards
    parts.append(Part("optimizer state (AdamW, fp32)", adam, adam, RL, host=offload, note=f"two moments of {what}"))
    return parts


def _model_copy_parts(cfg: TidalConfig, shape: ModelShape, adapter: int) -> list[Part]:
    """The reference model, the value model and merge's starting weights, when the config asks."""
    full = WEIGHT_BYTES * shape.parameters
    parts = []
    if cfg.algorithm.kl_coef > 0:
        reference = 0 if adapter else full
        parts.append(Part("reference model (fp32)", reference, reference, RL,
                          note="the base model with the adapter off" if adapter else "kl_coef > 0: a frozen copy"))
    if needs_critic(cfg.algorithm.advantage):
        parts.append(Part("value model (weights + AdamW)", full + STATE_BYTES * shape.parameters, 0, RL,
                          note=f"{cfg.algorithm.advantage}: a copy of the backbone"))
    if cfg.merge.weight < 1:
        parts.append(Part("merge: starting weights", full, 0, RL, note=f"merge.weight {cfg.merge.weight} < 1"))
    return parts


def sequence_blocks(workload: Workload, block_size: int) -> int:
    """KV blocks of one longest sequence: a pool with fewer cannot run it (`KVPoolTooSmall`)."""
    return -(-workload.sequence_tokens // block_size)


def engine_rows(cfg: TidalConfig, workload: Workload) -> tuple[int, int]:
    """(the loop engine's, each async rollout worker's) rows at once: the loop's evaluates, and
    samples RL batches too in sync mode; a worker samples RL batches."""
    sync = cfg.pipeline.mode != "async"
    return max(workload.eval_rows, workload.generation_rows if sync else 0, 1), workload.generation_rows


def wanted_kv_blocks(cfg: TidalConfig, workload: Workload) -> int:
    """rollout.kv_blocks, or the blocks the largest engine batch never preempts in (module
    docstring): each prompt's blocks once (its samples fork from it) and each row's completion
    blocks plus the partial prompt block it copies; agent episodes share nothing."""
    rollout = cfg.rollout
    if rollout.kv_blocks is not None:
        return rollout.kv_blocks
    size = rollout.kv_block_size
    if workload.sequence_tokens != workload.prompt_tokens + rollout.max_new_tokens:  # agent episodes
        return max(engine_rows(cfg, workload)) * sequence_blocks(workload, size)

    def blocks(rows: int, samples: int) -> int:
        prompts = -(-rows // max(samples, 1))
        return prompts * -(-workload.prompt_tokens // size) + rows * (-(-rollout.max_new_tokens // size) + 1)

    batches = [(workload.generation_rows, rollout.group_size), (workload.eval_rows, cfg.eval.samples_per_task)]
    return max(sequence_blocks(workload, size), *(blocks(rows, samples) for rows, samples in batches))


def _kv_token_bytes(cfg: TidalConfig, shape: ModelShape) -> int:
    """Keys and values of one position in every layer, in the engine's compute dtype."""
    itemsize = 2 if cfg.rollout.engine_dtype == "bfloat16" else WEIGHT_BYTES  # "auto" may stay fp32
    return 2 * shape.dims.layers * shape.kv_heads * shape.head_dim * itemsize


def _generation_parts(cfg: TidalConfig, shape: ModelShape, workload: Workload, kv_blocks: int) -> list[Part]:
    """Every rollout engine's KV pool, decode view and decode logits, and async mode's rollout
    workers (module docstring)."""
    pipeline = cfg.pipeline
    kv_token = _kv_token_bytes(cfg, shape)
    pool = kv_blocks * cfg.rollout.kv_block_size * kv_token
    view_tokens = workload.sequence_tokens + 1  # the view holds one position past the longest sequence

    def logits(rows: int) -> int:
        return rows * shape.dims.vocab * 4 * SAMPLING_COPIES

    loop_rows, worker_rows = engine_rows(cfg, workload)
    pool_note = f"{kv_blocks} blocks of {cfg.rollout.kv_block_size} positions (rollout.kv_blocks)"
    # The engine is built after the warm start and keeps its pool and its grown view.
    parts = [Part("KV pool (loop engine)", pool, 0, RL, note=pool_note),
             Part("decode view (loop engine)", loop_rows * view_tokens * kv_token, 0, RL,
                  note=f"{loop_rows} rows x {view_tokens} positions"),
             Part("decode logits", logits(loop_rows), 0, GENERATION, note=f"{SAMPLING_COPIES} x (rows, vocab) fp32")]
    if pipeline.mode != "async":
        return parts
    workers, full = pipeline.rollout_workers, WEIGHT_BYTES * shape.parameters
    engine = pool + worker_rows * view_tokens * kv_token + logits(worker_rows)
    if pipeline.backend == "local":
        parts += [Part("rollout workers' model copies", workers * full, 0, RL, note=f"{workers} async worker(s)"),
                  Part("rollout workers' engines", workers * engine, 0, RL,
                       note=f"each: the KV pool, a view of {worker_rows} rows and their logits, while the trainer updates")]
    else:
        each = RUNTIME_BYTES + full + engine
        parts.append(Part("ray rollout workers", 0, 0, RL, host=True, outside=workers * each + full,
                          note=f"{workers} actor process(es) and the object store's copy"))
    parts.append(Part("published weights (CPU snapshot)", full, 0, RL, host=True))
    return parts


def engines(cfg: TidalConfig) -> int:
    """Rollout engines the run builds, each with its own KV pool: the loop's and, in async mode,
    one per rollout worker."""
    return 1 + (cfg.pipeline.rollout_workers if cfg.pipeline.mode == "async" else 0)


def _warm_start_parts(cfg: TidalConfig, shape: ModelShape, workload: Workload, device: torch.device) -> list[Part]:
    """The warm start's update: one process, the whole model trained (its own TrainerConfig)."""
    warm = cfg.warm_start
    if not warm.enabled or warm.steps == 0 or workload.warm_start_tokens == 0:
        return []
    trainer = TrainerConfig(micro_batch_size=warm.batch_size)
    autocast = choose_precision_for(trainer.precision, device, shape.parameters, shape.widest_linear).dtype
    memory = _memory_plan(shape, trainer, shape.parameters, 0, autocast, False, False)
    length = workload.warm_start_tokens
    activations, head = _update_transients(shape, memory, warm.batch_size, length, length)
    return [Part("warm start: gradients + AdamW", STATE_BYTES * shape.parameters, 0, WARM),
            Part("warm start: activations + head", activations + head, 0, WARM,
                 note=f"{warm.batch_size} rows x {length} tokens (prompt + reference)")]


def _micro_batch(cfg: TidalConfig, memory: MemoryPlan, length: int) -> tuple[int, int]:
    """(rows per micro-batch, rows per rank) of one RL batch: each rank trains its share of the
    tasks_per_step * group_size rows, `micro_batch_size` (or auto's choice) at a time."""
    rows = cfg.tasks.tasks_per_step * cfg.rollout.group_size
    per_rank = -(-rows // cfg.trainer.parallel.world_size)
    size = cfg.trainer.micro_batch_size
    return (memory.rows(length, per_rank) if size == "auto" else min(size, per_rank)), per_rank


def plan_run(cfg: TidalConfig, shape: ModelShape, workload: Workload, device: torch.device,
             capacity: Capacity, rate: MatmulRate | None = None, overlap: Overlap | None = None) -> RunPlan:
    """The run's parts per rank, its micro-batch, its engines' KV pool and, given a matmul `rate`,
    its throughput (module docstring). Without rollout.kv_blocks, the pools shrink (down to one
    sequence's blocks) where the machine cannot hold the largest batch's."""
    wanted = wanted_kv_blocks(cfg, workload)
    plan = _plan(cfg, shape, workload, device, capacity, rate, overlap, wanted)
    if plan.fits or cfg.rollout.kv_blocks is not None:
        return plan
    excess = max(predicted - available for _, predicted, available in plan.checks)
    per_block = engines(cfg) * cfg.rollout.kv_block_size * _kv_token_bytes(cfg, shape)
    fewer = max(sequence_blocks(workload, cfg.rollout.kv_block_size), wanted - -(-excess // per_block))
    return _plan(cfg, shape, workload, device, capacity, rate, overlap, fewer) if fewer < wanted else plan


def _plan(cfg: TidalConfig, shape: ModelShape, workload: Workload, device: torch.device, capacity: Capacity,
          rate: MatmulRate | None, overlap: Overlap | None, kv_blocks: int) -> RunPlan:
    trainer = cfg.trainer
    adapter = adapter_parameters(shape, trainer)
    precision = choose_precision_for(trainer.precision, device, shape.parameters, shape.widest_linear)
    critic = needs_critic(cfg.algorithm.advantage)
    parts = [Part("runtime (torch + process)", RUNTIME_BYTES, RUNTIME_BYTES, ALL, host=True,
                  note="measured: the smoke run's peak resident set")]
    if trainer.lora.enabled:
        parts.append(Part("peft (imported for LoRA)", PEFT_BYTES, PEFT_BYTES, ALL, host=True,
                          note="measured: what `import peft` adds to the resident set"))
    if device.type == "cuda":
        parts.append(Part("CUDA context", CUDA_CONTEXT_BYTES, CUDA_CONTEXT_BYTES, ALL, note="assumed, not measured"))
    state = _state_parts(cfg, shape, adapter)
    copies = _model_copy_parts(cfg, shape, adapter)
    generation = _generation_parts(cfg, shape, workload, kv_blocks)
    # What the trainer's `micro_batch_size: auto` sees free: all but what it allocates itself.
    persistent = [p for p in [*parts, *state[:1], *copies, *generation] if "update" in p.phases and "generation" in p.phases]
    world = trainer.parallel.world_size
    others = (world - 1) * sum(p.other_ranks for p in persistent) if device.type == "cpu" else 0
    free = max(capacity.device - sum(p.rank0 for p in persistent) - others, 0)
    length = workload.sequence_tokens
    completion = max(length - workload.prompt_tokens, 1)
    memory = _memory_plan(shape, trainer, adapter or shape.parameters, free, precision.dtype,
                          trainer.gradient_checkpointing, critic)
    rows, per_rank = _micro_batch(cfg, memory, length)
    activations, head = _update_transients(shape, memory, rows, length, completion)
    flipped = _memory_plan(shape, trainer, adapter or shape.parameters, free, precision.dtype,
                           not trainer.gradient_checkpointing, critic)
    checkpointing = "with" if trainer.gradient_checkpointing else "without"
    transients = [
        Part("activations", activations, activations, UPDATE,
             note=f"{rows} rows x {length} tokens, {checkpointing} gradient checkpointing"),
        Part("log-prob head", head, head, UPDATE,
             note=f"chunks of {trainer.logprob_chunk_tokens} tokens" if memory.head else "full logits"),
    ]
    parts += [*state, *transients, *copies, *generation, *_warm_start_parts(cfg, shape, workload, device)]
    assumptions = _assumptions(cfg, workload, precision.reason, rows, per_rank)
    wanted = wanted_kv_blocks(cfg, workload)
    if kv_blocks < wanted:
        assumptions.append(f"KV pools of {kv_blocks} blocks, not the {wanted} the largest batch needs, to fit this "
                           "machine: the engines preempt and recompute sequences beyond them")
    return RunPlan(
        parts=tuple(parts), parameters=shape.parameters, trainable=adapter or shape.parameters, world_size=world,
        device=device.type, capacity=capacity, micro_batch_size=rows, sequence_tokens=length,
        precision="bf16" if precision.dtype is not None else "fp32",
        activations_flipped=_update_transients(shape, flipped, rows, length, completion)[0],
        throughput=step_throughput(cfg, shape, workload, adapter, rate, device, rows, per_rank, overlap) if rate else None,
        assumptions=tuple(assumptions), kv_blocks=kv_blocks, kv_block_size=cfg.rollout.kv_block_size,
        sequence_blocks=sequence_blocks(workload, cfg.rollout.kv_block_size),
    )


def _assumptions(cfg: TidalConfig, workload: Workload, precision: str, rows: int, per_rank: int) -> list[str]:
    """What the numbers take for granted, in the plan's output."""
    trainer = cfg.trainer
    lines = [
        (f"rows as long as the longest prompt ({workload.prompt_tokens} tokens) + the longest completion "
         f"({workload.sequence_tokens - workload.prompt_tokens}): an upper bound"),
        f"micro-batch: {rows} of the {per_rank} rows each rank trains per step"
        + (" (auto: trainer/memory.py's choice for the memory left)" if trainer.micro_batch_size == "auto" else ""),
        f"precision: {precision}",
        ("a phase's parts add up; phases (warm start, generation, update) do not overlap, except that async "
         "rollout workers generate during the update"),
        ("step time: FLOPs of the linear layers and the head (not attention scores) at the measured share of the "
         "matmul rate"),
    ]
    if trainer.parallel.strategy != "none":
        lines.append(f"{trainer.parallel.strategy}: rank 0 is the loop's process and keeps the whole model for "
                     "rollout; the other ranks start after the warm start")
    return lines
