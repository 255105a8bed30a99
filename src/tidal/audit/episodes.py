"""The reference of an agent task, run the way `tidal eval --model oracle` runs it.

An agent task's reference is a shell script (`solution/solve.sh` in the terminal-task layout), not
an answer text: scoring it as an answer would hand the script to the verifier as a "solution" and
its tests would find none of the files the script writes (the FileNotFoundError a text-style run
gives on every built-in agent task). So for a multi-turn task (`types.is_multi_turn`) the
reference runs as one oracle episode: `OraclePolicy` calls `bash` with the reference in a fresh
session holding the starting files, then submits, and the acceptance tests run on the workspace
it left, all through `agent.runner.run_episode`, exactly as evaluation runs it.
"""

from __future__ import annotations

from tidal.agent.policy import OraclePolicy
from tidal.agent.runner import AgentConfig, run_episode
from tidal.audit.context import AuditContext
from tidal.sandbox.session import SessionStore
from tidal.types import Outcome, Score, Task, is_multi_turn

__all__ = ["is_multi_turn", "oracle_episode_score"]


def oracle_episode_score(task: Task, ctx: AuditContext, hash_seed: int = 0) -> tuple[Score, float]:
    """The acceptance score of one oracle episode of `task` in the audit's sandbox for
    `hash_seed`, and the episode's wall time (commands and acceptance run)."""
    backend = ctx.sandbox(task.image, hash_seed)
    store = SessionStore()
    try:
        result = run_episode(task, OraclePolicy(), backend, AgentConfig(), seed=hash_seed, store=store)
    finally:
        store.close()
    wall_s = result.wall_s + result.acceptance_s
    if result.score is not None:
        return result.score, wall_s
    # No acceptance verdict: the episode could not run (sandbox, tools); say why as a task error.
    detail = f"the oracle episode ended {result.outcome.value}: {result.detail}"
    return Score(0.0, Outcome.INFRA_ERROR, detail=detail), wall_s
