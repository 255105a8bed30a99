"""Trainer ranks 1..N-1 as Ray actors, for a run on a Ray cluster (`pipeline.backend: ray`).

Rank 0 stays the process that runs the loop. The other ranks are actors in one placement group
whose bundles reserve each rank's CPUs (and one GPU per rank on CUDA, counted as a Ray resource),
so Ray places the rollout and scorer actors apart from them; a cluster that cannot hold the group
fails the start with what it lacks. Each actor joins rank 0's store at the driver's node address
and serves its commands (worker.serve_rank) until told to close; an actor that dies fails rank 0's
next command with a RankError naming it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from tidal.config.scale import ParallelConfig
from tidal.trainer.parallel.join import RankError

logger = logging.getLogger(__name__)

NAMESPACE = "tidal"


class RankActor:
    """One trainer rank in a Ray worker process."""

    def serve(self, spec: dict[str, Any], rank: int, world: int, host: str, port: int) -> int:
        from tidal.trainer.parallel.worker import serve_rank

        serve_rank(spec, rank, world, host, port)
        return rank


class RayRanks:
    """The actors of ranks 1..N-1 and their placement group."""

    def __init__(self, ray: Any, group: Any, actors: list[Any], calls: list[Any], owns_ray: bool) -> None:
        self.ray, self.group, self.actors, self.calls, self.owns_ray = ray, group, actors, calls, owns_ray

    def __repr__(self) -> str:
        return f"Ray actors {[actor._actor_id.hex()[:8] for actor in self.actors]}"

    def check(self) -> None:
        """Raise RankError if a rank's actor has stopped (died, or ended early)."""
        done, _ = self.ray.wait(self.calls, num_returns=len(self.calls), timeout=0)
        for call in done:
            rank = self.calls.index(call) + 1
            try:
                self.ray.get(call)
            except Exception as error:  # noqa: BLE001 - a dead actor, or the error its rank raised
                raise RankError(f"trainer rank {rank} (Ray actor) failed: {type(error).__name__}: {error}") from None
            raise RankError(f"trainer rank {rank} (Ray actor) ended before rank 0 closed it")

    def close(self, grace_s: float = 30.0) -> None:
        self.ray.wait(self.calls, num_returns=len(self.calls), timeout=grace_s)
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.ray.util.remove_placement_group(self.group)
        if self.owns_ray:
            self.ray.shutdown()


def start_ray_ranks(cfg: ParallelConfig, spec: dict[str, Any], device: torch.device, threads: int, port: int,
                    address: str | None) -> RayRanks:
    """Place ranks 1..N-1 and start them serving; they join rank 0's store at this node's address."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    try:
        import ray
    except ImportError as error:
        raise RankError("trainer ranks on Ray need Ray: pip install 'tidal[ray]'") from error
    owns = not ray.is_initialized()
    if owns:
        if address is None:
            ray.init(address="local", namespace=NAMESPACE, include_dashboard=False)
        else:
            ray.init(address=address, namespace=NAMESPACE)
    bundle: dict[str, float] = {"CPU": float(threads)}
    if device.type == "cuda":
        bundle["GPU"] = 1.0
    group = ray.util.placement_group([dict(bundle) for _ in range(cfg.world_size - 1)], strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=min(cfg.timeout_s, 120.0))
    if not ready:
        ray.util.remove_placement_group(group)
        available = ray.available_resources()
        if owns:
            ray.shutdown()
        raise RankError(f"the Ray cluster cannot place {cfg.world_size - 1} trainer rank(s) of {bundle} each "
                        f"(available: {available})")
    host = ray.util.get_node_ip_address()
    remote = ray.remote(num_cpus=threads, num_gpus=bundle.get("GPU", 0.0), max_restarts=0)(RankActor)
    actors, calls = [], []
    for rank in range(1, cfg.world_size):
        strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=rank - 1)
        actor = remote.options(scheduling_strategy=strategy, runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}}
                               ).remote()
        actors.append(actor)
        calls.append(actor.serve.remote(spec, rank, cfg.world_size, host, port))
    logger.info("trainer ranks 1..%d: Ray actors in a placement group of %s each", cfg.world_size - 1, bundle)
    return RayRanks(ray, group, actors, calls, owns)
