"""The planner's prediction against a measured peak: a few RL updates of a config's model in a
fresh process (`python -m tidal.trainer.plan_measure SPEC`), and what they reached.

The child imports torch and the trainer, notes its resident set, then loads the model (real
weights), builds the trainer of the config (micro-batch, precision, checkpointing, chunked head,
reference model or LoRA adapter; `trainer.parallel` ranks, meant for world size 1) and runs
`steps` updates on a batch of the shape the planner assumes: every row its longest prompt +
max_new_tokens, `group_size` rows sharing each prompt. It reports, on a CPU,
the peak resident set (VmHWM) above the one before the model; on CUDA, torch's
max_memory_allocated. That is what the planner's update phase predicts less its runtime parts:
`predicted_growth`. bench/plan_memory.py and tests/unit/trainer/test_plan.py compare the two.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tidal.errors import TidalError


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What the child process reached above its resident set before the model."""

    before: int  # bytes: VmRSS after the imports (CPU), or 0 (CUDA)
    peak: int  # bytes: VmHWM (CPU), or max_memory_allocated (CUDA)
    micro_batch_size: int
    seconds: float  # wall time of the updates

    @property
    def growth(self) -> int:
        return self.peak - self.before


def predicted_growth(plan: Any) -> int:
    """The plan's update phase on rank 0 less its runtime parts and the loop engine's pool and view:
    the measured child's share (it builds no engine). Only for a one-process, synchronous run
    without merge or value model (those parts the child lacks)."""
    absent = ("runtime (torch + process)", "CUDA context", "KV pool (loop engine)", "decode view (loop engine)")
    return plan.phase_bytes("update") - sum(part.rank0 for part in plan.parts if part.name in absent)


def _status(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+)", text).group(1)) * 1024  # type: ignore[union-attr]


def _batch(spec: dict[str, Any], vocab: int) -> Any:
    import torch

    from tidal.types import TrainBatch

    prompts, group, prompt, completion = spec["prompts"], spec["group_size"], spec["prompt_tokens"], spec["completion_tokens"]
    generator = torch.Generator().manual_seed(0)
    rows, length = prompts * group, prompt + completion
    input_ids = torch.randint(1, vocab, (rows, length), generator=generator)
    input_ids[:, :prompt] = torch.randint(1, vocab, (prompts, prompt), generator=generator).repeat_interleave(group, 0)
    completion_mask = torch.zeros(rows, length)
    completion_mask[:, prompt:] = 1.0
    old = -2.0 * completion_mask
    advantages = torch.randn(rows, generator=generator)
    return TrainBatch(input_ids, torch.ones(rows, length, dtype=torch.long), completion_mask, old, advantages,
                      prompt_lengths=torch.full((rows,), prompt, dtype=torch.long))


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """The measured process's work (module docstring); returns the numbers as JSON values."""
    import copy
    import time

    import torch

    from tidal.config.schema import TidalConfig
    from tidal.models.io import load_model, resolve_device
    from tidal.trainer.lora import apply_lora
    from tidal.trainer.parallel.trainer import ParallelTrainer
    from tidal.trainer.trainer import Trainer

    cfg = TidalConfig.model_validate(spec["config"])
    device = resolve_device(cfg.model.device)
    cuda = device.type == "cuda"
    before = 0 if cuda else _status("VmRSS")
    loaded = load_model(cfg.model, device)
    model = loaded.model
    if cfg.trainer.lora.enabled:  # the KL reference is then the base, the adapter off: no copy
        apply_lora(model, cfg.trainer.lora, seed=0)
    reference = copy.deepcopy(model).eval() if cfg.algorithm.kl_coef > 0 and not cfg.trainer.lora.enabled else None
    common: dict[str, Any] = {"total_steps": spec["steps"] + 1, "temperature": max(cfg.rollout.temperature, 1e-3),
                              "ref_model": reference, "max_tokens": cfg.rollout.max_new_tokens}
    trainer: Any = (Trainer(model, cfg.trainer, cfg.algorithm, device, **common)
                    if cfg.trainer.parallel.strategy == "none"
                    else ParallelTrainer(model, cfg.trainer, cfg.algorithm, device, model_cfg=cfg.model, **common))
    try:
        batch = _batch(spec, model.config.vocab_size)
        began = time.perf_counter()
        for _ in range(spec["steps"]):
            trainer.rl_step(batch)
        seconds = time.perf_counter() - began
        peak = int(torch.cuda.max_memory_allocated(device)) if cuda else _status("VmHWM")
        return {"before": before, "peak": peak, "micro_batch_size": trainer.micro_batch_size, "seconds": seconds}
    finally:
        if isinstance(trainer, ParallelTrainer):
            trainer.close()


def measure(cfg: Any, prompt_tokens: int, steps: int = 2, timeout_s: float = 1800.0) -> Measurement:
    """Run `child` for `cfg` (a TidalConfig) in a fresh process, rows of `prompt_tokens` prompt
    tokens + rollout.max_new_tokens, and return what it measured."""
    spec = {"config": cfg.model_dump(mode="json"), "steps": steps, "prompts": cfg.tasks.tasks_per_step,
            "group_size": cfg.rollout.group_size, "prompt_tokens": prompt_tokens,
            "completion_tokens": cfg.rollout.max_new_tokens}
    done = subprocess.run([sys.executable, "-m", "tidal.trainer.plan_measure"], check=False, input=json.dumps(spec),
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise TidalError(f"the measured trainer process failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return Measurement(**json.loads(done.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    print(json.dumps(child(json.loads(sys.stdin.read()))))
