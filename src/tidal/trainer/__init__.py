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
from tidal.trainer.trainer import (
    ReplayBatch,
    Trainer,
    WarmupSchedule,
    autocast_dtype_for,
)

__all__ = [
    "Critic",
    "ReplayBatch",
    "Trainer",
    "ValueModel",
    "WarmupSchedule",
    "autocast_dtype_for",
    "collate",
    "latest_checkpoint",
    "list_checkpoints",
    "load_training_state",
    "prune_checkpoints",
    "save_training_state",
    "token_logprobs",
]
