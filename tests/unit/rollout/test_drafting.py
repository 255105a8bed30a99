"""Drafters (rollout/drafting.py): the n-gram index proposes what followed the longest recent
match, the suffix automaton finds the longest earlier repeat (checked against brute force), the
corpus matcher drafts from earlier completions and stops at a document's end."""

from __future__ import annotations

import random

from tidal.rollout.drafting import NGramDrafter, SuffixAutomaton, SuffixDrafter


def test_ngram_proposes_what_followed() -> None:
    session = NGramDrafter(max_n=3, min_n=1).session([5, 6, 7, 8, 9, 5, 6, 7])
    assert session.propose(3) == [8, 9, 5]
    session.extend([8])
    assert session.propose(2) == [9, 5]


def test_ngram_prefers_the_longest_match_then_the_latest() -> None:
    # [1, 2] last occurred before 9; [2] alone last occurred before 7: the 2-gram wins.
    assert NGramDrafter(max_n=2, min_n=1).session([1, 2, 9, 3, 2, 7, 1, 2]).propose(1) == [9]
    # [4] occurred twice: the latest continuation (6, not 5) is proposed.
    assert NGramDrafter(max_n=2, min_n=1).session([4, 5, 4, 6, 4]).propose(1) == [6]
    assert NGramDrafter(max_n=3, min_n=2).session([1, 2, 3, 4]).propose(4) == []


def test_ngram_drafts_a_full_k_on_a_periodic_tail() -> None:
    """A repetitive sequence: the proposal runs past the copied span by copying itself."""
    session = NGramDrafter(max_n=4, min_n=2).session([1, 2, 3] * 3)
    assert session.propose(7) == [1, 2, 3, 1, 2, 3, 1]


def _brute_force_repeat(tokens: list[int]) -> int:
    """Length of the longest suffix that also occurs ending earlier."""
    best = 0
    for length in range(1, len(tokens)):
        suffix = tokens[-length:]
        if any(tokens[end - length : end] == suffix for end in range(length, len(tokens))):
            best = length
    return best


def test_suffix_automaton_finds_the_longest_repeat() -> None:
    rng = random.Random(0)
    for alphabet in (2, 3, 5):
        automaton = SuffixAutomaton()
        tokens: list[int] = []
        for _ in range(60):
            token = rng.randrange(alphabet)
            automaton.append(token)
            tokens.append(token)
            length, start = automaton.repeat()
            assert length == _brute_force_repeat(tokens)
            if length:  # `start` follows an earlier occurrence of the suffix
                assert start < len(tokens) and tokens[start - length : start] == tokens[-length:]


def test_suffix_matcher_follows_a_stream_through_a_corpus() -> None:
    rng = random.Random(1)
    corpus = [rng.randrange(3) for _ in range(40)]
    automaton = SuffixAutomaton()
    for token in corpus:
        automaton.append(token)
    text = "".join(map(str, corpus))
    state = matched = 0
    stream: list[int] = []
    for _ in range(50):
        token = rng.randrange(3)
        stream.append(token)
        state, matched = automaton.step(state, matched, token)
        longest = max(n for n in range(len(stream) + 1) if "".join(map(str, stream[len(stream) - n :])) in text)
        assert matched == longest
        if matched:
            end = automaton.first_end[state]
            assert corpus[end - matched + 1 : end + 1] == stream[-matched:]


def test_suffix_drafter_matches_beyond_a_fixed_n() -> None:
    """Two blocks share their last 4 tokens; only a match longer than 4 picks the right one."""
    block_a, block_b = [1, 9, 8, 7, 6, 2], [3, 9, 8, 7, 6, 4]
    prompt = block_a + block_b + [1, 9, 8, 7, 6]
    assert SuffixDrafter().session(prompt).propose(1) == [2]
    assert NGramDrafter(max_n=4).session(prompt).propose(1) == [4]  # the latest 4-gram


def test_suffix_drafter_drafts_from_the_corpus_up_to_a_document_end() -> None:
    drafter = SuffixDrafter(min_match=2, corpus=[[10, 11, 12, 13, 14]])
    assert drafter.session([1, 10, 11]).propose(5) == [12, 13, 14]
    assert drafter.session([1, 10]).propose(5) == []  # a match of 1 < min_match
    session = drafter.session([7, 20, 21])
    assert session.propose(2) == []
    drafter.finish([5], [20, 21, 22, 23])  # a finished completion joins the corpus (learn=True)
    assert session.propose(2) == [22, 23]
    session.extend([22])
    assert session.propose(3) == [23]


def test_suffix_drafter_prefers_the_longer_of_own_and_corpus() -> None:
    drafter = SuffixDrafter(min_match=1, corpus=[[5, 6, 7, 8]])
    assert drafter.session([6, 1, 5, 6, 7]).propose(1) == [8]  # corpus: 3 > own: 0 (7 is new)
    assert drafter.session([5, 6, 7, 9, 5, 6, 7]).propose(1) == [9]  # own 3 ties corpus 3

