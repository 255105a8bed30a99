"""Check 10, `difficulty` (with `--policy`): how often the current policy solves the task.

The policy samples `policy_samples` (n) answers per task with the embedded engine, and the task's
verifier scores them. c = answers that `passed`; pass@1 = c / n, and pass@k for k <= n by the
unbiased estimator 1 - C(n - c, k) / C(n, k). `difficulty_estimate` = 1 - pass@1 is stored with
the task's measurements and in the quarantine file's annotations, for the curriculum. A task the
policy always solves (c = n) or never solves (c = 0) gives RL no signal at this point (every
group's rewards are equal) and is reported as `info`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tidal.audit.context import AuditContext, Policy
from tidal.audit.records import Finding
from tidal.eval.stats import pass_at_k
from tidal.types import Outcome, Task

CHECK = "difficulty"


def load_policy(path: str, device: str = "auto", max_new_tokens: int = 128, temperature: float = 1.0) -> Policy:
    """A `Policy` sampling from a local checkpoint folder (or `tiny`, the built-in model) with the
    embedded engine. Generation is serialised by a lock (one engine, many audit threads)."""
    from tidal.config.schema import ModelConfig
    from tidal.models.io import load_model, render_prompt, resolve_device
    from tidal.rollout.engine import EmbeddedEngine, SamplingParams

    if path != "tiny" and not Path(path).is_dir():
        from tidal.errors import ModelLoadError

        raise ModelLoadError(f"--policy {path}: not a checkpoint folder (or 'tiny')")
    torch_device = resolve_device(device)
    loaded = load_model(ModelConfig(path=path), torch_device)
    engine = EmbeddedEngine(loaded.model, loaded.tokenizer, torch_device)
    lock = threading.Lock()

    def sample(task: Task, k: int) -> list[str]:
        prompt = render_prompt(engine.tokenizer, task.messages())
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=0)
        with lock:
            [group] = engine.generate([prompt], k, params)
        return [completion.text for completion in group]

    return sample


def check_difficulty(task: Task, ctx: AuditContext, measurements: dict[str, Any]) -> list[Finding]:
    if ctx.policy is None:
        return []
    n = ctx.config.policy_samples
    answers = ctx.policy(task, n)
    scores = ctx.score_many(task, answers)
    valid = [s for s in scores if s.outcome is not Outcome.INFRA_ERROR]
    if not valid:
        return []
    n, c = len(valid), sum(s.outcome is Outcome.PASSED for s in valid)
    estimate = {"samples": n, "passed": c, "pass@1": c / n, f"pass@{n}": pass_at_k(n, c, n),
                "difficulty_estimate": round(1 - c / n, 4)}
    measurements["difficulty"] = estimate
    measurements["difficulty_estimate"] = estimate["difficulty_estimate"]
    if c == n:
        return [Finding(CHECK, "info", f"the policy always solves it ({c}/{n})", estimate)]
    if c == 0:
        return [Finding(CHECK, "info", f"the policy never solves it (0/{n})", estimate)]
    return []
