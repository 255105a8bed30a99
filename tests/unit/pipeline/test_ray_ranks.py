"""Trainer ranks on a Ray cluster (the session's real one): with `pipeline.backend: ray`, ranks
1..N-1 are Ray actors in a placement group, the run trains as on processes, and a cluster that
cannot hold the group fails the start saying what it lacks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tidal.config.scale import ParallelConfig
from tidal.pipeline import quickstart as qs
from tidal.storage.run import RunFolder
from tidal.trainer.parallel.launch import RankError
from tidal.trainer.parallel.ray_ranks import start_ray_ranks

KEEP_ALL = ["gate.drop_zero_variance=false", "gate.drop_truncated=false", "gate.drop_empty=false",
            "gate.max_repetition=1.0", "algorithm.entropy_coef=0.05"]


def test_a_ray_run_trains_on_ranks_placed_as_ray_actors(ray_cluster: str, tmp_path: Path) -> None:
    overrides = ["trainer.steps=2", "pipeline.mode=async", "pipeline.backend=ray", f"pipeline.ray_address={ray_cluster}",
                 "pipeline.rollout_workers=1", "trainer.parallel.strategy=ddp", "trainer.parallel.world_size=2",
                 *KEEP_ALL]
    qs.run_quickstart(qs.find_config("smoke"), overrides, tmp_path, "ray-ranks")
    rows = [m for m in RunFolder.open(tmp_path / "ray-ranks").read_metrics() if m.get("phase") == "rl"]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["trained_samples"] > 0 and r["ranks_s"] > 0 and r["grad_norm"] > 0 for r in rows)
    import ray

    if ray.is_initialized():  # the placement group went with the run
        assert all(pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())


def test_a_cluster_that_cannot_hold_the_ranks_fails_the_start(ray_cluster: str) -> None:
    cfg = ParallelConfig(strategy="ddp", world_size=2, timeout_s=5)
    with pytest.raises(RankError, match=r"cannot place 1 trainer rank\(s\) of \{'CPU': 64.0\}"):
        start_ray_ranks(cfg, {}, torch.device("cpu"), 64, 0, ray_cluster)
