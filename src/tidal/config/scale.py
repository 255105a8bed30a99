"""Config of the trainer past one process: `trainer.parallel` (DDP or FSDP2 ranks launched by tidal)
and `trainer.lora` (a peft adapter trained instead of the full weights)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Strategy = Literal["none", "ddp", "fsdp2"]
Dtype = Literal["fp32", "bf16"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ParallelConfig(_Section):
    """How many trainer ranks, and how they share the model (tidal/trainer/parallel/)."""

    strategy: Strategy = Field(
        "none", description="none: one process; ddp: every rank holds the whole model and gradients are averaged "
        "(torch DistributedDataParallel); fsdp2: parameters, gradients and optimizer state are sharded over the ranks "
        "(torch.distributed.fsdp.fully_shard)",
    )
    world_size: int = Field(
        1, ge=1, le=1024, description="trainer ranks; tidal starts them itself on this machine (rank 0 is the "
        "process that runs the loop), one per GPU on CUDA, gloo processes on CPU",
    )
    param_dtype: Dtype = Field(
        "fp32", description="fsdp2: the dtype parameters are gathered in for forward and backward (the sharded "
        "master weights and optimizer state stay fp32)",
    )
    reduce_dtype: Dtype = Field("fp32", description="fsdp2: the dtype gradients are reduced in")
    reshard_after_forward: bool = Field(
        True, description="fsdp2: free each layer's gathered parameters after its forward (less memory, one more "
        "all-gather in the backward)",
    )
    cpu_offload: bool = Field(
        False, description="fsdp2: keep the sharded parameters, gradients and optimizer state in CPU memory "
        "(on CUDA; the optimizer steps on the CPU)",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend: auto is nccl on CUDA, gloo on CPU",
    )
    port: int = Field(0, ge=0, le=65535, description="rendezvous TCP port on 127.0.0.1 (0: a free one)")
    timeout_s: float = Field(
        600.0, gt=0, description="seconds a collective may wait for the other ranks before the run fails (a rank "
        "that died is noticed sooner: its connection closes)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ParallelConfig:
        if self.strategy == "none" and self.world_size != 1:
            raise ValueError(
                f"world_size={self.world_size} needs a strategy (ddp or fsdp2); strategy 'none' is one process"
            )
        fsdp_only = [name for name, default in (("param_dtype", "fp32"), ("reduce_dtype", "fp32"),
                                                ("cpu_offload", False)) if getattr(self, name) != default]
        if fsdp_only and self.strategy != "fsdp2":
            raise ValueError(f"{', '.join(fsdp_only)} only apply to strategy fsdp2 (strategy is {self.strategy!r})")
        return self


class LoraConfig(_Section):
    """A LoRA adapter through peft (trainer/lora.py, docs/design/trainer.md "LoRA"): only the adapter
    trains; the base weights stay frozen and serve as the KL reference."""

    enabled: bool = Field(
        False, description="RL trains a LoRA adapter instead of the full weights (the warm start, when on, still "
        "trains them all); checkpoints hold the adapter, the exported policy is the merged model. Runs on trainer.parallel "
        "ranks too (ddp, fsdp2: every rank holds the same adapter); not with a value model (gae)",
    )
    r: int = Field(16, ge=1, le=4096, description="adapter rank")
    alpha: float = Field(32.0, gt=0, description="scale numerator: the update is (alpha / r) * B @ A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="module names (suffixes) that get an adapter, e.g. [q_proj, v_proj]; all-linear: "
        "every linear layer but the LM head",
    )
    publish: Literal["merged", "adapter"] = Field(
        "merged", description="what rollout gets after each update: merged weights (base + adapter, the plain "
        "model's layout and its fast forward) or the adapter alone (less to send), applied to the base model the "
        "rollout side already holds; either way verified by the adapted model's canary",
    )

    @model_validator(mode="after")
    def _targets(self) -> LoraConfig:
        if isinstance(self.target_modules, list) and not self.target_modules:
            raise ValueError("target_modules is empty: name some modules, or use 'all-linear'")
        return self


def check_world_size(cfg: ParallelConfig, device: str) -> None:
    """Raise ValueError when `cfg.world_size` ranks cannot run here: more than the visible GPUs on
    CUDA, more than the CPU cores on a CPU (each gloo rank needs a core of its own)."""
    if cfg.strategy == "none":
        return
    import torch  # only for a parallel run

    wants_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if wants_cuda:
        gpus = torch.cuda.device_count()
        if cfg.world_size > gpus:
            raise ValueError(f"trainer.parallel.world_size={cfg.world_size}: this machine has {gpus} CUDA device(s); "
                             "one rank per GPU")
        if cfg.backend == "gloo" and cfg.strategy == "fsdp2":
            raise ValueError("trainer.parallel.backend gloo: FSDP2 on CUDA needs nccl (use auto)")
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cfg.world_size > cores:
        raise ValueError(f"trainer.parallel.world_size={cfg.world_size}: this machine has {cores} CPU core(s) for "
                         "the trainer; on a CPU each rank is a process that needs a core")
    if cfg.backend == "nccl":
        raise ValueError("trainer.parallel.backend nccl needs CUDA; on a CPU the ranks use gloo (auto)")
    if cfg.cpu_offload:
        raise ValueError("trainer.parallel.cpu_offload: the model is on the CPU already")
