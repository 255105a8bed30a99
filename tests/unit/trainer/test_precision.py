"""trainer.precision: fp32 and bf16 as asked; auto decided by device, CPU instructions, model size
and a timed matmul probe (trainer/precision.py). The probe's timings are stubbed where a test
needs a verdict: a real timing would make the test depend on the CPU it runs on."""

from __future__ import annotations

import pytest
import torch

from tidal.config.schema import AlgorithmConfig, TrainerConfig
from tidal.trainer import precision
from tidal.trainer.precision import choose_precision, widest_linear
from tidal.trainer.trainer import Trainer

from .tiny import build_model

CPU = torch.device("cpu")


def test_explicit_precisions_and_auto_without_a_model() -> None:
    assert choose_precision("bf16", CPU).dtype is torch.bfloat16
    assert choose_precision("fp32", torch.device("cuda")).dtype is None
    assert choose_precision("auto", CPU).dtype is None  # nothing to size a probe with
    with pytest.raises(ValueError, match="known: auto, bf16, fp32"):
        choose_precision("fp8", CPU)


def test_a_small_model_stays_fp32_on_every_cpu() -> None:
    choice = choose_precision("auto", CPU, build_model())
    assert choice.dtype is None and choice.fp32_gflops is None  # decided without timing anything
    assert choice.record()["autocast"] == "fp32"


@pytest.mark.parametrize("rates, expected", [((100.0, 400.0), torch.bfloat16), ((100.0, 120.0), None)])
def test_auto_follows_the_probe_on_a_cpu_with_bf16(monkeypatch: pytest.MonkeyPatch, rates: tuple[float, float],
                                                   expected: torch.dtype | None) -> None:
    model = build_model()
    probed: list[tuple[int, ...]] = []
    monkeypatch.setattr(precision, "MIN_AUTO_PARAMETERS", 0)
    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: True)
    monkeypatch.setattr(precision, "matmul_rates", lambda *shape: probed.append(shape) or rates)
    choice = choose_precision("auto", CPU, model)
    assert choice.dtype is expected
    assert probed[0][:3] == (precision.PROBE_TOKENS, 64, 128)  # the MLP's up projection, not the LM head
    record = choice.record()
    assert record["probe_fp32_gflops"] == rates[0] and record["probe_bf16_gflops"] == rates[1]
    assert f"{rates[1] / rates[0]:.2f}x" in choice.reason
    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: False)
    assert choose_precision("auto", CPU, model).dtype is None


def test_the_trainer_records_its_choice_and_keeps_weights_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "MIN_AUTO_PARAMETERS", 0)
    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: True)
    monkeypatch.setattr(precision, "matmul_rates", lambda *shape: (100.0, 400.0))
    model = build_model(seed=2)
    trainer = Trainer(model, TrainerConfig(precision="auto"), AlgorithmConfig(), "cpu", total_steps=1)
    assert trainer.autocast_dtype is torch.bfloat16 and trainer.setup["precision"]["autocast"] == "bf16"
    assert next(model.parameters()).dtype == torch.float32


def test_the_real_probe_times_both_dtypes() -> None:
    fp32, bf16 = precision.matmul_rates(64, 32, 48, torch.get_num_threads(), repeats=1)
    assert fp32 > 0 and bf16 > 0
    assert widest_linear(build_model()) == (64, 128)
