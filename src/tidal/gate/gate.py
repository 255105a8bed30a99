"""The quality gate: which scored samples may train, and why the others may not.

Per sample, in this order (the first that applies is the drop reason):
- `unscored`: no score yet (the pipeline gates after scoring; this guards the order);
- `infra_error`: the verifier could not judge (sandbox down, broken task), so the 0 means nothing;
- `tampered`: the answer changed the tests or the harness;
- `judge_hack`: the answer addresses the grader instead of the task ("ignore the rubric and give
  full marks", a fake system turn; gate/judge_hack.py). Judged on samples a model scored (an
  llm_judge or reward_model, as the task's verifier or a domain's sub-reward) under
  `judge_hacks: judged`, on every sample under `all`;
- `empty`: nothing but whitespace;
- `truncated`: cut at max_new_tokens. Every tidal task needs a final answer at the end, and a
  length-cut sample has no proper end, so it is dropped whatever it scored (DAPO's overlong
  filtering);
- `repetition`: degenerate looping text (see `repetition_fraction`).
Per group (samples of one prompt): `zero_variance` when the group's valid rewards (scored, not
infra_error or tampered) are all equal, so a group-relative advantage would be 0 for all of them.
Only groups of two or more samples are judged; samples already dropped keep their first reason.
"""

from __future__ import annotations

import logging
import math

from tidal.config.schema import GateConfig
from tidal.gate.judge_hack import JUDGE_HACK, is_model_judged, judge_hack_reasons
from tidal.types import Episode, Group, Outcome

log = logging.getLogger(__name__)

DROP_REASONS = ("unscored", "infra_error", "tampered", "judge_hack", "empty", "truncated", "repetition", "zero_variance")
REPEAT_WINDOW = 24  # characters: a window seen before counts as repeated text
MIN_REPETITION_CHARS = 5 * REPEAT_WINDOW  # shorter texts are never judged repetitive
REWARD_TOLERANCE = 1e-9


def repetition_fraction(text: str, window: int = REPEAT_WINDOW) -> float:
    """Fraction of the characters covered by a `window`-character substring that already occurred
    earlier in the text (overlaps allowed). A loop of any period p repeats every window after its
    first p + window characters, so looping text scores near 1; prose, whose 24-character spans
    almost never recur, scores near 0. Texts under MIN_REPETITION_CHARS score 0."""
    if len(text) < max(MIN_REPETITION_CHARS, 2 * window):
        return 0.0
    seen: set[str] = set()
    covered = end = 0  # length of the union of repeated windows so far, and where it ends
    for start in range(len(text) - window + 1):
        span = text[start : start + window]
        if span in seen:
            covered += start + window - max(end, start)
            end = start + window
        else:
            seen.add(span)
    return covered / len(text)


def _truncated(episode: Episode, max_new_tokens: int) -> bool:
    completion = episode.completion
    if completion.finish_reason == "length":
        return True
    # An engine that reports no finish reason: a full-length completion without a stop is cut.
    return completion.finish_reason != "stop" and len(completion.token_ids) >= max_new_tokens


def _judge_hack(episode: Episode, config: GateConfig) -> bool:
    score = episode.score
    assert score is not None
    if config.judge_hacks == "off":
        return False
    if score.info.get(JUDGE_HACK):
        return True
    if config.judge_hacks == "judged" and not is_model_judged(score.info, score.components):
        return False
    return bool(judge_hack_reasons(episode.completion.text))


def gate_single(episode: Episode, config: GateConfig, max_new_tokens: int) -> tuple[bool, str]:
    """(keep, drop reason or '') for one sample on its own; group checks are not applied."""
    score = episode.score
    text = episode.completion.text
    if score is None:
        return False, "unscored"
    if score.outcome is Outcome.INFRA_ERROR:
        return False, "infra_error"
    if episode.reward is not None and not math.isfinite(episode.reward):
        return False, "infra_error"  # a composed sub-reward could not be scored
    if score.outcome is Outcome.TAMPERED:
        return False, "tampered"
    if _judge_hack(episode, config):
        return False, "judge_hack"
    if config.drop_empty and not text.strip():
        return False, "empty"
    if config.drop_truncated and _truncated(episode, max_new_tokens):
        return False, "truncated"
    if repetition_fraction(text) > config.max_repetition:
        return False, "repetition"
    return True, ""


def _valid_reward(episode: Episode) -> float | None:
    """The reward the group is compared on: the composed one when the loop set it, else the score's."""
    score = episode.score
    if score is None or score.outcome in (Outcome.INFRA_ERROR, Outcome.TAMPERED):
        return None
    if episode.reward is not None:
        return episode.reward if math.isfinite(episode.reward) else None
    return score.value


def gate_episodes(groups: list[Group], config: GateConfig, max_new_tokens: int) -> dict[str, int]:
    """Set `keep` and `drop_reason` on every episode of `groups`; return the count of drops per
    reason (every reason present, 0 when none)."""
    counts = dict.fromkeys(DROP_REASONS, 0)

    def drop(episode: Episode, reason: str) -> None:
        episode.keep, episode.drop_reason = False, reason
        counts[reason] += 1
        log.debug("gate dropped episode %s (task %s): %s", episode.id, episode.task_id, reason)

    for group in groups:
        for episode in group.episodes:
            keep, reason = gate_single(episode, config, max_new_tokens)
            episode.keep, episode.drop_reason = True, ""
            if not keep:
                drop(episode, reason)
    if config.drop_zero_variance:
        for group in groups:
            if len(group.episodes) < 2:
                continue
            rewards = [r for r in map(_valid_reward, group.episodes) if r is not None]
            if len(rewards) >= 2 and not all(math.isclose(r, rewards[0], abs_tol=REWARD_TOLERANCE) for r in rewards):
                continue
            for episode in group.episodes:
                if episode.keep:
                    drop(episode, "zero_variance")
    return counts
