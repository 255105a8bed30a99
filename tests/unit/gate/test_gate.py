"""The quality gate: every drop reason, and the texts that must not be mistaken for degenerate."""

from __future__ import annotations

import logging

import pytest

from tidal.config.schema import GateConfig
from tidal.gate import DROP_REASONS, gate_episodes, gate_single, repetition_fraction
from tidal.types import Completion, Episode, FinishReason, Outcome, Score, Task, regroup

PROSE = (
    "The function walks the list once, adds every even number to a running total and returns it. "
    "Odd numbers are skipped. An empty list gives zero because the total starts at zero. Negative "
    "even numbers count too, since -2 % 2 == 0 in Python."
)


TASKS = {"t": Task(id="t", domain="code", prompt="p", verifier={"name": "python_tests"})}


def episode(
    text: str = PROSE,
    reward: float | None = 1.0,
    outcome: Outcome = Outcome.PASSED,
    finish: FinishReason = "stop",
    group: str = "g",
    tokens: int = 10,
    index: int = 0,
) -> Episode:
    score = None if reward is None else Score(reward, outcome)
    completion = Completion(prompt_ids=[1], token_ids=list(range(tokens)), logprobs=[0.0] * tokens, text=text,
                            finish_reason=finish, weight_version=0)
    return Episode(id=f"e{index}", task_id="t", domain="code", group_id=group, completion=completion, score=score)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"reward": None}, "unscored"),
        ({"reward": 0.0, "outcome": Outcome.INFRA_ERROR}, "infra_error"),
        ({"reward": 0.0, "outcome": Outcome.TAMPERED}, "tampered"),
        ({"text": "  \n "}, "empty"),
        ({"finish": "length"}, "truncated"),
        ({"text": "I will now repeat myself. " * 40}, "repetition"),
    ],
)
def test_single_sample_reasons(kwargs: dict, reason: str) -> None:
    assert gate_single(episode(**kwargs), GateConfig(), max_new_tokens=64) == (False, reason)


def test_a_good_sample_is_kept() -> None:
    assert gate_single(episode(), GateConfig(), max_new_tokens=64) == (True, "")


def test_switches_turn_checks_off() -> None:
    config = GateConfig(drop_empty=False, drop_truncated=False)
    assert gate_single(episode(text=" "), config, 64) == (True, "")
    assert gate_single(episode(finish="length"), config, 64) == (True, "")


@pytest.mark.parametrize(
    "text",
    ["1 2 3", "hi,hi,hi", "ha" * 30, "42", "0, 0, 0, 0", PROSE,
     "def f(x):\n    return x + 1\n\ndef g(x):\n    return f(x) * 2\n\nprint(g(3))\n",
     "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]"],
)
def test_short_or_legit_text_is_not_repetition(text: str) -> None:
    assert repetition_fraction(text) <= GateConfig().max_repetition


@pytest.mark.parametrize(
    "text",
    ["the the the " * 30, "abc" * 200, PROSE + " Wait, let me check again." * 20, "\n".join(["print(1)"] * 60)],
)
def test_looping_text_is_repetition(text: str) -> None:
    assert repetition_fraction(text) > GateConfig().max_repetition


def test_zero_variance_groups_are_dropped() -> None:
    same = [episode(reward=1.0, group="same", index=i) for i in range(4)]
    mixed = [episode(reward=float(i % 2), outcome=Outcome.PASSED if i % 2 else Outcome.FAILED, group="mixed", index=10 + i)
             for i in range(4)]
    counts = gate_episodes(regroup(same + mixed, TASKS), GateConfig(), max_new_tokens=64)
    assert [e.keep for e in same] == [False] * 4 and {e.drop_reason for e in same} == {"zero_variance"}
    assert all(e.keep and e.drop_reason == "" for e in mixed)
    assert counts["zero_variance"] == 4 and set(counts) == set(DROP_REASONS)


def test_variance_counts_only_valid_scores() -> None:
    group = [
        episode(reward=1.0, index=0),
        episode(reward=1.0, index=1),
        episode(reward=0.0, outcome=Outcome.INFRA_ERROR, index=2),  # its 0 is not a reward
        episode(reward=0.0, outcome=Outcome.TAMPERED, index=3),
    ]
    counts = gate_episodes(regroup(group, TASKS), GateConfig(), max_new_tokens=64)
    assert [e.drop_reason for e in group] == ["zero_variance", "zero_variance", "infra_error", "tampered"]
    assert counts == {**dict.fromkeys(DROP_REASONS, 0), "zero_variance": 2, "infra_error": 1, "tampered": 1}


def test_a_truncated_zero_still_gives_its_group_variance() -> None:
    group = [episode(reward=1.0, index=0), episode(reward=0.0, outcome=Outcome.FAILED, finish="length", index=1)]
    gate_episodes(regroup(group, TASKS), GateConfig(), max_new_tokens=64)
    assert (group[0].keep, group[1].drop_reason) == (True, "truncated")


def test_single_sample_groups_are_not_judged_and_the_switch_works() -> None:
    alone = [episode(group="solo")]
    assert gate_episodes(regroup(alone, TASKS), GateConfig(), 64)["zero_variance"] == 0 and alone[0].keep
    pair = [episode(index=0), episode(index=1)]
    gate_episodes(regroup(pair, TASKS), GateConfig(drop_zero_variance=False), 64)
    assert all(e.keep for e in pair)


def test_gating_again_resets_the_verdict() -> None:
    sample = episode(text=" ")
    gate_episodes(regroup([sample], TASKS), GateConfig(), 64)
    assert sample.drop_reason == "empty"
    sample.completion.text = PROSE
    gate_episodes(regroup([sample], TASKS), GateConfig(), 64)
    assert sample.keep and sample.drop_reason == ""


def test_every_drop_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="tidal.gate"):
        gate_episodes(regroup([episode(text="", index=0), episode(finish="length", index=1)], TASKS), GateConfig(), 64)
    messages = [r.getMessage() for r in caplog.records]
    assert any("e0" in m and "empty" in m for m in messages)
    assert any("e1" in m and "truncated" in m for m in messages)
