"""DDP and FSDP2 ranks (gloo, 2 real processes) give the update of one process: the same losses,
metrics and weights over several steps, for every loss aggregation, with KL and entropy terms,
micro-batches that split unevenly over the ranks, and the shared-prefix path."""

from __future__ import annotations

import copy
import datetime
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tidal.config.scale import ParallelConfig
from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.trainer.parallel.rank import RankContext, split_rows
from tidal.trainer.trainer import Trainer
from tidal.types import TrainBatch

from .test_prefix import grouped_batch
from .tiny import build_model, random_batch

STEPS = 3


def _batches(model: torch.nn.Module, grouped: bool) -> list[TrainBatch]:
    if grouped:
        return [grouped_batch(model, groups=(3, 4, 2), seed=seed) for seed in range(STEPS)]
    return [random_batch(model, batch=7, seed=seed) for seed in range(STEPS)]


def _train(model: torch.nn.Module, algo: AlgorithmConfig, batches: list[TrainBatch], rank: RankContext | None,
           micro: int, checkpointing: bool = False) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    ref = copy.deepcopy(model) if algo.kl_coef > 0 else None
    cfg = TrainerConfig(lr=1e-3, micro_batch_size=micro, precision="fp32", grad_clip=0.5,
                        gradient_checkpointing=checkpointing)
    trainer = Trainer(model, cfg, algo, "cpu", total_steps=10, temperature=0.9, ref_model=ref, max_tokens=8, rank=rank)
    metrics = [trainer.rl_step(batch) for batch in batches]
    if rank is not None and rank.sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        state = trainer.model.state_dict()
    return metrics, {k: v.detach().clone() for k, v in state.items()}


def _rank_main(rank: int, world: int, store: str, strategy: str, algo: AlgorithmConfig, grouped: bool, micro: int,
               out: str, checkpointing: bool) -> None:
    torch.set_num_threads(1)
    # A file rendezvous: no port another test could take between choosing it and binding it.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        model = build_model(seed=3, dtype=torch.float64)
        batches = _batches(model, grouped)
        context = RankContext(rank, world, ParallelConfig(strategy=strategy, world_size=world), torch.device("cpu"))
        metrics, state = _train(model, algo, batches, context, micro, checkpointing)
        if rank == 0:
            torch.save({"metrics": metrics, "state": state}, out)
        context.release()  # the DDP reducer must go before its process group
    finally:
        dist.destroy_process_group()


def _ranks(strategy: str, algo: AlgorithmConfig, grouped: bool, micro: int, tmp_path: Path,
           checkpointing: bool = False) -> dict[str, Any]:
    out = str(tmp_path / f"{strategy}.pt")
    store = str(tmp_path / f"{strategy}.store")
    context = mp.start_processes(_rank_main, args=(2, store, strategy, algo, grouped, micro, out, checkpointing),
                                 nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 300
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the ranks did not finish within 300 s")
    return torch.load(out, weights_only=False)


ALGOS = {
    "token": AlgorithmConfig(aggregation="token"),
    "sequence+kl+entropy": AlgorithmConfig(aggregation="sequence", kl_coef=0.1, entropy_coef=0.01),
    "token_sum+2epochs": AlgorithmConfig(aggregation="token_sum", kl_coef=0.05, kl_estimator="k1", epochs=2),
}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
@pytest.mark.parametrize(("name", "grouped", "micro", "checkpointing"), [
    ("token", False, 3, False), ("sequence+kl+entropy", True, 2, False), ("token_sum+2epochs", True, 4, False),
    ("sequence+kl+entropy", True, 3, True),
], ids=["token", "sequence+kl+entropy", "token_sum+2epochs", "gradient-checkpointing"])
def test_ranks_match_one_process(strategy: str, name: str, grouped: bool, micro: int, checkpointing: bool,
                                 tmp_path: Path) -> None:
    algo = ALGOS[name]
    model = build_model(seed=3, dtype=torch.float64)
    expected_metrics, expected_state = _train(model, algo, _batches(model, grouped), None, micro, checkpointing)
    got = _ranks(strategy, algo, grouped, micro, tmp_path, checkpointing)
    for step, (want, have) in enumerate(zip(expected_metrics, got["metrics"])):
        for key in ("loss", "policy_loss", "grad_norm", "entropy", "kl", "tokens", "skipped"):
            if key in want:
                assert have[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), (step, key)
    assert set(got["state"]) == set(expected_state)
    for key, value in expected_state.items():
        torch.testing.assert_close(got["state"][key], value, rtol=1e-7, atol=1e-9, msg=key)
    assert any(not torch.equal(value, model_value) for value, model_value in
               zip(expected_state.values(), build_model(seed=3, dtype=torch.float64).state_dict().values()))


def test_split_rows_balances_tokens_at_group_starts() -> None:
    assert split_rows([10] * 8, 2) == [(0, 4), (4, 8)]
    assert split_rows([5, 50, 5, 5], 2) == [(0, 2), (2, 4)]
    starts = [True, False, False, True, False, True, False, False]
    ranges = split_rows([1] * 8, 2, starts)
    assert ranges in ([(0, 3), (3, 8)], [(0, 5), (5, 8)])
    assert all(start == end or starts[start] for start, end in ranges)
    assert split_rows([4], 3) in ([(0, 1), (1, 1), (1, 1)], [(0, 0), (0, 1), (1, 1)], [(0, 0), (0, 0), (0, 1)])
    assert sum(end - start for start, end in split_rows([3, 1, 2], 2)) == 3


