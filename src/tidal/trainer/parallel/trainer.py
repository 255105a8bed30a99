"""`ParallelTrainer`: the trainer as N ranks, behind the interface of one `Trainer` (what the loop
calls: rl_step, sft_step, save, load, model, device, updates, setup).

It lives in the process that runs the loop, as rank 0: it starts ranks 1..N-1 (launch.py: processes
on this machine, or Ray actors in a placement group when the run is on Ray, ray_ranks.py), gives
them its weights, and for each call broadcasts the command and runs its own share
(commands.py). Under DDP every rank's model is whole, and rank 0's is the model rollout and
evaluation use. Under FSDP2 the ranks train shards of a copy, and after every update the full
weights are gathered into rank 0's model (`publish_s` in the step's metrics); checkpoints hold
those full weights and each rank's optimizer shards (state.py).
On a CPU the ranks split the cores: rank 0 trains with its share of the threads, then gets all
of them back for rollout.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from tidal.config.schema import AlgorithmConfig, ModelConfig, TrainerConfig
from tidal.trainer.parallel.commands import CLOSE, run_command
from tidal.trainer.parallel.launch import start_ranks
from tidal.trainer.parallel.rank import RankContext, broadcast_weights, rank_device
from tidal.trainer.precision import choose_precision
from tidal.trainer.trainer import ReplayBatch, Trainer
from tidal.types import TrainBatch

logger = logging.getLogger(__name__)


class ParallelTrainer:
    """Rank 0 of `trainer.parallel.world_size` ranks (module docstring). `close` stops the others."""

    def __init__(
        self,
        model: torch.nn.Module,
        trainer_cfg: TrainerConfig,
        algo_cfg: AlgorithmConfig,
        device: torch.device | str,
        total_steps: int,
        model_cfg: ModelConfig,
        temperature: float = 1.0,
        ref_model: torch.nn.Module | None = None,
        max_tokens: int | None = None,
        on_ray: bool = False,
        ray_address: str | None = None,
    ) -> None:
        parallel = trainer_cfg.parallel
        self.device = rank_device(torch.device(device), 0)
        self.model = model
        # The ranks must agree on the precision: rank 0 probes, the others are told.
        precision = choose_precision(trainer_cfg.precision, self.device, model)
        trainer_cfg = trainer_cfg.model_copy(update={"precision": "bf16" if precision.dtype is not None else "fp32"})
        threads = torch.get_num_threads()
        self.rank_threads = max(1, threads // parallel.world_size) if self.device.type == "cpu" else threads
        spec = {
            "model": model_cfg.model_dump(mode="json"), "trainer": trainer_cfg.model_dump(mode="json"),
            "algorithm": algo_cfg.model_dump(mode="json"), "device": self.device.type, "total_steps": total_steps,
            "temperature": temperature, "max_tokens": max_tokens, "reference": ref_model is not None,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "threads": self.rank_threads,
            "log_level": logging.getLogger("tidal").getEffectiveLevel(),
        }
        self.workers: Any = start_ranks(parallel, spec, self.device, self.rank_threads, ray_address, on_ray)
        try:
            broadcast_weights(model)
            train_model = copy.deepcopy(model) if parallel.strategy == "fsdp2" else model
            context = RankContext(0, parallel.world_size, parallel, self.device)
            with self._threads():
                self.local = Trainer(train_model, trainer_cfg, algo_cfg, self.device, total_steps,
                                     temperature=temperature, ref_model=ref_model, max_tokens=max_tokens, rank=context)
            self.local.setup["precision"] = precision.record()
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- the Trainer interface

    @property
    def updates(self) -> int:
        return self.local.updates

    @property
    def setup(self) -> dict[str, Any]:
        return self.local.setup

    @property
    def micro_batch_size(self) -> int:
        return self.local.micro_batch_size

    @property
    def kl(self) -> Any:
        return self.local.kl

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.local.optimizer

    def rl_step(self, batch: TrainBatch, replay: ReplayBatch | None = None) -> dict[str, float]:
        return self._command("rl_step", batch=_on_cpu(batch), replay=replay)

    def sft_step(self, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor) -> dict[str, float]:
        return self._command("sft_step", input_ids=input_ids.cpu(), attention_mask=attention_mask.cpu(),
                             loss_mask=loss_mask.cpu())

    def save(self, folder: str | Path, step: int, extra: dict[str, Any] | None = None, tokenizer: Any = None) -> Path:
        """The full weights (rank 0's model) and the optimizer: whole from rank 0 under DDP,
        each rank's shards under FSDP2."""
        if not self.local.rank or not self.local.rank.sharded:
            return self.local.save(folder, step, extra, tokenizer)

        def write_optimizer(temp: Path) -> None:
            self._command("save_optimizer", folder=str(temp))

        return self.local.save(folder, step, extra, tokenizer, weights=self.model, write_optimizer=write_optimizer)

    def load(self, folder: str | Path) -> tuple[int, dict[str, Any]]:
        return self._command("load", folder=str(folder))

    def gather(self) -> None:
        """FSDP2: gather the shards into rank 0's model (every update ends with this; a no-op otherwise)."""
        if self.local.rank is not None and self.local.rank.sharded:
            self._command("gather")

    # ---------------------------------------------------------------- ranks

    def _command(self, name: str, **args: Any) -> Any:
        assert self.local.rank is not None
        if self.workers is not None:
            self.workers.check()
        began = time.perf_counter()
        with self._threads():
            try:
                self.local.rank.broadcast_object((name, args))
                result = run_command(self.local, name, args, full_model=self.model)
            except RuntimeError as error:  # a rank that died closes its connections
                if self.workers is not None:
                    self.workers.check()
                raise RuntimeError(f"trainer ranks: {name} failed ({error})") from error
        if isinstance(result, dict) and name in ("rl_step", "sft_step"):
            result["ranks_s"] = time.perf_counter() - began
        return result

    @contextlib.contextmanager
    def _threads(self) -> Iterator[None]:
        """Rank 0's share of the cores while the ranks train; what it had before afterwards."""
        had = torch.get_num_threads()
        torch.set_num_threads(min(self.rank_threads, had))
        try:
            yield
        finally:
            torch.set_num_threads(had)

    def close(self) -> None:
        """Tell the other ranks to stop, wait for them, leave the group (idempotent)."""
        workers, self.workers = self.workers, None
        if workers is None:
            return
        try:
            if dist.is_initialized():
                with contextlib.suppress(RuntimeError):
                    workers.check()
                    dist.broadcast_object_list([(CLOSE, {})], src=0)
        finally:
            workers.close()
            if hasattr(self, "local") and self.local.rank is not None:
                self.local.rank.release()
            if dist.is_initialized():
                dist.destroy_process_group()
            logger.info("trainer ranks closed (pid %d)", os.getpid())


def _on_cpu(batch: TrainBatch) -> TrainBatch:
    """The batch's tensors on the CPU, for the broadcast (each rank moves them to its device)."""
    import dataclasses

    return dataclasses.replace(batch, **{
        field.name: value.cpu() for field in dataclasses.fields(batch)
        if isinstance(value := getattr(batch, field.name), Tensor)
    })
