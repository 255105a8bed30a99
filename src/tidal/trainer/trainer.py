"""The update step: micro-batches, mixed precision, gradient clipping, LR schedule.

`Trainer.rl_step` trains on a `TrainBatch` with the configured policy loss, the KL term (in the
loss or in the reward, with a fixed or adaptive coefficient), the entropy bonus, an optional
replay cross-entropy against forgetting, and, for an advantage estimator that needs one (`gae`),
the value model (tidal.trainer.critic);
`Trainer.sft_step` runs a supervised cross-entropy step through the same machinery (used by the
warm start). A batch is split into micro-batches of `micro_batch_size` sequences whose gradients
accumulate; each micro-batch loss is normalised by the whole batch's denominator (all its
completion tokens for token aggregation), so the accumulated gradient equals the gradient of the
whole-batch loss. An update whose loss or gradient norm is not finite is skipped and reported
(`skipped: 1`).

Memory and speed of a real model's update: the log-prob passes compute the LM head in
checkpointed chunks at the positions the losses read (trainer/logprobs.py,
`trainer.logprob_chunk_tokens`); `trainer.gradient_checkpointing` recomputes each layer in the
backward; `trainer.precision` picks bf16 autocast where it pays (trainer/precision.py);
`trainer.micro_batch_size: auto` sizes micro-batches from the memory available
(trainer/memory.py). What was chosen is in `Trainer.setup`, logged when the trainer is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from tidal.algos.advantages import CRITIC_ADVANTAGES, get_advantage, needs_critic
from tidal.algos.gae import clipped_value_loss, explained_variance
from tidal.algos.kl import KLController, kl_adjusted_advantages
from tidal.algos.losses import (
    LossInputs,
    LossOptions,
    compute_loss,
    get_loss,
    kl_penalty,
    loss_denominator,
    needs_prox_logprobs,
)
from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.trainer.checkpoint import load_training_state, save_training_state
from tidal.trainer.critic import CRITIC_FILE, Critic, PolicyWithCritic
from tidal.trainer.logprobs import split_model, token_logprobs, trim_padding
from tidal.trainer.lora import adapter_disabled, has_adapter
from tidal.trainer.memory import MemoryPlan, plan_memory
from tidal.trainer.optim import adamw
from tidal.trainer.parallel.rank import RankContext, full_norm
from tidal.trainer.precision import autocast_dtype_for, choose_precision
from tidal.trainer.prefix import prompt_groups, shared_prefix_logprobs
from tidal.types import TrainBatch

__all__ = ["ReplayBatch", "Trainer", "WarmupSchedule", "autocast_dtype_for"]

logger = logging.getLogger(__name__)

MicroLoss = Callable[[slice], tuple[Tensor, dict[str, float]]]

class Part(NamedTuple):
    """Rows of one batch and the loss of a slice of them; `tokens` (per row) and `starts` (row i
    starts a prompt group) say how ranks split the rows (trainer/parallel/rank.py)."""

    rows: int
    loss: MicroLoss
    tokens: list[int] | None = None
    starts: list[bool] | None = None

# The key of the trainer's own state (the KL coefficient) in a checkpoint's `extra`.
TRAINER_STATE = "trainer_state"


@dataclasses.dataclass
class ReplayBatch:
    """Supervised sequences trained with an RL batch against forgetting (`Trainer.rl_step`): base
    data or earlier good trajectories, chosen by the loop. Same layout as `sft_step`'s arguments."""

    input_ids: Tensor  # (R, T) long, right-padded
    attention_mask: Tensor  # (R, T) long, 1 for real tokens
    loss_mask: Tensor  # (R, T) float, 1 on the tokens whose prediction is trained


@dataclasses.dataclass
class ValueTargets:
    """What the value model trains on in one rl_step (gae): all (B, T), fixed for its epochs."""

    old_values: Tensor  # the value model's values before this step's updates
    returns: Tensor  # GAE returns, the regression targets
    mask: Tensor  # completion tokens of the sequences that have a reward


