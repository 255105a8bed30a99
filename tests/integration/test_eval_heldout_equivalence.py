"""`tidal eval`'s harness and a train run's held-out evaluation give the same numbers: the same
tiny model, the same tasks of every kind, greedy, two samples each."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from tidal.agent.local import LocalPolicy
from tidal.config.schema import ModelConfig, TinyModelConfig
from tidal.errors import SandboxUnavailableError
from tidal.eval.harness import finish_eval, run_eval
from tidal.eval.heldout import evaluate_policy, pass_rates
from tidal.eval.settings import Budgets, EvalSettings
from tidal.models import load_model
from tidal.reward.scorer import Scorer
from tidal.rollout import EmbeddedEngine
from tidal.sandbox import get_backend
from tidal.sandbox.base import SandboxBackend
from tidal.tasks import generate_tasks
from tidal.types import Task

SAMPLES = 2
MAX_NEW_TOKENS = 12


@pytest.fixture(scope="module")
def bwrap() -> SandboxBackend:
    try:
        return get_backend("bwrap")
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")


def _tasks() -> list[Task]:
    built_in = [t for family in ("math", "knowledge", "code") for t in generate_tasks(family, 2, "eval", seed=5)]
    return built_in + [
        Task(id="general/anything", domain="general", prompt="Say something.",
             verifier={"name": "regex", "pattern": "(?s).+"}),
        Task(id="general/broken", domain="general", prompt="Say something.", verifier={"name": "regex", "pattern": "("}),
        Task(id="math/long", domain="math", prompt="Add these up: " + "1 + " * 150 + "1",
             verifier={"name": "math", "answer": "151"}),
    ]


def test_the_harness_gives_the_numbers_of_the_heldout_evaluation(bwrap: SandboxBackend, tmp_path: Path) -> None:
    loaded = load_model(ModelConfig(path="tiny", device="cpu", tiny=TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128, max_position=256)))
    # Freshly initialised weights are so small that greedy decoding writes newlines whatever the
    # prompt; larger random weights make each prompt's answer its own, so equal texts mean something.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in loaded.model.parameters():
            if parameter.dim() > 1:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    engine = EmbeddedEngine(loaded.model, loaded.tokenizer)
    tasks = _tasks()
    with Scorer(backend=bwrap) as scorer:
        heldout = evaluate_policy(engine, tasks, scorer.score_many, samples_per_task=SAMPLES, temperature=0.0,
                                  top_p=1.0, max_new_tokens=MAX_NEW_TOKENS, stop=[], seed=11)
        policy = LocalPolicy(engine, loaded.tokenizer, temperature=0.0)
        settings = EvalSettings(budgets=Budgets(max_new_tokens=MAX_NEW_TOKENS))
        try:
            run = run_eval(policy, tasks, tmp_path / "eval", bwrap, settings, epochs=SAMPLES,
                           score_many=scorer.score_many)
        finally:
            policy.close()
    summary = finish_eval(tmp_path / "eval", settings)

    by_task: dict[str, list[dict]] = {}
    for record in sorted(run.records, key=lambda r: r["epoch"]):
        by_task.setdefault(record["task_id"], []).append(record)
    for expected in heldout:
        records = by_task[expected["task_id"]]
        scored = [r for r in records if r["outcome"] not in ("infra_error", "verifier_error")]
        assert dict(Counter(r["outcome"] for r in records)) == expected["outcomes"], expected["task_id"]
        assert (sum(r["passed"] for r in scored), len(scored)) == (expected["passed"], expected["scored"])
        # The same text was generated: the answers heldout keeps are the harness's, epoch by epoch.
        texts = [json.loads((run.out / r["trace"]).read_text())["answer"] for r in records]
        assert texts[: len(expected["answers"])] == expected["answers"], expected["task_id"]

    # The mix covers the taxonomy, so equal numbers are not zeros matching zeros.
    seen = Counter(o for r in heldout for o in r["outcomes"])
    assert {"pass", "verifier_error", "context_exceeded"} <= set(seen)
    assert seen.keys() & {"fail", "format_error"}
    assert len({r["answers"][0] for r in heldout if r["answers"]}) >= 4  # prompts got answers of their own
    rates = pass_rates(heldout)
    for domain, entry in summary["domains"].items():
        assert entry["pass_rate"] == pytest.approx(rates[domain]["pass_rate"])
        assert entry["ci"] == pytest.approx([rates[domain]["ci_low"], rates[domain]["ci_high"]])
    assert summary["pass_rate"] == pytest.approx(rates["overall"]["pass_rate"])
    assert summary["ci"] == pytest.approx([rates["overall"]["ci_low"], rates["overall"]["ci_high"]])
