"""Multi-turn rollouts for RL: the `agent` domain through the episode runner (tidal.agent).

A task with tools or more than one step is not sampled as one completion: each of its
`group_size` samples is an episode of `run_episode` in a sandbox session, with the loop's engine
behind a `LocalPolicy` (token-in/token-out: the episode is one running list of token ids; the
model's turns are appended exactly as sampled, tool results are appended with mask 0). The
episode becomes an `Episode` whose completion is everything after the first prompt, with a
`loss_mask` so only the model's own tokens train and a `tool_mask` saying which came from tools
(both kept in the trajectory store), and whose score is the acceptance verdict; the
loop's scorer leaves such an episode alone. The group's episodes, and the groups of one step, run
concurrently (`rollout.agent_concurrency`), their turns batched into shared engine calls.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from tidal.types import Completion, Episode, Outcome, Score, Task

if TYPE_CHECKING:
    from tidal.agent.records import AgentResult
    from tidal.config.schema import TidalConfig
    from tidal.rollout.engine import Cancel
    from tidal.rollout.protocol import RolloutEngine


AGENT_INFO = "agent"  # the key of an agent episode's turn log in its score's info (store column score_info)
MESSAGE_CHARS = 4000  # each message of the turn log is cut to this many characters


def agent_turns(result: AgentResult) -> dict[str, Any]:
    """The episode turn by turn, for `tidal trajectories show` and the dashboard's replay: the
    messages after the opening prompt (the model's turns and the tool results, each cut to
    MESSAGE_CHARS), one record per step (timings, tool calls with their arguments), and how the
    episode ended."""
    messages = list(result.trace.get("messages", []))
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    return {
        "termination": result.termination.value, "outcome": result.outcome.value, "wall_s": result.wall_s,
        "acceptance_s": result.acceptance_s,
        "messages": [{"role": str(m.get("role", "")), "content": str(m.get("content", ""))[:MESSAGE_CHARS]}
                     for m in messages[first:]],
        "steps": [asdict(step) for step in result.steps],
    }


def episode_from_result(result: AgentResult, episode_id: str, group_id: str, version: int) -> Episode:
    """The trainable record of one agent episode. Its completion starts after the first prompt;
    `weight_version` is the oldest weights any of its turns used."""
    trace = result.trace
    prompt = list(trace.get("prompt_ids", []))
    tokens = list(trace.get("token_ids", []))[len(prompt):]
    mask = list(trace.get("mask", []))[len(prompt):]
    tool_mask = list(trace.get("tool_mask", []))[len(prompt):]
    logprobs = list(trace.get("logprobs", []))[len(prompt):]
    turns = [m["content"] for m in trace.get("messages", []) if m.get("role") == "assistant"]
    versions = trace.get("weight_versions") or [version]
    score = result.score
    if score is None or result.reward is None:  # the episode says nothing about the model
        score = Score(0.0, Outcome.INFRA_ERROR, detail=f"agent episode: {result.outcome.value}: {result.detail}"[:2000])
    score = replace(score, info={**score.info, AGENT_INFO: agent_turns(result)})
    completion = Completion(prompt_ids=prompt, token_ids=tokens, logprobs=logprobs, text="\n".join(turns),
                            finish_reason="stop", weight_version=min(versions), loss_mask=mask,
                            tool_mask=tool_mask if len(tool_mask) == len(tokens) else None)
    episode = Episode(id=episode_id, task_id=result.task_id, domain=result.domain, group_id=group_id,
                      completion=completion, score=score)
    episode.timings.update({"agent_steps": float(len(result.steps)), "agent_wall_s": result.wall_s})
    return episode


def sample_agent_groups(
    engine: RolloutEngine, cfg: TidalConfig, tasks: list[Task], group_ids: list[str], step: int,
    cancel: Cancel | None = None,
) -> list[list[Episode]]:
    """`rollout.group_size` episodes of each task (the episodes of `group_ids[i]` for `tasks[i]`),
    in task then sample order; once `cancel` is set, `PreemptedError` at the episodes' next turn."""
    from tidal.agent.sampling import sample_agent_results

    results = sample_agent_results(
        engine, tasks, cfg.rollout.group_size,
        temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, stop=list(cfg.rollout.stop),
        max_new_tokens=cfg.rollout.max_new_tokens, max_tokens=cfg.rollout.agent_max_tokens,
        seed=cfg.run.seed * 1_000_003 + step, backend=cfg.reward.sandbox.backend,
        concurrency=cfg.rollout.agent_concurrency, cancel=cancel,
    )
    return [
        [episode_from_result(result, f"{group_id}/s{k:02d}", group_id, engine.weight_version)
         for k, result in enumerate(group)]
        for group_id, group in zip(group_ids, results)
    ]
