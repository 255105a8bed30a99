"""k episodes of each of many tasks on one embedded engine, run concurrently: what RL rollouts and
the held-out evaluation of the agent domain need (the eval harness runs its own loop with resume).
`is_multi_turn` says which tasks are such episodes rather than one answer each."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tidal.agent.local import LocalPolicy
from tidal.agent.records import AgentResult
from tidal.agent.runner import AgentConfig, run_episode
from tidal.types import Task


def sample_agent_results(
    engine: Any,
    tasks: list[Task],
    k: int,
    *,
    temperature: float,
    top_p: float,
    stop: list[str],
    max_new_tokens: int,
    max_tokens: int,
    seed: int,
    backend: str,
    concurrency: int,
    cancel: Any = None,
) -> list[list[AgentResult]]:
    """`k` episodes per task (seeds 0..k-1 of a policy seeded with `seed`), in task order. The
    episodes' turns share engine calls through the policy's batcher; `concurrency` episodes at once.
    `cancel` (an object with `is_set()`, e.g. a `threading.Event`): once set, every episode stops
    at its next turn and `PreemptedError` is raised (the results of the others are dropped)."""
    from tidal.sandbox import get_backend

    if not tasks:
        return []
    policy = LocalPolicy(engine, engine.tokenizer, name="local", temperature=temperature, top_p=top_p,
                         stop=stop, seed=seed, cancel=cancel)
    sandbox = get_backend(backend)
    config = AgentConfig(max_tokens=max_tokens, max_new_tokens=max_new_tokens)
    jobs = [(task, sample) for task in tasks for sample in range(k)]
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(jobs))), thread_name_prefix="tidal-agent") as pool:
            results = list(pool.map(lambda job: run_episode(job[0], policy, sandbox, config, seed=job[1]), jobs))
    finally:
        policy.close()
    return [results[i * k : (i + 1) * k] for i in range(len(tasks))]
