"""Starting the trainer ranks on this machine: rank 0 is the process that runs the loop; ranks
1..N-1 are `python -m tidal.trainer.parallel.worker` processes it starts, and that die with it.

Rank 0 opens the rendezvous store (a TCPStore on 127.0.0.1, a free port unless one is set), starts
the workers with the spec of their trainer, and waits for each to join while watching it: a worker
that exits before joining fails the start at once with its exit status, not after a timeout.
"""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tidal.config.scale import ParallelConfig, check_world_size
from tidal.errors import ConfigError
from tidal.trainer.parallel.join import JOIN_KEY, RankError

__all__ = ["RankError", "Workers", "check_config", "start_ranks"]

logger = logging.getLogger(__name__)



def check_config(cfg: Any) -> None:
    """`check_world_size` for a whole TidalConfig, as a ConfigError (for callers past load)."""
    try:
        check_world_size(cfg.trainer.parallel, cfg.model.device)
    except ValueError as error:
        raise ConfigError([str(error)], source="trainer.parallel") from None


class Workers:
    """Ranks 1..N-1 as child processes; `close` stops them (after rank 0 said goodbye, or not)."""

    def __init__(self, processes: list[subprocess.Popen], spec_dir: tempfile.TemporaryDirectory) -> None:
        self.processes = processes
        self._spec_dir = spec_dir

    def check(self) -> None:
        """Raise RankError if a worker has exited."""
        for rank, process in enumerate(self.processes, start=1):
            code = process.poll()
            if code is not None:
                how = f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"status {code}"
                raise RankError(f"trainer rank {rank} (pid {process.pid}) exited with {how}")

    def __repr__(self) -> str:
        return f"processes {[p.pid for p in self.processes]}"

    def close(self, grace_s: float = 30.0) -> None:
        deadline = time.monotonic() + grace_s
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._spec_dir.cleanup()


def start_ranks(cfg: ParallelConfig, spec: dict[str, Any], device: torch.device, threads: int,
                ray_address: str | None = None, on_ray: bool = False) -> Any:
    """Open the store, start ranks 1..N-1 with `spec` (their trainer's config and state), join
    rank 0 to the group and return the workers (`check`, `close`). `threads`: torch threads of
    each worker. `on_ray`: the ranks are Ray actors in a placement group (ray_ranks.py) on the
    cluster at `ray_address` (None: a Ray of this process), else processes on this machine."""
    world = cfg.world_size
    store = dist.TCPStore("0.0.0.0" if on_ray else "127.0.0.1", cfg.port, world, is_master=True,
                          wait_for_workers=False, timeout=datetime.timedelta(seconds=cfg.timeout_s))
    workers: Any
    if on_ray:
        from tidal.trainer.parallel.ray_ranks import start_ray_ranks

        workers = start_ray_ranks(cfg, spec, device, threads, store.port, ray_address)
    else:
        workers = _start_processes(spec, world, store.port, threads)
    try:
        _wait_for_joins(store, workers, world, cfg.timeout_s)
        backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        dist.init_process_group(backend, store=store, rank=0, world_size=world,
                                timeout=datetime.timedelta(seconds=cfg.timeout_s))
    except BaseException:
        workers.close(grace_s=0)
        raise
    logger.info("trainer: %d ranks (%s, %s), workers %s", world, cfg.strategy, backend, workers)
    return workers


def _start_processes(spec: dict[str, Any], world: int, port: int, threads: int) -> Workers:
    spec_dir = tempfile.TemporaryDirectory(prefix="tidal-ranks-")
    spec_path = Path(spec_dir.name) / "spec.pkl"
    spec_path.write_bytes(pickle.dumps(spec))
    processes = []
    for rank in range(1, world):
        env = {**os.environ, "TIDAL_RANK": str(rank), "TIDAL_WORLD_SIZE": str(world),
               "TIDAL_STORE_PORT": str(port), "OMP_NUM_THREADS": str(threads)}
        command = [sys.executable, "-m", "tidal.trainer.parallel.worker", str(spec_path)]
        processes.append(subprocess.Popen(command, env=env))
    return Workers(processes, spec_dir)


def _wait_for_joins(store: dist.TCPStore, workers: Any, world: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = set(range(1, world))
    while waiting:
        workers.check()
        waiting = {rank for rank in waiting if not store.check([JOIN_KEY.format(rank=rank)])}
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise RankError(f"trainer ranks {sorted(waiting)} did not join within {timeout_s:.0f} s")
        time.sleep(0.05)
