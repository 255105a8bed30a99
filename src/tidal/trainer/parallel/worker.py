"""A trainer rank other than 0: `python -m tidal.trainer.parallel.worker SPEC`, started by rank 0
(trainer/parallel/launch.py) with its rank in the environment. It builds the model the way rank 0
did, takes rank 0's weights, builds its Trainer and serves rank 0's commands until told to close;
it dies with rank 0 (PR_SET_PDEATHSIG), and rank 0 notices it dying (a closed connection)."""

from __future__ import annotations

import copy
import logging
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tidal.config.schema import AlgorithmConfig, ModelConfig, TrainerConfig
from tidal.models.io import load_model
from tidal.trainer.lora import apply_lora
from tidal.trainer.parallel.commands import serve
from tidal.trainer.parallel.join import die_with_parent, join_as_worker
from tidal.trainer.parallel.rank import RankContext, broadcast_weights, rank_device
from tidal.trainer.trainer import Trainer


def main(spec_path: str) -> int:
    die_with_parent()
    spec = pickle.loads(Path(spec_path).read_bytes())
    rank = int(os.environ["TIDAL_RANK"])
    serve_rank(spec, rank, int(os.environ["TIDAL_WORLD_SIZE"]), "127.0.0.1", int(os.environ["TIDAL_STORE_PORT"]))
    return 0


def serve_rank(spec: dict[str, Any], rank: int, world: int, host: str, port: int) -> None:
    """Rank `rank` of `world`: join the group at host:port, build the model and trainer as rank 0
    did, take rank 0's weights, serve its commands until `close`, leave the group."""
    logging.basicConfig(level=spec.get("log_level", logging.WARNING),
                        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    trainer_cfg = TrainerConfig.model_validate(spec["trainer"])
    torch.set_num_threads(int(spec["threads"]))
    device = rank_device(torch.device(spec["device"]), rank)
    join_as_worker(trainer_cfg.parallel, device, rank, world, host, port)
    context: RankContext | None = None
    try:
        model = load_model(ModelConfig.model_validate(spec["model"]), device, dtype=getattr(torch, spec["dtype"])).model
        if trainer_cfg.lora.enabled:  # the same adapter layout as rank 0's; its values come with the broadcast
            apply_lora(model, trainer_cfg.lora, seed=0)
        broadcast_weights(model)  # rank 0's: after its warm start or the checkpoint it resumed from
        reference = copy.deepcopy(model).eval() if spec["reference"] else None
        context = RankContext(rank, world, trainer_cfg.parallel, device)
        trainer = Trainer(model, trainer_cfg, AlgorithmConfig.model_validate(spec["algorithm"]), device,
                          total_steps=spec["total_steps"], temperature=spec["temperature"], ref_model=reference,
                          max_tokens=spec["max_tokens"], rank=context)
        serve(trainer)
    finally:
        if context is not None:
            context.release()
        dist.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
