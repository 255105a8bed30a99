"""What `tidal score` does: score one answer file against one task, and gate it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidal.errors import UnknownNameError

SHOWN_TASK_IDS = 20  # how many known task ids an unknown-id error lists
ANSWER_READ_CAP = 1 << 20  # bytes read from the answer file; the verifiers cap answers at 64 KiB


def score_command(
    task_paths: list[str], task_id: str, answer_path: str, backend: str = "bwrap", max_new_tokens: int = 1 << 16
) -> dict[str, Any]:
    """Score the answer in `answer_path` (read as bytes: it may be anything) for task `task_id`.

    Returns {"task_id", "reward", "outcome", "keep", "drop_reason", "components", "detail"}.
    Raises `TaskFormatError` for bad task files and `UnknownNameError` for an unknown task id.
    """
    from tidal.config.schema import GateConfig, RewardConfig, SandboxConfig
    from tidal.gate import gate_single
    from tidal.reward.registry import known_verifiers
    from tidal.reward.scorer import Scorer
    from tidal.tasks import load_tasks
    from tidal.types import Completion, Episode

    tasks = load_tasks(list(task_paths), known_verifiers=known_verifiers())
    by_id = {task.id: task for task in tasks}
    if task_id not in by_id:
        known = sorted(by_id)
        shown = known[:SHOWN_TASK_IDS] + ([f"... ({len(known) - SHOWN_TASK_IDS} more)"] if len(known) > SHOWN_TASK_IDS else [])
        raise UnknownNameError("task id", task_id, shown)
    task = by_id[task_id]
    with open(Path(answer_path), "rb") as file:
        raw = file.read(ANSWER_READ_CAP + 1)
    config = RewardConfig(sandbox=SandboxConfig(backend=backend, workers=1), cache=False)
    score = Scorer(config).score(task, raw)
    text = raw.decode("utf-8", errors="replace")
    episode = Episode(
        id=f"score/{task.id}",
        task_id=task.id,
        domain=task.domain,
        group_id=task.id,
        completion=Completion(prompt_ids=[], token_ids=[], logprobs=[], text=text, finish_reason="stop", weight_version=0),
        score=score,
    )
    keep, reason = gate_single(episode, GateConfig(), max_new_tokens)
    return {
        "task_id": task.id,
        "reward": score.value,
        "outcome": score.outcome.value,
        "keep": keep,
        "drop_reason": reason,
        "components": dict(score.components),
        "detail": score.detail,
    }
