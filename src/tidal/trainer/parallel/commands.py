"""What every trainer rank runs for one command from rank 0: the same Trainer method on its share,
so the ranks' collectives match. Rank 0 broadcasts (name, arguments), then runs `run_command`
itself; ranks 1..N-1 receive it in `serve` and run the same.

Commands: `rl_step` and `sft_step` (and, under FSDP2, gathering the updated weights into rank 0's
full copy of the model, which rollout, evaluation and export read), `save` (FSDP2: every rank
writes its optimizer shards), `load` (every rank loads the checkpoint into its own layout), `gather` (FSDP2: the full weights
into rank 0's model again), `close`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tidal.trainer.checkpoint import read_weights
from tidal.trainer.lora import is_adapter_folder, read_adapter
from tidal.trainer.parallel.state import (
    full_weights,
    load_weights,
    save_sharded_optimizer,
)
from tidal.trainer.trainer import Trainer

CLOSE = "close"


def run_command(trainer: Trainer, name: str, args: dict[str, Any], full_model: torch.nn.Module | None = None) -> Any:
    """Rank `trainer.rank.rank`'s part of command `name`; on rank 0 `full_model` is the model
    rollout reads, refreshed from the shards after an update or a load (FSDP2)."""
    assert trainer.rank is not None
    sharded = trainer.rank.sharded
    if name == "rl_step":
        result: Any = trainer.rl_step(args["batch"], replay=args.get("replay"))
    elif name == "sft_step":
        result = trainer.sft_step(args["input_ids"], args["attention_mask"], args["loss_mask"])
    elif name == "save_optimizer":
        save_sharded_optimizer(trainer.model, trainer.optimizer, Path(args["folder"]))
        return None
    elif name == "gather":
        result = None
    elif name == "load":
        result = trainer.load(args["folder"], read_weights_into=_weights_reader(trainer) if sharded else None)
    else:
        raise ValueError(f"unknown trainer command {name!r}")
    if sharded:
        gather_into(trainer.model, full_model)
    return result


def _weights_reader(trainer: Trainer) -> Any:
    """Loads a checkpoint's full weights, or its LoRA adapter alone, into this rank's shards."""
    def read(model_dir: Path) -> None:
        if is_adapter_folder(model_dir):
            load_weights(trainer.model, read_adapter(trainer.model, model_dir), partial=True)
        else:
            load_weights(trainer.model, read_weights(model_dir))

    return read


def gather_into(sharded: torch.nn.Module, full_model: torch.nn.Module | None) -> None:
    """Gather the sharded weights (every rank) and copy them into `full_model` (rank 0's)."""
    weights = full_weights(sharded)
    if full_model is None:
        return
    own = full_model.state_dict()
    with torch.no_grad():
        for name, value in weights.items():
            own[name].copy_(value)


def serve(trainer: Trainer) -> None:
    """A worker rank: run rank 0's commands until `close`."""
    assert trainer.rank is not None
    while True:
        name, args = trainer.rank.broadcast_object()
        if name == CLOSE:
            return
        run_command(trainer, name, args)
