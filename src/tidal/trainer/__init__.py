"""trainer layer: the update step, per-token logprobs, and checkpoints that resume exactly."""

from tidal.trainer.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_training_state,
    prune_checkpoints,
    save_training_state,
)
from tidal.trainer.critic import Critic, ValueModel
from tidal.trainer.logprobs import collate, token_logprobs
from tidal.trainer.precision import (
    PrecisionChoice,
    autocast_dtype_for,
    choose_precision,
)
from tidal.trainer.trainer import ReplayBatch, Trainer, WarmupSchedule

__all__ = [
    "Critic",
    "PrecisionChoice",
    "ReplayBatch",
    "Trainer",
    "ValueModel",
    "WarmupSchedule",
    "autocast_dtype_for",
    "choose_precision",
    "collate",
    "latest_checkpoint",
    "list_checkpoints",
    "load_training_state",
    "prune_checkpoints",
    "save_training_state",
    "token_logprobs",
]
