"""Preemption reaches a Ray rollout actor: the driver's handle passes a set `cancel` on to the
actor's control thread, the actor's generation stops at its next decode step, the call raises
`PreemptedError` in the driver, and the actor stays healthy and generates the same batch again."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from tidal.config import load_config
from tidal.errors import PreemptedError
from tidal.models import load_model
from tidal.pipeline import quickstart as qs
from tidal.pipeline import run as pipeline_run
from tidal.pipeline.weights import canary_ids, publish
from tidal.rollout.engine import EmbeddedEngine


def test_a_ray_rollout_actor_is_preempted_mid_batch_and_then_generates_the_same_batch(ray_cluster: str) -> None:
    from tidal.pipeline.backends.ray import BACKEND

    # A batch that takes the actor a while: every train task, 8 samples of up to 256 tokens.
    cfg = load_config(qs.find_config("smoke"), [f"pipeline.ray_address={ray_cluster}", "pipeline.backend=ray",
                                                  "rollout.max_new_tokens=256", "rollout.group_size=8"])
    loaded = load_model(cfg.model)
    engine = EmbeddedEngine(loaded.model, loaded.tokenizer)
    train, _ = pipeline_run.build_tasks(cfg)
    parts = SimpleNamespace(config=cfg, engine=engine, run=SimpleNamespace(name="ray-preempt"),
                            mixer=SimpleNamespace(tasks=train))
    tasks = [task for domain in train.values() for task in domain]
    publication = publish(loaded.model, 0, canary_ids(loaded.tokenizer))
    workers = BACKEND.start(parts)  # type: ignore[arg-type]
    try:
        worker = workers.rollouts[0]
        expected = worker.sample(tasks, 0, publication)
        cancel = threading.Event()
        cancel.set()  # preempted as soon as it is sent: the actor stops at its next decode step
        with pytest.raises(PreemptedError, match="rollout actor 0, batch 0: preempted"):
            worker.sample(tasks, 0, publication, None, cancel)
        worker.check()  # still answers, with the weights it holds
        again = worker.sample(tasks, 0, publication, None, threading.Event())
        assert [e.completion.token_ids for g in again for e in g.episodes] == \
                [e.completion.token_ids for g in expected for e in g.episodes]
        assert [e.id for g in again for e in g.episodes] == [e.id for g in expected for e in g.episodes]
        assert workers.restarts()["rollout"] == 0  # the same actor process throughout
    finally:
        workers.close()
