"""The loop's per-domain state (pipeline/domains.py): sub-reward composition, normalisation,
curriculum admission through the mixer, dynamic-sampling trim, replay, alarms, adaptive weights,
and its JSON state across a resume. Text verifiers only: no sandbox needed."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tidal.config.schema import TidalConfig
from tidal.errors import CheckpointError
from tidal.gate import gate_episodes
from tidal.pipeline.domains import DomainRuntime, pad_examples
from tidal.reward.scorer import Scorer
from tidal.tasks.mixer import TaskMixer
from tidal.types import Completion, Episode, Task, regroup


def _task(domain: str, index: int, answer: str = "yes") -> Task:
    """A task of config domain `domain` (the task's own domain is `general` whatever the name)."""
    return Task(
        id=f"{domain}-{index}", domain="general", prompt=f"say {answer} ({index})",
        verifier={"name": "exact_match", "answer": answer}, reference=answer, metadata={"config_domain": domain},
    )


def _config(**domains: dict) -> TidalConfig:
    base = {"family": "general", "n_train": 10, "n_eval": 0}
    return TidalConfig.model_validate({
        "tasks": {"tasks_per_step": 2, "domains": {name: {**base, **extra} for name, extra in domains.items()}},
        "reward": {"sandbox": {"backend": "unsafe_local"}},
    })


def _episode(task: Task, group: str, k: int, text: str, prompt: list[int] | None = None) -> Episode:
    completion = Completion(prompt_ids=prompt or [1, 2], token_ids=[5, 6, 0], logprobs=[-0.1] * 3,
                            text=text, finish_reason="stop", weight_version=0)
    return Episode(id=f"{group}/s{k}", task_id=task.id, domain=task.domain, group_id=group, completion=completion)


def _scored(scorer: Scorer, tasks: dict[str, Task], episodes: list[Episode]) -> list[Episode]:
    for episode, score in zip(episodes, scorer.score_many([(tasks[e.task_id], e.completion.text) for e in episodes])):
        episode.score = score
    return episodes


def _runtime(cfg: TidalConfig, tasks: list[Task], base: list | None = None) -> DomainRuntime:
    by_domain: dict[str, list[Task]] = {}
    for task in tasks:
        by_domain.setdefault(task.metadata["config_domain"], []).append(task)
    mixer = TaskMixer(by_domain, {d: c.weight for d, c in cfg.tasks.domains.items()}, seed=0)
    return DomainRuntime(cfg, mixer, base)


def test_compose_sums_the_weighted_sub_rewards_and_gates_on_the_sum() -> None:
    cfg = _config(general={"verifiers": [{"name": "task", "weight": 0.8},
                                         {"name": "regex", "weight": 0.2, "args": {"pattern": "[a-z]+!"}}]})
    task = _task("general", 0)
    runtime = _runtime(cfg, [task])
    scorer = Scorer(cfg.reward)
    # Both answers are wrong for the task, but only one has the format: the group has signal.
    episodes = _scored(scorer, {task.id: task}, [_episode(task, "g0", 0, "no!"), _episode(task, "g0", 1, "NO")])
    runtime.compose(scorer, regroup(episodes, {task.id: task}))
    assert [e.reward for e in episodes] == [pytest.approx(0.2), pytest.approx(0.0)]
    assert episodes[0].score.components["reward/regex"] == 1.0 and episodes[0].score.components["reward/task"] == 0.0
    drops = gate_episodes(regroup(episodes, {task.id: task}), cfg.gate, cfg.rollout.max_new_tokens)
    assert drops["zero_variance"] == 0 and all(e.keep for e in episodes)


def test_a_sub_reward_that_cannot_be_scored_drops_the_sample_as_infra_error() -> None:
    cfg = _config(general={"verifiers": [{"name": "task", "weight": 1}, {"name": "regex", "weight": 1}]})  # no pattern
    task = _task("general", 0)
    runtime, scorer = _runtime(cfg, [task]), Scorer(cfg.reward)
    episodes = _scored(scorer, {task.id: task}, [_episode(task, "g0", 0, "yes"), _episode(task, "g0", 1, "no")])
    runtime.compose(scorer, regroup(episodes, {task.id: task}))
    assert all(math.isnan(e.reward) for e in episodes)
    drops = gate_episodes(regroup(episodes, {task.id: task}), cfg.gate, cfg.rollout.max_new_tokens)
    assert drops["infra_error"] == 2


def test_running_normaliser_puts_two_domains_on_one_scale() -> None:
    cfg = _config(a={"normaliser": {"kind": "running", "min_count": 1}}, b={"normaliser": {"kind": "running", "min_count": 1}})
    tasks = [_task("a", 0), _task("b", 0)]
    runtime = _runtime(cfg, tasks)
    episodes = []
    for task, scale in zip(tasks, (1.0, 100.0)):
        for k, value in enumerate((0.0, 1.0, 1.0, 0.0)):
            episode = _episode(task, f"g-{task.id}", k, "x")
            episode.score = Scorer(cfg.reward).score(task, "yes")
            episode.reward = value * scale
            episodes.append(episode)
    runtime.normalise(episodes)
    # Mean 0.5 (50), population std 0.5 (50): both domains become -1, 1, 1, -1.
    for episode, expected in zip(episodes, [-1, 1, 1, -1] * 2):
        assert episode.reward == pytest.approx(expected, abs=1e-4)


def test_curriculum_keeps_suspects_out_and_the_auditor_decides() -> None:
    curriculum = {"min_observations": 2, "suspect_after": 4, "retire_after": 4, "band_start": [0.2, 0.8], "band_end": [0.2, 0.8]}
    cfg = _config(general={"curriculum": curriculum})
    tasks = [_task("general", i) for i in range(3)]
    runtime = _runtime(cfg, tasks)
    scorer = Scorer(cfg.reward)
    by_id = {t.id: t for t in tasks}
    answers = {"general-0": ["no"] * 4, "general-1": ["yes"] * 4, "general-2": ["yes", "no", "yes", "no"]}
    episodes = []
    for index, (task_id, texts) in enumerate(answers.items()):
        episodes += [_episode(by_id[task_id], f"g{index}", k, text) for k, text in enumerate(texts)]
    _scored(scorer, by_id, episodes)
    gate_episodes(regroup(episodes, by_id), cfg.gate, cfg.rollout.max_new_tokens)
    audited: list[str] = []
    runtime.auditor = lambda task_id: audited.append(task_id) or "broken"
    decided = runtime.observe(regroup(episodes, by_id), step=0)
    assert decided == [("general-0", "broken")] and audited == ["general-0"]
    assert runtime.mixer.excluded == {"general-0"}
    # Two of three groups had zero variance.
    assert runtime.zero_variance_rate == pytest.approx(0.3 * 2 / 3)
    # The retired task and the broken one are never drawn again; the middling one is.
    drawn = {t.id for t in runtime.mixer.sample(6, step=1)}
    assert drawn == {"general-2"}


def test_dynamic_sampling_draws_more_and_trims_to_tasks_per_step() -> None:
    cfg = _config(general={})
    cfg.tasks.oversample = 4.0
    tasks = [_task("general", i) for i in range(4)]
    runtime = _runtime(cfg, tasks)
    assert runtime.tasks_to_draw() == 2  # no zero-variance groups seen yet
    runtime.zero_variance_rate = 0.5
    assert runtime.tasks_to_draw() == 4  # 2 / (1 - 0.5)
    episodes = [_episode(tasks[g], f"g{g}", k, "x") for g in range(3) for k in range(2)]
    episodes[0].keep, episodes[1].keep = False, False  # group 0 was dropped by the gate
    assert runtime.trim(regroup(episodes, {t.id: t for t in tasks})) == 0
    episodes[0].keep = episodes[1].keep = True
    assert runtime.trim(regroup(episodes, {t.id: t for t in tasks})) == 2
    assert [e.drop_reason for e in episodes[4:]] == ["surplus", "surplus"]


def test_replay_from_base_and_from_trajectories() -> None:
    base = [([1, 2], [3, 4]), ([1], [5])]
    cfg = _config(general={})
    cfg = cfg.model_copy(update={"replay": cfg.replay.model_copy(update={"source": "base", "batch_size": 3}),
                                 "algorithm": cfg.algorithm.model_copy(update={"replay_weight": 0.5})})
    runtime = _runtime(cfg, [_task("general", 0)], base)
    batch = runtime.replay_batch(pad_id=0)
    assert batch is not None and batch.input_ids.shape[0] == 3
    masks = {(1, 2, 3, 4): [0, 0, 1, 1], (1, 5): [0, 1]}  # sequence -> its loss mask
    for row in range(3):
        length = int(batch.attention_mask[row].sum())
        assert masks[tuple(batch.input_ids[row, :length].tolist())] == batch.loss_mask[row, :length].tolist()
    again = _runtime(cfg, [_task("general", 0)], base).replay_batch(pad_id=0)
    assert torch.equal(again.input_ids, batch.input_ids)  # seeded by (run seed, draw)

    cfg = cfg.model_copy(update={"replay": cfg.replay.model_copy(update={"source": "trajectories", "min_reward": 1.0})})
    task = _task("general", 0)
    runtime = _runtime(cfg, [task])
    assert runtime.replay_batch(pad_id=0) is None  # nothing good seen yet
    episodes = _scored(Scorer(cfg.reward), {task.id: task}, [_episode(task, "g", 0, "yes", [7]), _episode(task, "g", 1, "no", [8])])
    runtime.remember(episodes)
    assert list(runtime.buffer) == [([7], [5, 6, 0])]
    assert runtime.replay_batch(pad_id=0).input_ids[0].tolist() == [7, 5, 6, 0]


def test_pad_examples_masks_only_the_answer() -> None:
    batch = pad_examples([([1, 2, 3], [4]), ([1], [2, 3])], pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4], [1, 2, 3, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert torch.equal(batch.loss_mask, torch.tensor([[0.0, 0, 0, 1], [0, 1, 1, 0]]))


def test_alarm_and_adaptive_weights_follow_heldout() -> None:
    cfg = _config(a={"weight": 1}, b={"weight": 1})
    cfg.eval.every = 1
    cfg.tasks.adaptive_weights = cfg.tasks.adaptive_weights.model_copy(update={"enabled": True, "window": 2, "eta": 50})
    runtime = _runtime(cfg, [_task("a", 0), _task("b", 0)])
    alarms, changes = runtime.heldout(1, {"a": 0.5, "b": 0.5}, before={"a": 0.5, "b": 0.7})
    assert [a["domain"] for a in alarms] == ["b"] and changes == []
    alarms, changes = runtime.heldout(2, {"a": 0.8, "b": 0.5}, before={"a": 0.5, "b": 0.7})
    assert changes and runtime.mixer.weights["a"] > runtime.mixer.weights["b"]
    assert sum(runtime.mixer.weights.values()) == pytest.approx(1.0)


def test_state_survives_a_json_round_trip_and_rejects_another_config() -> None:
    curriculum = {"min_observations": 1, "suspect_after": 8, "retire_after": 8}
    cfg = _config(general={"normaliser": {"kind": "running"}, "curriculum": curriculum})
    tasks = [_task("general", i) for i in range(2)]
    by_id = {t.id: t for t in tasks}
    scorer = Scorer(cfg.reward)

    def batch(step: int) -> list[Episode]:
        texts = ["yes", "no", "no", "yes"] if step % 2 else ["yes", "yes", "no", "no"]
        episodes = _scored(scorer, by_id, [_episode(tasks[step % 2], f"s{step}", k, t) for k, t in enumerate(texts)])
        gate_episodes(regroup(episodes, by_id), cfg.gate, cfg.rollout.max_new_tokens)
        return episodes

    first, second = _runtime(cfg, tasks), _runtime(cfg, tasks)
    for step in range(3):
        for runtime in (first, second):
            episodes = batch(step)
            runtime.observe(regroup(episodes, by_id), step)
            runtime.normalise(episodes)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for runtime in (first, second):
        episodes = batch(3)
        runtime.observe(regroup(episodes, by_id), 3)
        runtime.normalise(episodes)
        runtime.rewards = [e.reward for e in episodes]
    assert first.rewards == second.rewards
    assert first.state_dict() == second.state_dict()

    other = _runtime(_config(general={"normaliser": {"kind": "running"}}), tasks)
    with pytest.raises(CheckpointError):
        other.load_state_dict(first.state_dict())


def test_sampled_vs_trained_distributions() -> None:
    from tidal.pipeline.stages import distribution_metrics

    task = _task("general", 0)
    episodes = [_episode(task, "g", k, "x") for k in range(4)]
    for k, episode in enumerate(episodes):
        episode.completion.token_ids = [1] * (k + 1)  # lengths 1, 2, 3, 4
        episode.difficulty = float(k % 2 + 1)  # 1, 2, 1, 2
    episodes[3].keep = episodes[1].keep = False  # the long, hard ones are dropped
    metrics = distribution_metrics(episodes)
    assert metrics["sampled/length_mean"] == 2.5 and metrics["trained/length_mean"] == 2.0
    assert metrics["sampled/difficulty_mean"] == 1.5 and metrics["trained/difficulty_mean"] == 1.0
    assert metrics["sampled/length_p90"] == 4 and metrics["trained/length_p90"] == 3


def test_soft_overlong_penalty_ramps_over_the_buffer() -> None:
    cfg = TidalConfig.model_validate({
        "tasks": {"tasks_per_step": 2, "domains": {"general": {"family": "general", "n_train": 10, "n_eval": 0}}},
        "reward": {"sandbox": {"backend": "unsafe_local"}, "overlong_buffer": 4, "overlong_penalty": 0.5},
        "rollout": {"max_new_tokens": 10},
    })
    task = _task("general", 0)
    runtime, scorer = _runtime(cfg, [task]), Scorer(cfg.reward)
    episodes = [_episode(task, "g", k, "yes") for k in range(4)]
    for episode, length in zip(episodes, (6, 7, 9, 10)):  # free up to 10 - 4 = 6 tokens, -0.5 at 10
        episode.completion.token_ids = [5] * length
        episode.completion.logprobs = [-0.1] * length
    _scored(scorer, {task.id: task}, episodes)
    groups = regroup(episodes, {task.id: task})
    runtime.compose(scorer, groups)
    assert [e.reward for e in episodes] == [None, pytest.approx(1 - 0.125), pytest.approx(1 - 0.375), pytest.approx(0.5)]
    assert episodes[3].score.components["reward/overlong"] == pytest.approx(-0.5)
    counts = gate_episodes(groups, cfg.gate, cfg.rollout.max_new_tokens)
    assert counts["zero_variance"] == 0  # the penalty gives an all-correct group a signal toward shorter answers


def test_a_domain_prompt_leads_single_questions_only() -> None:
    from tidal.pipeline.run import with_domain_prompt

    task = _task("general", 0)
    posed = with_domain_prompt(task, "mine", "Answer briefly.", [("say no", "Answer: no")])
    assert [(m["role"], m["content"]) for m in posed.messages()] == [
        ("system", "Answer briefly."), ("user", "say no"), ("assistant", "Answer: no"), ("user", task.prompt)]
    assert posed.metadata["config_domain"] == "mine" and posed.id == task.id
    chat = task.model_copy(update={"prompt": [{"role": "system", "content": "own"}, {"role": "user", "content": "q"}]})
    assert with_domain_prompt(Task.model_validate(chat.model_dump()), "mine", "Answer briefly.").messages()[0]["content"] == "own"
    assert with_domain_prompt(task, "mine").prompt == task.prompt  # nothing to add