class WarmupSchedule:
    """LR multiplier for LambdaLR: linear warmup to 1, then constant, cosine or linear decay to 0.

    A class rather than a lambda so that LambdaLR's state_dict records its fields.
    """

    def __init__(self, warmup_steps: int, total_steps: int, schedule: str) -> None:
        if schedule not in ("constant", "cosine", "linear"):
            raise ValueError(f"unknown LR schedule {schedule!r}; known: constant, cosine, linear")
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.schedule = schedule

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        progress = min(max(progress, 0.0), 1.0)
        if self.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress


def _wide(values: Tensor) -> Tensor:
    """At least fp32: bf16 batch tensors are widened, fp64 ones (tests) stay fp64."""
    return values.to(torch.promote_types(values.dtype, torch.float32))


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    count = float(mask.sum())
    return float((values.detach() * mask).sum()) / count if count > 0 else 0.0


def _slice(values: Tensor | None, rows: slice) -> Tensor | None:
    """`values[rows]` of an optional per-row tensor."""
    return None if values is None else values[rows]


def _rows(values: Tensor, rows: slice, length: int) -> Tensor:
    """A micro-batch of per-sequence (B,) or per-token (B, T) values."""
    return values[rows] if values.dim() == 1 else values[rows, :length]


def _enable_checkpointing(model: torch.nn.Module) -> None:
    """Hugging Face's per-layer checkpointing, non-reentrant (it replays autocast, and needs no
    input that requires grad): `activation_checkpointing_enable` in recent transformers (where
    the other name is deprecated), else `gradient_checkpointing_enable`."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
        return
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise ValueError(f"trainer.gradient_checkpointing: {type(model).__name__} has no activation or gradient "
                         "checkpointing to enable (a Hugging Face model has); set it to false")
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout of `model` but LoRA's own (`trainer.lora.dropout`) to 0, and return how
    many there were: the engine samples in eval mode, so with dropout the trainer's log-probs of
    the same policy differ from the behaviour log-probs and the importance ratio carries its noise
    (GPT-2's checkpoints have 0.1 in three places; TRL's GRPO turns dropout off the same way)."""
    count = 0
    for name, module in model.named_modules():
        if "lora_dropout" in name:
            continue
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            module.p = 0.0
            count += 1
        rate = getattr(module, "attention_dropout", None)  # the Llama family's attention takes a float
        if isinstance(rate, float) and rate > 0:
            module.attention_dropout = 0.0
            count += 1
    return count


