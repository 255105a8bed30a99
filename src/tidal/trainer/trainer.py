"""The update step: micro-batches, mixed precision, gradient clipping, LR schedule.

`Trainer.rl_step` trains on a `TrainBatch` with the configured policy loss; `Trainer.sft_step`
runs a supervised cross-entropy step through the same machinery (used by the warm start). A batch
is split into micro-batches of `micro_batch_size` sequences whose gradients accumulate; each
micro-batch loss is normalised by the whole batch's denominator (all its completion tokens for
token aggregation), so the accumulated gradient equals the gradient of the whole-batch loss.
An update whose loss or gradient norm is not finite is skipped and reported (`skipped: 1`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from tidal.algos.losses import LOSS_INPUTS, aggregate, get_loss, kl_penalty, loss_denominator
from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.trainer.checkpoint import load_training_state, save_training_state
from tidal.trainer.logprobs import token_logprobs
from tidal.types import TrainBatch

MicroLoss = Callable[[slice], tuple[Tensor, dict[str, float]]]


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


def autocast_dtype_for(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 for "bf16", or for "auto" on a CUDA device that supports it; None means fp32."""
    if precision == "bf16":
        return torch.bfloat16
    if precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def _wide(values: Tensor) -> Tensor:
    """At least fp32: bf16 batch tensors are widened, fp64 ones (tests) stay fp64."""
    return values.to(torch.promote_types(values.dtype, torch.float32))


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    count = float(mask.sum())
    return float((values.detach() * mask).sum()) / count if count > 0 else 0.0


def _trim(input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor, int]:
    """Drop the padding columns that no row of this micro-batch uses (rows are right-padded)."""
    length = max(int(attention_mask.sum(dim=1).max()), 1)
    return input_ids[:, :length], attention_mask[:, :length], length


