"""A rollout chunk preempted mid-generation keeps its work: its next try resumes the engine call
where it stopped (its unfinished samples' tokens kept, their KV recomputed), and the run trains
exactly the tokens of a run that was never preempted."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tidal.pipeline import quickstart as qs
from tidal.pipeline.backends.local import LocalRollout
from tidal.pipeline.stages import Sampler
from tidal.rollout.engine import EmbeddedEngine
from tidal.storage.run import RunFolder
from tidal.storage.store import existing_run_store

KEEP_ALL = ["gate.drop_zero_variance=false", "gate.drop_truncated=false", "gate.drop_empty=false",
            "gate.max_repetition=1.0", "audit.watch.enabled=false"]
STEPS = 3
STOP_AFTER = 4  # engine steps of a first try before it waits for the preemption


def _run(tmp_path: Path, name: str, *overrides: str) -> RunFolder:
    qs.run_quickstart(qs.find_config("smoke"), [f"trainer.steps={STEPS}", *KEEP_ALL, "pipeline.mode=async",
                                                "algorithm.max_staleness=0", *overrides], tmp_path, name)
    return RunFolder.open(tmp_path / name)


def _tokens(run: RunFolder) -> dict[str, list[int]]:
    store = existing_run_store(run)
    assert store is not None
    rows = store.table(["id", "token_ids"]).to_pylist()
    return {row["id"].split("/", 1)[1]: row["token_ids"] for row in rows}  # the run name differs


def test_a_chunk_preempted_mid_generation_resumes_and_trains_the_unpreempted_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _run(tmp_path, "plain", "eval.every=0")
    first_tries: set[int] = set()
    current = threading.local()
    waited: list[bool] = []
    resumed: list[int] = []
    original_sample, original_step, original_generate = LocalRollout.sample, EmbeddedEngine.step, Sampler._generate

    class LateCancel:
        """The scheduler's flag, seen by the engine only once it has made STOP_AFTER steps."""

        def __init__(self, flag: threading.Event) -> None:
            self.flag = flag

        def is_set(self) -> bool:
            return self.flag.is_set() and current.steps >= STOP_AFTER

    def sample(self: LocalRollout, tasks: Any, step: int, publication: Any, indices: Any = None, cancel: Any = None,
               kept: Any = None) -> Any:
        first = cancel is not None and step >= 1 and step not in first_tries
        first_tries.add(step)
        current.cancel, current.steps = (cancel if first else None), 0
        return original_sample(self, tasks, step, publication, indices, LateCancel(cancel) if first else cancel, kept)

    def engine_step(self: EmbeddedEngine) -> Any:
        cancel = getattr(current, "cancel", None)
        if cancel is not None:
            current.steps += 1
            if current.steps == STOP_AFTER:  # mid-generation: the evaluation's hold preempts it here
                waited.append(cancel.wait(20.0))
                current.cancel = None
                return []  # the engine sees the flag before its next step
        return original_step(self)

    def generate(self: Sampler, prompts: Any, params: Any, cancel: Any, kept: Any, key: Any) -> Any:
        if kept is not None and kept.get(key, (None,))[0] == "preempted":
            resumed.append(sum(len(s.generated) for handle in kept[key][1] for s in handle.live))
        return original_generate(self, prompts, params, cancel, kept, key)

    monkeypatch.setattr(LocalRollout, "sample", sample)
    monkeypatch.setattr(EmbeddedEngine, "step", engine_step)
    monkeypatch.setattr(Sampler, "_generate", generate)
    preempted = _run(tmp_path, "preempted", "eval.every=1")
    assert any(waited)
    assert resumed and all(tokens > 0 for tokens in resumed)  # the next tries went on from kept tokens
    rows = [m for m in preempted.read_metrics() if m.get("phase") == "rl"]
    assert rows[-1]["scheduler/preempted_chunks"] >= 1
    assert rows[-1]["engine/recomputed_tokens"] > 0
    assert _tokens(preempted) == _tokens(plain)