class Trainer:
    """Optimizer, schedule and update steps for one policy model (and its value model for gae).

    `max_tokens` is the constant of `token_sum` aggregation (Dr. GRPO): pass the generation
    budget (rollout.max_new_tokens). `updates` counts the optimizer steps actually taken.
    `kl` holds the KL coefficient (adaptive when `algorithm.kl_target` is set); `critic` is
    the value model, created as a copy of the policy's backbone when `algorithm.advantage` is an
    estimator that needs one (`needs_critic`: the `CRITIC_ADVANTAGES`, i.e. gae), else None.
    `setup` records the precision decision, the log-prob path, gradient checkpointing and the
    micro-batch plan; `micro_batch_size` is the size of the latest batch's micro-batches.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        trainer_cfg: TrainerConfig,
        algo_cfg: AlgorithmConfig,
        device: torch.device | str,
        total_steps: int,
        temperature: float = 1.0,
        ref_model: torch.nn.Module | None = None,
        max_tokens: int | None = None,
        rank: RankContext | None = None,
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for training logprobs, got {temperature}")
        if algo_cfg.aggregation == "token_sum" and not max_tokens:
            raise ValueError("algorithm.aggregation 'token_sum' needs Trainer(max_tokens=rollout.max_new_tokens)")
        get_advantage(algo_cfg.advantage)  # an unknown estimator fails here, not after the first rollout
        self.device = torch.device(device)
        self.model = model.to(self.device)
        if disable_dropout(self.model):
            logger.info("trainer: dropout off in %s (the engine samples without it)", type(model).__name__)
        self.cfg = trainer_cfg
        self.algo = algo_cfg
        self.temperature = temperature
        self.max_tokens = max_tokens
        get_loss(algo_cfg.loss)  # an unknown loss fails here too
        self.loss_fn = compute_loss  # (LossInputs, LossOptions) -> LossOutputs; debug.inject wraps it
        self.ref_model = ref_model
        if ref_model is not None:
            ref_model.to(self.device).eval()
            ref_model.requires_grad_(False)
        if trainer_cfg.gradient_checkpointing:
            _enable_checkpointing(self.model)
        precision = choose_precision(trainer_cfg.precision, self.device, self.model)
        self.autocast_dtype = precision.dtype
        self.updates = 0
        self.kl = KLController(algo_cfg.kl_coef, algo_cfg.kl_target, algo_cfg.kl_horizon)
        betas = (trainer_cfg.betas[0], trainer_cfg.betas[1])
        self.critic: Critic | None = None
        if needs_critic(algo_cfg.advantage):
            if rank is not None:
                raise ValueError(f"algorithm.advantage {algo_cfg.advantage!r}: the value model trains in one process")
            self.critic = Critic(self.model, algo_cfg.critic_lr, betas, trainer_cfg.weight_decay, self.device)
        chunked = trainer_cfg.logprob_chunk_tokens > 0 and split_model(self.model) is not None
        self.memory: MemoryPlan | None = None
        if trainer_cfg.micro_batch_size == "auto":  # measured before the gradients and AdamW state exist
            self.memory = plan_memory(self.model, self.device, self.autocast_dtype, trainer_cfg.gradient_checkpointing,
                                      trainer_cfg.logprob_chunk_tokens, chunked, value_model=self.critic is not None)
        self.rank = rank
        if rank is not None:
            rank.wrap(self.model)  # FSDP2 shards the parameters in place: the optimizer holds the shards
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = adamw(self.params, lr=trainer_cfg.lr, betas=betas, weight_decay=trainer_cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, WarmupSchedule(trainer_cfg.warmup_steps, total_steps, trainer_cfg.schedule)
        )
        self.micro_batch_size = trainer_cfg.micro_batch_size if isinstance(trainer_cfg.micro_batch_size, int) else 1
        self.setup: dict[str, Any] = {
            "precision": precision.record(),
            "logprobs": f"chunked, {trainer_cfg.logprob_chunk_tokens} tokens" if chunked else "full logits",
            "gradient_checkpointing": trainer_cfg.gradient_checkpointing,
            "micro_batch_size": trainer_cfg.micro_batch_size,
        }
        if rank is not None:
            self.setup["parallel"] = f"{rank.strategy}, {rank.world_size} ranks"
        logger.info("trainer: %s", self.setup)

    def _size_micro_batches(self, rows: int, *masks: Tensor) -> None:
        """Set `micro_batch_size` for a batch of `rows` sequences whose longest row is the
        longest of `masks`' (attention masks); `micro_batch_size: auto` asks the memory plan,
        and logs a size that differs from the last one."""
        if self.memory is None:
            return
        length = max(int(mask.sum(dim=1).max()) for mask in masks if mask.numel())
        size = self.memory.rows(length, rows)
        if size != self.micro_batch_size or "micro_batch_plan" not in self.setup:
            self.setup["micro_batch_plan"] = self.memory.record(length, rows)
            logger.info("trainer: micro-batch size %d for %d rows of up to %d tokens (%s)",
                        size, rows, length, self.setup["micro_batch_plan"])
        self.micro_batch_size = size

    # ---------------------------------------------------------------- update machinery

    def _apply(self, parts: list[Part], critic: bool = False) -> dict[str, float]:
        """Accumulate gradients over the micro-batches of every part, clip, and step unless
        something is not finite. `critic` steps the value model's optimizer instead of the policy's."""
        if critic:
            assert self.critic is not None
            module, params, optimizer = self.critic.model, self.critic.params, self.critic.optimizer
        else:
            module, params, optimizer = self.model, self.params, self.optimizer
        module.train()
        optimizer.zero_grad(set_to_none=True)
        rank = self.rank
        if rank is None:
            chunks = [(part.loss, slice(start, start + self.micro_batch_size), 1.0)
                      for part in parts for start in range(0, part.rows, self.micro_batch_size)]
        else:
            chunks = rank.my_chunks(parts, self.micro_batch_size)
        scale = 1.0 if rank is None else float(rank.world_size)  # DDP and FSDP2 average over the ranks
        sums: dict[str, float] = defaultdict(float)
        total_loss, finite = 0.0, True
        for index, (micro_loss, rows, weight) in enumerate(chunks):
            with rank.gradient_sync(index == len(chunks) - 1) if rank is not None else contextlib.nullcontext():
                loss, metrics = micro_loss(rows)
                value = float(loss.detach()) * weight
                total_loss += value
                if not math.isfinite(value):
                    finite = False
                    if rank is None:
                        break  # with ranks every one goes on: their collectives must match
                (loss * (weight * scale) if rank is not None else loss).backward()
            for key, metric in metrics.items():
                sums[key] += metric * weight
        if rank is not None:
            finite = rank.all_true(finite)
            summed = rank.sum_metrics({**sums, "\0loss": total_loss})
            total_loss = summed.pop("\0loss")
            sums = defaultdict(float, summed)
        grad_norm = math.nan
        if finite:
            grad_norm = full_norm(torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip))
        lr = float(optimizer.param_groups[0]["lr"])
        skipped = not (finite and math.isfinite(grad_norm))
        if not skipped:
            optimizer.step()
            if not critic:
                self.scheduler.step()
                self.updates += 1
        optimizer.zero_grad(set_to_none=True)
        return {"loss": total_loss, "grad_norm": grad_norm, "lr": lr, "skipped": float(skipped), **sums}

    def _logprobs(self, model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                  prompt_lengths: Tensor | None = None, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        """Per-token logprobs (and entropies) of right-padded rows, at the `positions` the caller
        reads (kwargs; the others are 0); with `prompt_lengths` and `trainer.shared_prefix`, rows
        that share a prompt run it once (trainer/prefix.py), and only completion positions are
        computed. Under gradient checkpointing a pass with gradients runs whole rows: Hugging
        Face's checkpointed layers drop the KV cache the shared prompt lives in."""
        if self.rank is not None and model is self.model:  # through DDP / FSDP2 (trainer/parallel/rank.py)
            return self.rank.call(self._logprob_pass, input_ids, attention_mask, prompt_lengths, **kwargs)
        return self._logprob_pass(model, input_ids, attention_mask, prompt_lengths, **kwargs)

    def _logprob_pass(self, model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                      prompt_lengths: Tensor | None = None, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        kwargs.update(autocast_dtype=self.autocast_dtype, chunk_tokens=self.cfg.logprob_chunk_tokens)
        checkpointed = self.cfg.gradient_checkpointing and torch.is_grad_enabled() and model.training
        if prompt_lengths is not None and self.cfg.shared_prefix and not checkpointed:
            groups = prompt_groups(input_ids, prompt_lengths)
            # FSDP2 ranks must run the decoder as many times each: they all take the shared path.
            if len(groups[0]) < len(groups[1]) or (self.rank is not None and self.rank.sharded):
                return shared_prefix_logprobs(model, input_ids, attention_mask, prompt_lengths, groups=groups, **kwargs)
        return token_logprobs(model, input_ids, attention_mask, **kwargs)

    def _cross_entropy(
        self, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, weight: float = 1.0, metric: str | None = None
    ) -> tuple[Part, float]:
        """The part of a supervised loss, weight * mean cross-entropy over the tokens where
        loss_mask is 1 (temperature 1), and its token count. `metric` reports the unweighted mean."""
        input_ids = input_ids.to(self.device)  # (R, T)
        attention_mask = attention_mask.to(self.device)  # (R, T)
        loss_mask = _wide(loss_mask.to(self.device)) * attention_mask  # (R, T)
        total_tokens = float(loss_mask.sum())

        def micro_loss(rows: slice) -> tuple[Tensor, dict[str, float]]:
            ids, attn, length = trim_padding(input_ids[rows], attention_mask[rows])
            mask = loss_mask[rows, :length]  # (r, t)
            logprobs, _ = self._logprobs(self.model, ids, attn, positions=mask)  # (r, t)
            cross_entropy = -(logprobs * mask).sum() / max(total_tokens, 1.0)
            return weight * cross_entropy, ({metric: float(cross_entropy.detach())} if metric else {})

        return Part(input_ids.shape[0], micro_loss, attention_mask.sum(dim=1).tolist()), total_tokens

    # ---------------------------------------------------------------- RL

    def _reference_logprobs(self, batch: TrainBatch) -> Tensor | None:
        """Reference logprobs (B, T): from the batch when given, else from `ref_model`, else, for a
        LoRA-adapted policy with a KL term, from the policy with its adapter off (the base model)."""
        if batch.ref_logprobs is not None:
            return _wide(batch.ref_logprobs.to(self.device))
        if self.ref_model is None:
            if self.algo.kl_coef > 0 and has_adapter(self.model):
                with adapter_disabled(self.model):
                    return self._frozen_logprobs(self.model, batch)
            if self.algo.kl_coef > 0:
                raise ValueError("algorithm.kl_coef > 0 needs Trainer(ref_model=...) or batch.ref_logprobs")
            return None
        return self._frozen_logprobs(self.ref_model, batch)

    def _frozen_logprobs(self, model: torch.nn.Module, batch: TrainBatch) -> Tensor:
        """`model`'s logprobs (B, T) of the batch's tokens, without gradient. With ranks, each
        computes its own rows' and they are summed (every rank gets them all)."""
        out = torch.zeros_like(batch.old_logprobs)  # (B, T)
        rows_total = batch.input_ids.shape[0]
        if self.rank is None:
            chunks = [(slice(s, s + self.micro_batch_size), 1.0) for s in range(0, rows_total, self.micro_batch_size)]
        else:  # the sharded policy gathers its layers in each pass: as many passes on every rank
            part = Part(rows_total, lambda rows: (torch.zeros(()), {}), *self._split_keys(batch))
            chunks = [(rows, weight) for _, rows, weight in self.rank.my_chunks([part], self.micro_batch_size)
                      if weight or (model is self.model and self.rank.sharded)]
        with torch.no_grad():
            for rows, weight in chunks:
                ids, attn, length = trim_padding(batch.input_ids[rows], batch.attention_mask[rows])
                values, _ = self._logprobs(model, ids, attn, _slice(batch.prompt_lengths, rows),
                                           temperature=self.temperature, positions=batch.completion_mask[rows, :length])
                if weight:
                    out[rows, :length] = values
        return out if self.rank is None else self.rank.sum_(out)

    def _advantages(
        self, batch: TrainBatch, ref_logprobs: Tensor | None, kl_coef: float
    ) -> tuple[Tensor, ValueTargets | None, dict[str, float]]:
        """The advantages the loss trains on, (B,) or (B, T), the value model's targets (gae),
        and their metrics. With kl_in=reward the KL to the reference is taken from the reward
        here (see tidal.algos.kl): per-token k1 of the sampler's logprobs, a constant."""
        mask = batch.completion_mask  # (B, T)
        metrics: dict[str, float] = {}
        reward_kl = None
        if self.algo.kl_in == "reward" and ref_logprobs is not None and kl_coef > 0:
            k1 = kl_penalty(batch.old_logprobs, ref_logprobs, "k1")  # (B, T)
            reward_kl = torch.where(mask > 0, k1, torch.zeros_like(k1))
            metrics["kl_reward"] = _masked_mean(reward_kl, mask)
        if self.critic is not None:
            advantages, targets = self._critic_advantages(batch, reward_kl, kl_coef, metrics)
            return advantages, targets, metrics
        if reward_kl is not None:
            return kl_adjusted_advantages(batch.advantages, reward_kl, mask, kl_coef), None, metrics
        return batch.advantages, None, metrics

    def _critic_advantages(
        self, batch: TrainBatch, reward_kl: Tensor | None, kl_coef: float, metrics: dict[str, float]
    ) -> tuple[Tensor, ValueTargets]:
        """Per-token advantages (B, T) of the run's critic estimator (`CRITIC_ADVANTAGES`; gae:
        tidal.algos.gae.gae_advantages) from the value model's values of the batch. A sequence
        without a valid reward (NaN) gets advantage 0 and does not train the value model."""
        assert self.critic is not None
        name = self.algo.advantage
        if batch.rewards is None:
            raise ValueError(f"algorithm.advantage {name!r} needs TrainBatch.rewards (the sequence rewards; collate fills them)")
        rewards = _wide(batch.rewards.to(self.device))  # (B,)
        valid = torch.isfinite(rewards)  # (B,)
        mask = batch.completion_mask * valid.unsqueeze(-1)  # (B, T)
        old_values = self.critic.values(
            batch.input_ids, batch.attention_mask, self.micro_batch_size, self.autocast_dtype
        ).to(mask.dtype)  # (B, T)
        advantages, returns = CRITIC_ADVANTAGES[name](
            torch.where(valid, rewards, torch.zeros_like(rewards)), old_values, mask,
            gamma=self.algo.gamma, lam=self.algo.lam, kl=reward_kl, kl_coef=kl_coef,
        )  # (B, T) each
        metrics["value_mean"] = _masked_mean(old_values, mask)
        metrics["returns_mean"] = _masked_mean(returns, mask)
        metrics["explained_variance"] = explained_variance(old_values, returns, mask)
        return advantages, ValueTargets(old_values, returns, mask)

    def _critic_epoch(self, batch: TrainBatch, targets: ValueTargets) -> dict[str, float]:
        """One update of the value model: clipped value loss, token mean over the batch."""
        assert self.critic is not None
        critic = self.critic
        total_tokens = float(targets.mask.sum())
        if total_tokens == 0:
            return {}

        def micro_loss(rows: slice) -> tuple[Tensor, dict[str, float]]:
            ids, attn, length = trim_padding(batch.input_ids[rows], batch.attention_mask[rows])
            values = critic.model(ids, attn, self.autocast_dtype)  # (b, t)
            per_token = clipped_value_loss(
                values, targets.old_values[rows, :length], targets.returns[rows, :length], self.algo.value_clip
            )  # (b, t)
            mask = targets.mask[rows, :length]
            return torch.where(mask > 0, per_token, torch.zeros_like(per_token)).sum() / total_tokens, {}

        stats = self._apply([Part(batch.input_ids.shape[0], micro_loss)], critic=True)
        return {"value_loss": stats["loss"], "critic_grad_norm": stats["grad_norm"], "critic_skipped": stats["skipped"]}

    def _on_device(self, batch: TrainBatch) -> TrainBatch:
        """The batch's tensors that every update reads, on the trainer's device (float ones at least fp32)."""
        return dataclasses.replace(
            batch,
            input_ids=batch.input_ids.to(self.device),
            attention_mask=batch.attention_mask.to(self.device),
            completion_mask=_wide(batch.completion_mask.to(self.device)),
            old_logprobs=_wide(batch.old_logprobs.to(self.device)),
            advantages=_wide(batch.advantages.to(self.device)),
        )

    def _policy_part(
        self, batch: TrainBatch, advantages: Tensor, ref_logprobs: Tensor | None, kl_coef: float, total_tokens: float
    ) -> Part:
        """The part of the RL loss: per micro-batch, the log-probs of the policy, then the loss on
        `advantages` (B,) or (B, T) in one call (tidal.algos.losses.compute_loss), normalised by the
        whole batch's denominator; its metrics are weighted to sum to the batch's means."""
        options = LossOptions.from_config(self.algo, self.max_tokens, kl_coef)
        denominator = loss_denominator(batch.completion_mask, self.algo.aggregation)
        # The proximal policy of decoupled PPO: these weights before this step's first update.
        prox_logprobs = self._frozen_logprobs(self.model, batch) if needs_prox_logprobs(self.algo.loss) else None

        def micro_loss(rows: slice) -> tuple[Tensor, dict[str, float]]:
            ids, attn, length = trim_padding(batch.input_ids[rows], batch.attention_mask[rows])
            mask = batch.completion_mask[rows, :length]  # (b, t)
            logprobs, entropy = self._logprobs(
                self.model, ids, attn, _slice(batch.prompt_lengths, rows), temperature=self.temperature,
                with_entropy=True, entropy_grad=self.algo.entropy_coef > 0, positions=mask,
            )  # (b, t), (b, t)
            inputs = LossInputs(
                logprobs, batch.old_logprobs[rows, :length], _rows(advantages, rows, length), mask, entropy=entropy,
                ref_logprobs=None if ref_logprobs is None else ref_logprobs[rows, :length],
                prox_logprobs=None if prox_logprobs is None else prox_logprobs[rows, :length],
                denominator=denominator, batch_tokens=total_tokens,
            )
            loss, metrics = self.loss_fn(inputs, options)
            return loss, metrics

        return Part(batch.input_ids.shape[0], micro_loss, *self._split_keys(batch))

    def _split_keys(self, batch: TrainBatch) -> tuple[list[int], list[bool] | None]:
        """Tokens per row, and where prompt groups start (with prompt lengths): how ranks split the rows."""
        tokens = batch.attention_mask.sum(dim=1).tolist()
        if batch.prompt_lengths is None:
            return tokens, None
        source = prompt_groups(batch.input_ids, batch.prompt_lengths)[1]
        return tokens, [i == 0 or source[i] != source[i - 1] for i in range(len(source))]

    def _replay_parts(self, replay: ReplayBatch | None) -> list[Part]:
        """The replay cross-entropy's part, when there is a replay batch with tokens to train and
        `algorithm.replay_weight` > 0."""
        if replay is None or not self.algo.replay_weight > 0:
            return []
        part, tokens = self._cross_entropy(
            replay.input_ids, replay.attention_mask, replay.loss_mask, self.algo.replay_weight, "replay_loss"
        )
        return [part] if tokens > 0 else []

    def _epochs(
        self, parts: list[Part], batch: TrainBatch, value_targets: ValueTargets | None, train_policy: bool
    ) -> dict[str, float]:
        """`algorithm.epochs` updates of the policy (unless the critic is warming up) and of the
        value model (when there are value targets). Metrics are means over the epochs, but
        `skipped` counts the skipped updates."""
        epochs = []
        for _ in range(self.algo.epochs):
            stats = self._apply(parts) if train_policy else {}
            if value_targets is not None:
                stats.update(self._critic_epoch(batch, value_targets))
            epochs.append(stats)
        result = {key: sum(e.get(key, 0.0) for e in epochs) / len(epochs) for key in epochs[0]}
        result["skipped"] = sum(e.get("skipped", 0.0) for e in epochs)
        result.setdefault("lr", float(self.optimizer.param_groups[0]["lr"]))  # the critic warmup trains no policy
        return result

    def rl_step(self, batch: TrainBatch, replay: ReplayBatch | None = None) -> dict[str, float]:
        """`algorithm.epochs` updates on `batch` with the policy loss, KL, entropy and replay terms
        (and as many updates of the value model, for gae).

        `replay`, when given and `algorithm.replay_weight` > 0, adds replay_weight * its mean
        token cross-entropy to every update's loss, micro-batched like the RL batch and
        accumulated into the same optimizer step. Metrics are means over the epochs (`skipped`
        counts the skipped updates): loss, policy_loss, grad_norm, lr, entropy, clip_low_frac,
        clip_high_frac, ratio_mean, approx_kl (to the sampler), kl (to the reference, with
        `kl_estimator`) and kl_coef (the coefficient of this step), when a reference is
        available; kl_reward (kl_in=reward); replay_loss; for gae value_loss, critic_grad_norm,
        value_mean, returns_mean, explained_variance (of the values before this step) and
        critic_warmup (1 while only the value model trains); tokens.
        """
        batch = self._on_device(batch)
        num_rows = batch.input_ids.shape[0]
        if num_rows == 0:
            raise ValueError("rl_step needs a batch with at least one sequence")
        total_tokens = float(batch.completion_mask.sum())
        if total_tokens == 0:
            lr = float(self.optimizer.param_groups[0]["lr"])
            return {"loss": 0.0, "grad_norm": 0.0, "lr": lr, "skipped": 1.0, "tokens": 0.0}
        masks = [batch.attention_mask] + ([] if replay is None else [replay.attention_mask])
        self._size_micro_batches(max(mask.shape[0] for mask in masks), *masks)
        ref_logprobs = self._reference_logprobs(batch)
        kl_coef = self.kl.value
        advantages, value_targets, step_metrics = self._advantages(batch, ref_logprobs, kl_coef)
        parts = [self._policy_part(batch, advantages, ref_logprobs, kl_coef, total_tokens), *self._replay_parts(replay)]
        train_policy = self.critic is None or self.critic.steps >= self.algo.critic_warmup_steps
        result = self._epochs(parts, batch, value_targets, train_policy)
        result.update(step_metrics)
        if self.critic is not None:
            self.critic.steps += 1
            result["critic_warmup"] = float(not train_policy)
        if ref_logprobs is not None:
            result["kl_coef"] = kl_coef
            if "kl" in result and result["skipped"] == 0:
                self.kl.update(result["kl"], num_rows)
        result["tokens"] = total_tokens
        return result

    # ---------------------------------------------------------------- supervised

    def sft_step(self, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor) -> dict[str, float]:
        """One supervised update: mean cross-entropy over the tokens where loss_mask is 1.

        Shapes: (B, T) each, right-padded; loss_mask[:, t] = 1 trains the prediction of token t
        from the tokens before it. The temperature is 1 whatever the trainer's sampling one.
        """
        self._size_micro_batches(input_ids.shape[0], attention_mask)
        part, total_tokens = self._cross_entropy(input_ids, attention_mask, loss_mask)
        if total_tokens == 0:
            lr = float(self.optimizer.param_groups[0]["lr"])
            return {"loss": 0.0, "grad_norm": 0.0, "lr": lr, "skipped": 1.0, "tokens": 0.0}
        result = self._apply([part])
        result["tokens"] = total_tokens
        return result

    # ---------------------------------------------------------------- checkpoints

    def save(self, folder: str | Path, step: int, extra: dict[str, Any] | None = None, tokenizer: Any = None,
             weights: torch.nn.Module | None = None, write_optimizer: Callable[[Path], None] | None = None) -> Path:
        """Save model, optimizer, schedule and RNG states atomically (see `save_training_state`),
        the KL coefficient (in `extra`, under TRAINER_STATE) and, for gae, the value model and its
        optimizer (CRITIC_FILE, inside the same atomic folder). Ranked trainers pass the full
        `weights` to save and their `write_optimizer` (trainer/parallel/)."""
        extra = dict(extra or {})
        if TRAINER_STATE in extra:
            raise ValueError(f"checkpoint extra key {TRAINER_STATE!r} is the trainer's own; use another name")
        extra[TRAINER_STATE] = self.kl.state_dict()
        model: Any = weights or (self.model if self.critic is None else PolicyWithCritic(self.model, self.critic))
        return save_training_state(folder, model, self.optimizer, self.scheduler, step, extra, save_tokenizer=tokenizer,
                                   write_optimizer=write_optimizer)

    def load(self, folder: str | Path, read_weights_into: Callable[[Path], None] | None = None) -> tuple[int, dict[str, Any]]:
        """Restore a checkpoint saved by `save`; returns (step, extra) with extra as it was given."""
        step, extra = load_training_state(folder, self.model, self.optimizer, self.scheduler, read_weights_into)
        state = extra.pop(TRAINER_STATE, None)
        if state is not None:  # checkpoints written before the KL coefficient was saved lack it
            self.kl.load_state_dict(state)
        if self.critic is not None:
            self.critic.load(Path(folder) / CRITIC_FILE)
        self.updates = int(self.scheduler.last_epoch)
        return step, extra