class Trainer:
    """Optimizer, schedule and update steps for one policy model.

    `max_tokens` is the constant of `token_sum` aggregation (Dr. GRPO): pass the generation
    budget (rollout.max_new_tokens). `updates` counts the optimizer steps actually taken.
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
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for training logprobs, got {temperature}")
        if algo_cfg.aggregation == "token_sum" and not max_tokens:
            raise ValueError("algorithm.aggregation 'token_sum' needs Trainer(max_tokens=rollout.max_new_tokens)")
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.cfg = trainer_cfg
        self.algo = algo_cfg
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.loss_fn = get_loss(algo_cfg.loss)
        self.ref_model = ref_model
        if ref_model is not None:
            ref_model.to(self.device).eval()
            ref_model.requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=trainer_cfg.lr, betas=tuple(trainer_cfg.betas), weight_decay=trainer_cfg.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, WarmupSchedule(trainer_cfg.warmup_steps, total_steps, trainer_cfg.schedule)
        )
        self.autocast_dtype = autocast_dtype_for(trainer_cfg.precision, self.device)
        self.updates = 0

    # ---------------------------------------------------------------- update machinery

    def _apply(self, num_rows: int, micro_loss: MicroLoss) -> dict[str, float]:
        """Accumulate gradients over micro-batches, clip, and step unless something is not finite."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        total_loss, finite = 0.0, True
        for start in range(0, num_rows, self.cfg.micro_batch_size):
            loss, metrics = micro_loss(slice(start, start + self.cfg.micro_batch_size))
            value = float(loss.detach())
            total_loss += value
            if not math.isfinite(value):
                finite = False
                break
            loss.backward()
            for key, metric in metrics.items():
                sums[key] += metric
        grad_norm = math.nan
        if finite:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip))
        lr = float(self.optimizer.param_groups[0]["lr"])
        skipped = not (finite and math.isfinite(grad_norm))
        if not skipped:
            self.optimizer.step()
            self.scheduler.step()
            self.updates += 1
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": total_loss, "grad_norm": grad_norm, "lr": lr, "skipped": float(skipped), **sums}

    def _logprobs(self, model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, **kwargs: Any):
        return token_logprobs(model, input_ids, attention_mask, autocast_dtype=self.autocast_dtype, **kwargs)

    # ---------------------------------------------------------------- RL

    def _reference_logprobs(self, batch: TrainBatch) -> Tensor | None:
        """Reference logprobs (B, T): from the batch when given, else from `ref_model`."""
        if batch.ref_logprobs is not None:
            return _wide(batch.ref_logprobs.to(self.device))
        if self.ref_model is None:
            if self.algo.kl_coef > 0:
                raise ValueError("algorithm.kl_coef > 0 needs Trainer(ref_model=...) or batch.ref_logprobs")
            return None
        return self._frozen_logprobs(self.ref_model, batch)

    def _frozen_logprobs(self, model: torch.nn.Module, batch: TrainBatch) -> Tensor:
        """`model`'s logprobs (B, T) of the batch's tokens, without gradient."""
        out = torch.zeros_like(batch.old_logprobs)  # (B, T)
        with torch.no_grad():
            for start in range(0, batch.input_ids.shape[0], self.cfg.micro_batch_size):
                rows = slice(start, start + self.cfg.micro_batch_size)
                ids, attn, length = _trim(batch.input_ids[rows], batch.attention_mask[rows])
                values, _ = self._logprobs(model, ids, attn, temperature=self.temperature)
                out[rows, :length] = values
        return out

    def rl_step(self, batch: TrainBatch) -> dict[str, float]:
        """`algorithm.epochs` updates on `batch` with the policy loss, KL and entropy terms.

        Metrics are means over the epochs (`skipped` counts the skipped updates): loss,
        policy_loss, grad_norm, lr, entropy, clip_low_frac, clip_high_frac, ratio_mean,
        approx_kl (to the sampler), kl (to the reference, when one is available), tokens.
        """
        batch = TrainBatch(
            input_ids=batch.input_ids.to(self.device),
            attention_mask=batch.attention_mask.to(self.device),
            completion_mask=_wide(batch.completion_mask.to(self.device)),
            old_logprobs=_wide(batch.old_logprobs.to(self.device)),
            advantages=_wide(batch.advantages.to(self.device)),
            ref_logprobs=batch.ref_logprobs,
        )
        num_rows = batch.input_ids.shape[0]
        if num_rows == 0:
            raise ValueError("rl_step needs a batch with at least one sequence")
        total_tokens = float(batch.completion_mask.sum())
        if total_tokens == 0:
            lr = float(self.optimizer.param_groups[0]["lr"])
            return {"loss": 0.0, "grad_norm": 0.0, "lr": lr, "skipped": 1.0, "tokens": 0.0}
        denominator = loss_denominator(batch.completion_mask, self.algo.aggregation)
        ref_logprobs = self._reference_logprobs(batch)
        inputs = LOSS_INPUTS.get(self.algo.loss, ())
        # The proximal policy of decoupled PPO: these weights before this step's first update.
        prox_logprobs = self._frozen_logprobs(self.model, batch) if "prox_logprobs" in inputs else None

        def micro_loss(rows: slice) -> tuple[Tensor, dict[str, float]]:
            ids, attn, length = _trim(batch.input_ids[rows], batch.attention_mask[rows])
            mask = batch.completion_mask[rows, :length]  # (b, t)
            logprobs, entropy = self._logprobs(
                self.model, ids, attn, temperature=self.temperature,
                with_entropy=True, entropy_grad=self.algo.entropy_coef > 0,
            )  # (b, t), (b, t)
            options: dict[str, Any] = {}
            if "is_cap" in inputs:
                options["is_cap"] = self.algo.is_cap
            if prox_logprobs is not None:
                options["prox_logprobs"] = prox_logprobs[rows, :length]
            loss, metrics = self.loss_fn(
                logprobs, batch.old_logprobs[rows, :length], batch.advantages[rows], mask,
                clip_low=self.algo.clip_low, clip_high=self.algo.clip_high,
                aggregation=self.algo.aggregation, max_tokens=self.max_tokens, denominator=denominator, **options,
            )
            # Token means of this micro-batch, weighted so their sum is the whole batch's mean.
            weight = float(mask.sum()) / total_tokens
            metrics = {key: value * weight for key, value in metrics.items()}
            metrics["policy_loss"] = float(loss.detach())
            metrics["entropy"] = _masked_mean(entropy, mask) * weight  # type: ignore[arg-type]
            if ref_logprobs is not None:
                kl = kl_penalty(logprobs, ref_logprobs[rows, :length], self.algo.kl_estimator)  # (b, t)
                metrics["kl"] = _masked_mean(kl, mask) * weight
                if self.algo.kl_coef > 0:
                    kl_loss = aggregate(kl, mask, self.algo.aggregation, self.max_tokens, denominator)
                    loss = loss + self.algo.kl_coef * kl_loss
            if self.algo.entropy_coef > 0:
                bonus = aggregate(
                    entropy, mask, self.algo.aggregation, self.max_tokens, denominator  # type: ignore[arg-type]
                )
                loss = loss - self.algo.entropy_coef * bonus
            return loss, metrics

        epochs = [self._apply(num_rows, micro_loss) for _ in range(self.algo.epochs)]
        result = {key: sum(e.get(key, 0.0) for e in epochs) / len(epochs) for key in epochs[0]}
        result["skipped"] = sum(e["skipped"] for e in epochs)
        result["tokens"] = total_tokens
        return result

    # ---------------------------------------------------------------- supervised

    def sft_step(self, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor) -> dict[str, float]:
        """One supervised update: mean cross-entropy over the tokens where loss_mask is 1.

        Shapes: (B, T) each, right-padded; loss_mask[:, t] = 1 trains the prediction of token t
        from the tokens before it. The temperature is 1 whatever the trainer's sampling one.
        """
        input_ids = input_ids.to(self.device)  # (B, T)
        attention_mask = attention_mask.to(self.device)  # (B, T)
        loss_mask = _wide(loss_mask.to(self.device)) * attention_mask  # (B, T)
        total_tokens = float(loss_mask.sum())
        if total_tokens == 0:
            lr = float(self.optimizer.param_groups[0]["lr"])
            return {"loss": 0.0, "grad_norm": 0.0, "lr": lr, "skipped": 1.0, "tokens": 0.0}

        def micro_loss(rows: slice) -> tuple[Tensor, dict[str, float]]:
            ids, attn, length = _trim(input_ids[rows], attention_mask[rows])
            logprobs, _ = self._logprobs(self.model, ids, attn)  # (b, t)
            return -(logprobs * loss_mask[rows, :length]).sum() / total_tokens, {}

        result = self._apply(input_ids.shape[0], micro_loss)
        result["tokens"] = total_tokens
        return result

    # ---------------------------------------------------------------- checkpoints

    def save(self, folder: str | Path, step: int, extra: dict[str, Any] | None = None, tokenizer: Any = None) -> Path:
        """Save model, optimizer, schedule and RNG states atomically (see `save_training_state`)."""
        return save_training_state(
            folder, self.model, self.optimizer, self.scheduler, step, dict(extra or {}), save_tokenizer=tokenizer
        )

    def load(self, folder: str | Path) -> tuple[int, dict[str, Any]]:
        """Restore a checkpoint saved by `save`; returns (step, extra)."""
        step, extra = load_training_state(folder, self.model, self.optimizer, self.scheduler)
        self.updates = int(self.scheduler.last_epoch)
        return step, extra
