"""The Ray backend: the rollout workers and the scorers are Ray actors; the trainer, the loop's
threads and the trajectory store stay in the driver (docs/design/loop.md, "Backends").

`ray.init(address=pipeline.ray_address)` joins a cluster, or starts Ray in this process without
one; every node needs the driver's tidal. A rollout actor gets the config and run name at
creation, the policy (a CPU copy of the model and the tokenizer, put once in the object store)
with its calls, and each version's tensors through the object store, fetched only when it holds
another version and verified (`weights.load_verified`) before it generates. A scorer actor
(`ray_scorer.py`, which imports no torch) gets the reward config and its share of each batch.
A dead actor is restarted up to `pipeline.worker_restarts` times and its call retried (both
kinds of work are idempotent); restarts are counted from the process ids calls report.
Preemption reaches a running `sample` through the actor's second ("control") thread.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid
from types import ModuleType
from typing import Any

from tidal.config.schema import TidalConfig
from tidal.errors import PreemptedError, SandboxUnavailableError
from tidal.pipeline.backends import (
    BackendUnavailableError,
    WorkerLostError,
    Workers,
    policy_copy,
    split_by_task,
)
from tidal.pipeline.backends.ray_scorer import ScorerActor
from tidal.pipeline.stages import LoopParts, Sampler
from tidal.pipeline.weights import (
    UNLOADED,
    Publication,
    WeightTimeoutError,
    check_canary,
    load_verified,
)
from tidal.reward.registry import needs_sandbox
from tidal.rollout.engine import Cancel, EmbeddedEngine
from tidal.rollout.protocol import ReportsMetrics
from tidal.sandbox.image import ImageSpec, image_spec
from tidal.types import Group, Score, Task

logger = logging.getLogger(__name__)

NAMESPACE = "tidal"
CONTROL = "control"  # the rollout actors' concurrency group for `preempt`
PREEMPT_POLL_S = 0.05  # how often a preemptible call in flight looks at its flag
RAY_PIN = "ray==2.60.0"  # the version the tests run against (pyproject's `ray` extra)


def import_ray() -> ModuleType:
    """The `ray` module, or `BackendUnavailableError` saying how to install it."""
    try:
        import ray
    except ImportError as error:
        raise BackendUnavailableError(
            f"pipeline.backend=ray needs Ray, which is not installed here: pip install 'tidal[ray]' "
            f"(or pip install {RAY_PIN}), or set pipeline.backend=local"
        ) from error
    return ray


class RolloutActor:
    """Generates batches on its own copy of the policy (a Ray actor)."""

    def __init__(self, config: TidalConfig, run_name: str, device: str, max_batch_rows: int) -> None:
        # No object-store arguments: Ray does not keep those of a restartable actor alive for its
        # restarts (ray-project/ray#53727). The policy comes with each `sample` call instead.
        self.config, self.run_name, self.device, self.max_batch_rows = config, run_name, device, max_batch_rows
        self.sampler: Sampler | None = None  # made from the policy by the first `sample` call
        self.loaded: Publication | None = None  # the header of the publication the engine holds
        # Preemption: `preempt(call)` runs on the actor's "control" thread while `sample` runs.
        self._cancels: dict[str, threading.Event] = {}  # call id -> its flag (created by whichever comes first)
        self._cancels_lock = threading.Lock()

    def _cancel(self, call: str) -> threading.Event:
        with self._cancels_lock:
            return self._cancels.setdefault(call, threading.Event())

    def preempt(self, call: str) -> None:
        """Stop the `sample` call `call` at its next decode step (or before it starts)."""
        self._cancel(call).set()

    def pid(self) -> int:
        return os.getpid()

    def check(self) -> int:
        """The health check: this process's id, once the model computes the canary logprobs of the
        weights it holds (`WeightVerificationError` otherwise)."""
        engine = self.sampler.engine if self.sampler is not None else None
        if engine is not None and self.loaded is not None and engine.weight_version == self.loaded.version:
            check_canary(engine, self.loaded, self.config.pipeline.canary_tolerance)
        return os.getpid()

    def run_metrics(self) -> dict[str, float]:
        """Its engine's counters (`engine/...`, `spec/...`); {} before the first `sample` call."""
        engine = self.sampler.engine if self.sampler is not None else None
        return engine.run_metrics() if isinstance(engine, ReportsMetrics) else {}

    def _sampler(self, policy: list[Any]) -> Sampler:
        """The sampler, made on the first call from `policy`, the ref of (model, tokenizer)."""
        if self.sampler is None:
            import ray

            model, tokenizer = ray.get(policy[0])
            model = model.to(self.device).eval().requires_grad_(False)
            engine = EmbeddedEngine.from_config(model, tokenizer, self.device, self.config.rollout, self.max_batch_rows)
            engine.weight_version = UNLOADED  # a new (or restarted) actor generates only with verified weights
            self.sampler = Sampler(self.config, self.run_name, engine)
        return self.sampler

    def sample(
        self, tasks: list[Task], step: int, header: Publication, state: list[Any], policy: list[Any],
        indices: list[int] | None = None, call: str | None = None,
    ) -> tuple[int, list[Group] | None]:
        """(this process's id, the episodes of `tasks`, at `indices` of batch `step`) generated with
        the weights of `header`; `state` and `policy` hold the object refs of its tensors and of the
        (model, tokenizer) a new actor starts from (in lists, so Ray hands the refs over without
        fetching them). The episodes are None when `preempt(call)` stopped it."""
        sampler = self._sampler(policy)
        if call is None:
            return os.getpid(), self._sample(sampler, tasks, step, header, state, indices, None)
        try:
            return os.getpid(), self._sample(sampler, tasks, step, header, state, indices, self._cancel(call))
        except PreemptedError:
            return os.getpid(), None
        finally:
            with self._cancels_lock:
                self._cancels.pop(call, None)

    def _sample(
        self, sampler: Sampler, tasks: list[Task], step: int, header: Publication, state: list[Any],
        indices: list[int] | None, cancel: threading.Event | None,
    ) -> list[Group]:
        engine, pipeline = sampler.engine, self.config.pipeline
        if engine.weight_version != header.version:
            import ray

            try:
                tensors = ray.get(state[0], timeout=pipeline.weight_timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise WeightTimeoutError(
                    f"the rollout actor could not fetch weight version {header.version} from the object store "
                    f"within pipeline.weight_timeout_s={pipeline.weight_timeout_s:g}"
                ) from None
            load_verified(engine, dataclasses.replace(header, state=tensors), pipeline.canary_tolerance)
            self.loaded = header
        return sampler.sample(tasks, step, indices, cancel)


class _Restarts:
    """Counts the restarts of a kind of actor from the process ids their answers carry (the
    rollout actors' sampler threads report at once)."""

    def __init__(self) -> None:
        self.pids: dict[int, int] = {}  # actor index -> last pid seen
        self.count = 0
        self.lock = threading.Lock()

    def saw(self, actor: int, pid: int) -> None:
        with self.lock:
            if self.pids.get(actor, pid) != pid:
                self.count += 1
                logger.warning("a Ray actor was restarted (now pid %d)", pid)
            self.pids[actor] = pid


def _get(ray: ModuleType, refs: list[Any], timeout_s: float, what: str, restarts: int) -> list[Any]:
    """`ray.get(refs)`, with a dead actor or a timeout as `WorkerLostError`."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise WorkerLostError(f"{what}: no answer within pipeline.worker_timeout_s={timeout_s:g}") from None
    except ray.exceptions.RayActorError as error:
        raise WorkerLostError(
            f"{what}: the actor died and was not brought back (pipeline.worker_restarts={restarts} restarts "
            f"allowed): {error}"
        ) from error


class _PutWeights:
    """The newest publication's tensors in the object store, put once per version for every
    rollout actor (their sampler threads call it at once)."""

    def __init__(self, ray: ModuleType) -> None:
        self.ray, self.lock = ray, threading.Lock()
        self.current: tuple[int, Any] | None = None  # (version, object ref)

    def ref(self, publication: Publication) -> Any:
        with self.lock:
            if self.current is None or self.current[0] != publication.version:
                # Dropping the previous ref frees it once no call in flight holds it.
                self.current = (publication.version, self.ray.put(publication.state))
            return self.current[1]


class RayRollout:
    """The driver's handle on one rollout actor (a `RolloutWorker`)."""

    def __init__(
        self, ray: ModuleType, actor: Any, index: int, pipeline: Any, policy: Any, weights: _PutWeights, restarts: _Restarts
    ) -> None:
        self.ray, self.actor, self.index, self.pipeline = ray, actor, index, pipeline
        self.policy = policy  # the ref of the actor's (model, tokenizer), sent with each call
        self.weights, self.restarts = weights, restarts

    def sample(
        self, tasks: list[Task], step: int, publication: Publication, indices: list[int] | None = None,
        cancel: Cancel | None = None, kept: dict[tuple[str, ...], Any] | None = None,
    ) -> list[Group]:
        # `kept` is not used: the actor's engine state stays in its process, so a preempted chunk reruns.
        what = f"rollout actor {self.index}, batch {step}"
        call_id = uuid.uuid4().hex if cancel is not None else None
        call = self.actor.sample.remote(tasks, step, publication.header(), [self.weights.ref(publication)],
                                        [self.policy], indices, call_id)
        if cancel is not None:  # wait in slices, passing a preemption on to the actor's control thread
            deadline, asked = time.monotonic() + self.pipeline.worker_timeout_s, False
            while True:
                if cancel.is_set() and not asked:
                    self.actor.preempt.options(concurrency_group=CONTROL).remote(call_id)
                    asked = True
                if self.ray.wait([call], timeout=PREEMPT_POLL_S)[0] or time.monotonic() > deadline:
                    break  # done, or `_get` below times out at once and says so
        timeout = self.pipeline.worker_timeout_s if cancel is None else max(0.0, deadline - time.monotonic())
        [(pid, episodes)] = _get(self.ray, [call], timeout, what, self.pipeline.worker_restarts)
        self.restarts.saw(self.index, pid)
        if episodes is None:
            raise PreemptedError(f"{what}: preempted on the actor")
        return episodes

    def check(self) -> None:
        [pid] = _get(self.ray, [self.actor.check.remote()], self.pipeline.health_timeout_s,
                     f"rollout actor {self.index}, health check", self.pipeline.worker_restarts)
        self.restarts.saw(self.index, pid)

    def run_metrics(self) -> dict[str, float]:
        # On the control thread: the counters are read while a `sample` call runs.
        [metrics] = _get(self.ray, [self.actor.run_metrics.options(concurrency_group=CONTROL).remote()],
                         self.pipeline.health_timeout_s, f"rollout actor {self.index}, engine metrics",
                         self.pipeline.worker_restarts)
        return metrics


class RayScorers:
    """The driver's handle on the scorer actors (a `ScoringWorker`): each batch is split among them."""

    def __init__(self, ray: ModuleType, actors: list[Any], pipeline: Any) -> None:
        self.ray, self.actors, self.pipeline = ray, actors, pipeline
        self.restarts = _Restarts()

    def score_many(self, items: list[tuple[Task, str | bytes]]) -> list[Score]:
        shares = split_by_task(items, len(self.actors))
        calls = [actor.score_many.remote([items[i] for i in share]) for actor, share in zip(self.actors, shares)]
        answers = _get(self.ray, calls, self.pipeline.worker_timeout_s, f"scorer actors ({len(items)} answers)",
                       self.pipeline.worker_restarts)
        scores: list[Score | None] = [None] * len(items)
        for actor, (share, (pid, share_scores)) in enumerate(zip(shares, answers)):
            self.restarts.saw(actor, pid)
            for index, score in zip(share, share_scores):
                scores[index] = score
        return scores  # type: ignore[return-value]


def run_images(parts: LoopParts) -> tuple[list[ImageSpec], bool]:
    """The specs of the images the run's sandboxed train tasks use (as built on this machine),
    and whether any task needs a sandbox at all."""
    images = {t.image for tasks in parts.mixer.tasks.values() for t in tasks if needs_sandbox(t.verifier.name)}
    try:
        return [image_spec(name) for name in sorted(images)], bool(images)
    except SandboxUnavailableError as error:
        raise BackendUnavailableError(f"the run's tasks need an image this machine has not built: {error}") from error


def check_scorer_nodes(reports: list[dict[str, Any]]) -> None:
    """Raise BackendUnavailableError naming every scorer node that cannot score the run's tasks."""
    problems = [f"scorer {i} on {r['host']} (pid {r['pid']}): {p}" for i, r in enumerate(reports) for p in r["problems"]]
    if problems:
        raise BackendUnavailableError("scoring nodes cannot score this run's tasks: " + "; ".join(problems))
    for index, report in enumerate(reports):
        if report["built"]:
            logger.info("scorer %d on %s built image(s) %s from their specs", index, report["host"], report["built"])


class RayBackend:
    """Ray actors (`pipeline.backend: ray`)."""

    def start(self, parts: LoopParts, newest: Any = None) -> Workers:
        """`newest` is not used: an actor loads publications between chunks (the config refuses
        `pipeline.inflight_updates` on Ray)."""
        ray = import_ray()
        cfg = parts.config
        pipeline = cfg.pipeline
        owns = not ray.is_initialized()
        if owns:
            try:
                if pipeline.ray_address is None:  # "local": a new Ray here, even if $RAY_ADDRESS is set
                    ray.init(address="local", namespace=NAMESPACE, include_dashboard=False)
                else:
                    ray.init(address=pipeline.ray_address, namespace=NAMESPACE)
            except ConnectionError as error:
                raise BackendUnavailableError(
                    f"pipeline.ray_address={pipeline.ray_address!r}: cannot join a Ray cluster there ({error}); "
                    "start one (ray start --head) or set it to null to start Ray in this process"
                ) from error
        # Named after the run (and unique), so an operator (or a test) can find them in the cluster.
        tag = f"{parts.run.name}/{uuid.uuid4().hex[:8]}"
        restarts = {"max_restarts": pipeline.worker_restarts, "max_task_retries": pipeline.worker_restarts}
        device = parts.engine.device
        # The model and tokenizer go through the object store once, and their ref goes with each
        # call: as a constructor argument (in the object store), a restart could find it gone
        # (ray-project/ray#53727, which Ray logs as an error at every such actor's creation).
        policy = ray.put((policy_copy(parts).to("cpu"), parts.engine.tokenizer))
        count = pipeline.rollout_workers
        # One GPU each while the cluster has enough; otherwise they share them (Ray would leave
        # the ones without a whole GPU pending, and the run would wait for them).
        gpus = min(1.0, ray.cluster_resources().get("GPU", 1.0) / count) if device.type == "cuda" else 0
        # A "control" thread beside the default one (which runs one call at a time): `preempt`
        # reaches the actor while `sample` runs.
        rollout_class = ray.remote(**restarts, num_cpus=1, num_gpus=gpus, concurrency_groups={CONTROL: 1})(RolloutActor)

        def new_rollout(name: str) -> Any:
            return rollout_class.options(name=name, namespace=NAMESPACE).remote(
                cfg, parts.run.name, device.type, parts.engine.max_batch_rows
            )

        rollouts = [new_rollout(f"{tag}/rollout-{i}") for i in range(count)]
        # Scorers mostly wait on their sandbox processes, which Ray does not schedule: no CPU reserved.
        # Threaded: the async loop's scorer thread scores `pipeline.scoring_depth` batches at once.
        scorer_class = ray.remote(**restarts, num_cpus=0, max_concurrency=pipeline.scoring_depth)(ScorerActor)
        scorers = [
            scorer_class.options(name=f"{tag}/scorer-{i}", namespace=NAMESPACE).remote(cfg.reward)
            for i in range(pipeline.scorer_workers)
        ]
        try:
            check_scorer_nodes(ray.get([a.preflight.remote(*run_images(parts)) for a in scorers], timeout=1800))
        except BaseException:
            for actor in [*rollouts, *scorers]:
                ray.kill(actor, no_restart=True)
            if owns:
                ray.shutdown()
            raise
        weights, rollout_restarts = _PutWeights(ray), _Restarts()
        rollout_handles = [
            RayRollout(ray, actor, i, pipeline, policy, weights, rollout_restarts) for i, actor in enumerate(rollouts)
        ]
        scorer_handle = RayScorers(ray, scorers, pipeline)
        replaced = {"rollout": 0}

        def replace(index: int) -> RayRollout:
            """A new actor in slot `index` (the old one failed a health check: dead past its
            restarts, stuck, or computing something else), the old one killed."""
            ray.kill(rollouts[index], no_restart=True)
            with rollout_restarts.lock:  # the new actor's process id is no restart of the old one
                rollout_restarts.pids.pop(index, None)
            replaced["rollout"] += 1
            rollouts[index] = new_rollout(f"{tag}/rollout-{index}-r{replaced['rollout']}")
            rollout_handles[index] = RayRollout(ray, rollouts[index], index, pipeline, policy, weights, rollout_restarts)
            return rollout_handles[index]

        def close() -> None:
            try:
                ray.get([actor.close.remote() for actor in scorers], timeout=30)  # shut the sandbox pools
            except Exception as error:  # noqa: BLE001 - best effort: the actors are killed next anyway
                logger.warning("closing the scorer actors: %s", error)
            for actor in [*rollouts, *scorers]:
                ray.kill(actor, no_restart=True)
            if owns:
                ray.shutdown()

        return Workers(
            rollout_handles, scorer_handle, close=close, replace=replace,
            restarts=lambda: {"rollout": rollout_restarts.count + replaced["rollout"],
                              "scorer": scorer_handle.restarts.count},
        )


BACKEND = RayBackend()
