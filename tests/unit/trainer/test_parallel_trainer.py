"""ParallelTrainer: tidal starts the ranks itself (real processes, gloo), trains as one process
does, and its checkpoints resume onto another world size or strategy (2 -> 1, 1 -> 2)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tidal.config.scale import ParallelConfig
from tidal.config.schema import AlgorithmConfig, ModelConfig, TinyModelConfig, TrainerConfig
from tidal.models.io import load_model
from tidal.trainer.logprobs import token_logprobs
from tidal.trainer.parallel.launch import RankError
from tidal.trainer.parallel.trainer import ParallelTrainer
from tidal.trainer.trainer import Trainer
from tidal.types import TrainBatch

MODEL = ModelConfig(path="tiny", tiny=TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                                      intermediate_size=128))
ALGO = AlgorithmConfig(aggregation="token", kl_coef=0.05)


def _model() -> torch.nn.Module:
    return load_model(MODEL, torch.device("cpu"), dtype=torch.float64).model


def _batch(model: torch.nn.Module, seed: int) -> TrainBatch:
    """Groups of 3 rows sharing a prompt (adjacent, as collate makes them), varied completions."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(3):
        prompt = torch.randint(3, 250, (int(torch.randint(2, 6, (), generator=generator)),), generator=generator)
        for _ in range(3):
            completion = torch.randint(3, 250, (int(torch.randint(1, 7, (), generator=generator)),), generator=generator)
            rows.append((prompt.tolist(), completion.tolist()))
    length = max(len(p) + len(c) for p, c in rows)
    input_ids = torch.zeros(len(rows), length, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    completion_mask = torch.zeros(len(rows), length, dtype=torch.float64)
    for b, (p, c) in enumerate(rows):
        input_ids[b, : len(p) + len(c)] = torch.tensor(p + c)
        attention[b, : len(p) + len(c)] = 1
        completion_mask[b, len(p): len(p) + len(c)] = 1.0
    with torch.no_grad():
        current, _ = token_logprobs(model, input_ids, attention)
    old = (current + 0.2 * torch.randn(current.shape, generator=generator, dtype=torch.float64)) * completion_mask
    return TrainBatch(input_ids, attention, completion_mask, old, torch.randn(len(rows), generator=generator,
                      dtype=torch.float64), prompt_lengths=torch.tensor([len(p) for p, _ in rows]))


def _cfg(strategy: str = "none", world: int = 1) -> TrainerConfig:
    return TrainerConfig(lr=1e-3, micro_batch_size=2, precision="fp32", grad_clip=0.5,
                         parallel=ParallelConfig(strategy=strategy, world_size=world))


def _trainer(strategy: str, world: int, model: torch.nn.Module) -> Trainer | ParallelTrainer:
    reference = copy.deepcopy(model).eval()
    if strategy == "none":
        return Trainer(model, _cfg(), ALGO, "cpu", total_steps=10, temperature=0.9, ref_model=reference)
    return ParallelTrainer(model, _cfg(strategy, world), ALGO, "cpu", total_steps=10, model_cfg=MODEL,
                           temperature=0.9, ref_model=reference)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _close(trainer: Trainer | ParallelTrainer) -> None:
    if isinstance(trainer, ParallelTrainer):
        trainer.close()


def _run(strategy: str, world: int, batches: list[TrainBatch], save: Path | None = None,
         resume: Path | None = None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Steps on `batches` (after restoring `resume`); `save` checkpoints after the second step."""
    model = _model()
    trainer = _trainer(strategy, world, model)
    try:
        if resume is not None:
            trainer.load(resume)
        losses = []
        for index, batch in enumerate(batches):
            losses.append(trainer.rl_step(batch)["loss"])
            if save is not None and index == 1:
                trainer.save(save, step=2, extra={"cursor": 2})
        return losses, _weights(trainer.model)
    finally:
        _close(trainer)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("one") / "step-2"
    batches = [_batch(_model(), seed) for seed in range(3)]
    losses, weights = _run("none", 1, batches, save=folder)
    return {"batches": batches, "losses": losses, "weights": weights, "checkpoint": folder}


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=1e-7, atol=1e-9, msg=key)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_ranks_started_by_tidal_train_as_one_process_and_resume_across_world_sizes(
    strategy: str, one_process: dict[str, object], tmp_path: Path
) -> None:
    batches = one_process["batches"]
    assert isinstance(batches, list)
    checkpoint = tmp_path / "step-2"
    losses, weights = _run(strategy, 2, batches, save=checkpoint)
    assert losses == pytest.approx(one_process["losses"], rel=1e-7)
    _same(weights, one_process["weights"])  # rank 0's model: whole under DDP, gathered under FSDP2
    if strategy == "fsdp2":
        assert (checkpoint / "optimizer").is_dir() and not (checkpoint / "optimizer.pt").exists()
    # 2 ranks -> 1 process, and 1 process -> 2 ranks: the third step as if never stopped.
    _, resumed_one = _run("none", 1, batches[2:], resume=checkpoint)
    _same(resumed_one, one_process["weights"])
    one_checkpoint = one_process["checkpoint"]
    assert isinstance(one_checkpoint, Path)
    _, resumed_two = _run(strategy, 2, batches[2:], resume=one_checkpoint)
    _same(resumed_two, one_process["weights"])


def test_a_rank_that_dies_fails_the_next_call_naming_it() -> None:
    model = _model()
    trainer = _trainer("ddp", 2, model)
    try:
        assert trainer.workers is not None
        process = trainer.workers.processes[0]
        process.kill()
        process.wait()
        with pytest.raises(RankError, match=r"trainer rank 1 \(pid \d+\) exited with signal 9"):
            trainer.rl_step(_batch(model, 0))
    finally:
        trainer.close()


def test_world_size_one_is_a_group_of_one(one_process: dict[str, object]) -> None:
    batches = one_process["batches"]
    assert isinstance(batches, list)
    losses, weights = _run("fsdp2", 1, batches)
    assert losses == pytest.approx(one_process["losses"], rel=1e-7)
    _same(weights, one_process["weights"])


def _lora_run(strategy: str, world: int, batches: list[TrainBatch], save: Path | None = None,
              resume: Path | None = None) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    """`_run` with a LoRA adapter: the KL reference is the model with its adapter off, on every
    rank; asserts the base stayed frozen; returns the steps' metrics and the adapter."""
    from tidal.config.scale import LoraConfig
    from tidal.trainer.lora import adapter_state_dict, apply_lora

    lora = LoraConfig(enabled=True, r=4, alpha=8.0)
    model = _model()
    apply_lora(model, lora, seed=0)
    base = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    cfg = _cfg(strategy, world).model_copy(update={"lora": lora})
    trainer: Trainer | ParallelTrainer
    if strategy == "none":
        trainer = Trainer(model, cfg, ALGO, "cpu", total_steps=10, temperature=0.9)
    else:
        trainer = ParallelTrainer(model, cfg, ALGO, "cpu", total_steps=10, model_cfg=MODEL, temperature=0.9)
    try:
        if resume is not None:
            trainer.load(resume)
        metrics = []
        for index, batch in enumerate(batches):
            metrics.append(trainer.rl_step(batch))
            if save is not None and index == 1:
                trainer.save(save, step=2)
    finally:
        _close(trainer)
    assert all(torch.equal(v, base[k]) for k, v in model.state_dict().items() if k in base)  # base frozen
    return metrics, {k: v.clone() for k, v in adapter_state_dict(model).items()}


@pytest.mark.parametrize("ranked", ["ddp", "fsdp2"])
def test_a_lora_adapter_trains_on_ranks_as_in_one_process_and_resumes_across_layouts(
    one_process: dict[str, object], ranked: str, tmp_path: Path
) -> None:
    batches = one_process["batches"]
    assert isinstance(batches, list)
    one_metrics, one_adapter = _lora_run("none", 1, batches, save=tmp_path / "one")
    ranked_metrics, ranked_adapter = _lora_run(ranked, 2, batches, save=tmp_path / "ranked")
    assert one_metrics[-1]["kl"] > 0
    for want, have in zip(one_metrics, ranked_metrics):
        for key in ("loss", "grad_norm", "kl"):
            assert have[key] == pytest.approx(want[key], rel=1e-7, abs=1e-12), key
    _same(ranked_adapter, one_adapter)  # under FSDP2: gathered from the shards into rank 0's model
    # The checkpoints hold the adapter alone; 2 ranks -> 1 process and 1 -> 2 resume the third step.
    assert (tmp_path / "ranked" / "model" / "adapter_model.safetensors").is_file()
    _same(_lora_run("none", 1, batches[2:], resume=tmp_path / "ranked")[1], one_adapter)
    _same(_lora_run(ranked, 2, batches[2:], resume=tmp_path / "one")[1], one_adapter)
