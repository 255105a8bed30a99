"""The dtype the trainer's forward and backward run in (`trainer.precision`).

Weights, gradients, optimizer state and the log-softmax stay fp32 in every case; `bf16` runs the
model under `torch.autocast` (its matmuls in bf16). `auto` picks bf16 on a CUDA device that
supports it, and on a CPU only where it pays:
- torch must report bf16 matmul instructions (AMX tiles or AVX512-BF16) and oneDNN: elsewhere a
  CPU emulates bf16 and autocast only adds casts (AMD EPYC machines gained far less);
- the model must have at least `MIN_AUTO_PARAMETERS` parameters. Not for speed (the built-in tiny
  model's update is faster in bf16 too on an AMX CPU, bench/RESULTS.md) but for reproducibility:
  such an update takes well under a second either way, and the tests' and the tiny quickstart's
  runs then give the same numbers on every CPU instead of depending on its instructions;
- a timed probe of one matmul of the model's own shape (`PROBE_TOKENS` tokens through its widest
  linear layer, the activation's cast included) must run `MIN_SPEEDUP` times faster in bf16 than in
  fp32. The probe takes a fraction of a second and is cached per shape and thread count.
The choice and its reason are a `PrecisionChoice`, which the trainer logs and records.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import torch

MIN_AUTO_PARAMETERS = 20_000_000
PROBE_TOKENS = 512
MIN_SPEEDUP = 1.5


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """The autocast dtype (None: plain fp32), why, and the probe's matmul rates when it ran."""

    dtype: torch.dtype | None
    reason: str
    fp32_gflops: float | None = None
    bf16_gflops: float | None = None

    def record(self) -> dict[str, Any]:
        """A JSON-friendly summary, for logs and the run's records."""
        record: dict[str, Any] = {"autocast": "bf16" if self.dtype == torch.bfloat16 else "fp32", "reason": self.reason}
        if self.fp32_gflops is not None:
            record.update(probe_fp32_gflops=round(self.fp32_gflops, 1), probe_bf16_gflops=round(self.bf16_gflops or 0, 1))
        return record


def cpu_has_bf16_matmul() -> bool:
    """Whether torch reports native bf16 matmul instructions on this CPU (AMX or AVX512-BF16)."""
    if not torch.backends.mkldnn.is_available():
        return False
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def widest_linear(model: torch.nn.Module) -> tuple[int, int] | None:
    """(in_features, out_features) of the model's largest linear layer other than its LM head."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    shapes = [(m.in_features, m.out_features) for m in model.modules()
              if isinstance(m, torch.nn.Linear) and m is not head]
    return max(shapes, key=lambda s: s[0] * s[1]) if shapes else None


def _best_seconds(run: Any, repeats: int) -> float:
    run()  # warm up: kernels are selected and packed on the first call
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - began)
    return best


@functools.lru_cache(maxsize=16)
def matmul_rates(tokens: int, width: int, out: int, threads: int, repeats: int = 5) -> tuple[float, float]:
    """GFLOP/s of a (tokens, width) @ (width, out) matmul on the CPU in fp32 and in bf16 (the
    activation cast from fp32 each time, as autocast does; the weight cast once, as autocast's
    cache does). `threads` is part of the cache key: the rates depend on it."""
    del threads
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, width, generator=generator)
    w = torch.randn(width, out, generator=generator)
    w16 = w.to(torch.bfloat16)
    with torch.no_grad():
        fp32 = _best_seconds(lambda: x @ w, repeats)
        bf16 = _best_seconds(lambda: x.to(torch.bfloat16) @ w16, repeats)
    flops = 2.0 * tokens * width * out
    return flops / fp32 / 1e9, flops / bf16 / 1e9


def choose_precision(precision: str, device: torch.device, model: torch.nn.Module | None = None) -> PrecisionChoice:
    """The autocast dtype for `trainer.precision` on `device` (module docstring); `model` sizes
    the CPU probe (without one, auto on a CPU is fp32)."""
    if model is None:
        return choose_precision_for(precision, device, None, None)
    return choose_precision_for(precision, device, sum(p.numel() for p in model.parameters()), widest_linear(model))


def choose_precision_for(
    precision: str, device: torch.device, parameters: int | None, shape: tuple[int, int] | None
) -> PrecisionChoice:
    """`choose_precision` for a model of `parameters` parameters whose widest linear layer (not
    the LM head) is `shape` (in, out); None for both: no model to probe. The memory planner
    (trainer/plan.py) decides from a model's config this way, without its weights."""
    if precision == "bf16":
        return PrecisionChoice(torch.bfloat16, "precision: bf16")
    if precision == "fp32":
        return PrecisionChoice(None, "precision: fp32")
    if precision != "auto":
        raise ValueError(f"unknown precision {precision!r}; known: auto, bf16, fp32")
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice(torch.bfloat16, "auto: CUDA device with bf16")
        return PrecisionChoice(None, "auto: CUDA device without bf16")
    if device.type != "cpu" or parameters is None:
        return PrecisionChoice(None, f"auto: fp32 on {device.type}" + ("" if parameters is not None else " (no model to probe)"))
    if not cpu_has_bf16_matmul():
        return PrecisionChoice(None, "auto: this CPU has no native bf16 matmul (AMX, AVX512-BF16)")
    if parameters < MIN_AUTO_PARAMETERS or shape is None:
        return PrecisionChoice(None, f"auto: {parameters / 1e6:.2f}M parameters, below the "
                               f"{MIN_AUTO_PARAMETERS / 1e6:.0f}M from which a CPU may pick bf16")
    fp32, bf16 = matmul_rates(PROBE_TOKENS, shape[0], shape[1], torch.get_num_threads())
    speedup = bf16 / fp32
    verdict = "bf16" if speedup >= MIN_SPEEDUP else "fp32"
    reason = (f"auto: a {PROBE_TOKENS}x{shape[0]}x{shape[1]} matmul ran {speedup:.2f}x as fast in bf16 "
              f"({bf16:.0f} vs {fp32:.0f} GFLOP/s, {torch.get_num_threads()} threads; bf16 from {MIN_SPEEDUP}x): {verdict}")
    return PrecisionChoice(torch.bfloat16 if verdict == "bf16" else None, reason, fp32, bf16)


def autocast_dtype_for(precision: str, device: torch.device, model: torch.nn.Module | None = None) -> torch.dtype | None:
    """The autocast dtype of `choose_precision`: bf16, or None for fp32."""
    return choose_precision(precision, device, model).dtype
