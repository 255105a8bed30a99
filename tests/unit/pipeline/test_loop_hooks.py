"""Step hooks of the one loop: a hook that asks for a rollback rewinds the run to a checkpoint
in process (model, optimizer, mixer, watch, domains, the ledger), and the run then ends exactly
where a run without the rollback ends, in both modes, with every id trained once."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from tidal.config import load_config
from tidal.pipeline.loop import Rollback, StepContext
from tidal.pipeline.quickstart import find_config
from tidal.pipeline.run import Job, start_run
from tidal.storage.run import RunFolder
from tidal.storage.store import existing_run_store

STEPS = 4
OVERRIDES = [f"trainer.steps={STEPS}", "trainer.checkpoint_every=1", "trainer.keep_checkpoints=8",
             # every sample trains, so that each step moves the weights
             "gate.drop_zero_variance=false", "gate.drop_truncated=false", "gate.drop_empty=false",
             "gate.max_repetition=1.0", "eval.samples_per_task=1"]


class RollbackOnce:
    """Asks, once, after step `at`, to go back to the checkpoint of step `to`; records the steps it saw."""

    def __init__(self, at: int, to: int) -> None:
        self.at, self.to, self.done = at, to, False
        self.seen: list[int] = []

    def after_step(self, context: StepContext) -> Rollback | None:
        self.seen.append(context.step)
        if context.step == self.at and not self.done:
            self.done = True
            return Rollback("test: pretend the reward collapsed", to_step=self.to)
        return None


def _run(tmp_path: Path, name: str, mode: str, hooks: list) -> RunFolder:
    cfg = load_config(find_config("smoke"), [*OVERRIDES, f"pipeline.mode={mode}"])
    job = Job(cfg, start_run(cfg, tmp_path, name), hooks)
    job.execute()
    return job.run


def _weights(run: RunFolder) -> dict:
    return load_file(str(run.checkpoints_dir / "rl" / f"step-{STEPS:06d}" / "model" / "model.safetensors"))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_rollback_asked_by_a_hook_rewinds_and_the_run_ends_as_without_it(tmp_path: Path, mode: str) -> None:
    plain = _run(tmp_path, "plain", mode, [])
    hook = RollbackOnce(at=3, to=1)
    rewound = _run(tmp_path, "rewound", mode, [hook])

    assert hook.seen == [1, 2, 3, 2, 3, 4]  # steps 2 and 3 were redone
    [event] = [line for line in (rewound.path / "rollbacks.jsonl").read_text().splitlines()]
    assert '"to_step":1' in event.replace(" ", "") and "reward collapsed" in event
    rows = [m["step"] for m in rewound.read_metrics() if m.get("phase") == "rl"]
    assert rows == [1, 2, 3, 4]  # the rolled-back steps' rows went; the redone ones are there once

    a, b = _weights(plain), _weights(rewound)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    store_a, store_b = existing_run_store(plain), existing_run_store(rewound)
    assert store_a is not None and store_b is not None
    def trained(store: object, run: RunFolder) -> dict[str, int]:  # ids start with the run's name
        return {i.removeprefix(f"{run.name}/"): step for i, step in store.trained().items()}  # type: ignore[attr-defined]

    assert trained(store_b, rewound) == trained(store_a, plain)  # the ledger voided steps 2-3 of the first pass
    assert len(store_b.trained()) == sum(m["trained_samples"] for m in plain.read_metrics() if m.get("phase") == "rl")


def test_a_rollback_to_a_missing_checkpoint_says_which(tmp_path: Path) -> None:
    from tidal.errors import CheckpointError

    with pytest.raises(CheckpointError, match="rollback at step 2 .*no RL checkpoint at step 7"):
        _run(tmp_path, "missing", "sync", [RollbackOnce(at=2, to=7)])
