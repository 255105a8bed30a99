"""What a worker rank needs to join rank 0's group (launch.py starts the workers)."""

from __future__ import annotations

import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist

from tidal.config.scale import ParallelConfig

JOIN_KEY = "tidal/joined/{rank}"


class RankError(RuntimeError):
    """A trainer rank failed: it exited, or could not join the group."""


def join_as_worker(cfg: ParallelConfig, device: torch.device, rank: int, world: int, host: str, port: int) -> None:
    """In a worker: join the group rank 0 opened (its store at host:port)."""
    store = dist.TCPStore(host, port, world, is_master=False, timeout=datetime.timedelta(seconds=cfg.timeout_s))
    store.set(JOIN_KEY.format(rank=rank), "1")
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg.timeout_s))


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it dies (prctl PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except OSError:
        return
    if os.getppid() == 1:  # the parent died before the prctl
        os._exit(1)
