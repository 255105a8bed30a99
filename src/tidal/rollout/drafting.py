"""Drafters for speculative decoding (rollout/speculative_batch.py): who proposes the k tokens.

- `NGramDrafter`: prompt lookup. The longest recent suffix of the sequence (n = max_n .. min_n
  tokens) that occurred earlier in prompt + output proposes the tokens that followed it. A hash
  index from each n-gram to its latest continuation is updated as tokens arrive: O(max_n) per token.
- `SuffixDrafter`: the longest suffix of any length that occurred earlier, in the sequence itself
  or in a corpus of earlier outputs (a GRPO group's other samples, earlier steps' outputs for the
  same prompt), found through suffix automata: the sequence's own, extended by each token, and the
  corpus's, walked by a matcher that follows each new token. Both cost amortised O(1) per token.

Both are deterministic (the draft distribution q is a point mass at the proposal: the acceptance
rule relies on it). They propose past the end of what they copy from by copying their own
proposal, so a periodic tail drafts a full k.
"""

from __future__ import annotations

from typing import Protocol


class DraftSession(Protocol):
    """One sequence's drafting state, from its prompt on."""

    def propose(self, k: int) -> list[int]:
        """Up to `k` tokens to follow the sequence so far (fewer or none where nothing fits)."""
        ...

    def extend(self, tokens: list[int]) -> None:
        """The tokens the sequence grew by this round (kept drafts, then the sampled token)."""
        ...


class Drafter(Protocol):
    """Makes one session per sequence; `finish` sees each finished completion (a corpus may learn it)."""

    def session(self, prompt: list[int]) -> DraftSession: ...

    def finish(self, prompt: list[int], completion: list[int]) -> None: ...


def _copy(source: list[int], start: int, k: int, own: list[int] | None = None) -> list[int]:
    """k tokens of `source` from `start`; when `own` is the sequence being drafted (source is own),
    tokens past its end are the proposal's own earlier tokens (so "abcab" + "c..." keeps going)."""
    proposal: list[int] = []
    for offset in range(k):
        index = start + offset
        if index < len(source):
            token = source[index]
        elif own is not None:
            token = proposal[index - len(source)]
        else:
            break
        if token < 0:  # a document separator of the corpus
            break
        proposal.append(token)
    return proposal


# --------------------------------------------------------------------------- n-gram lookup


class NGramDrafter:
    """Prompt-lookup drafting (vLLM's "ngram" method), with an incremental index."""

    def __init__(self, max_n: int = 4, min_n: int = 2) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n

    def session(self, prompt: list[int]) -> _NGramSession:
        return _NGramSession(self.max_n, self.min_n, prompt)

    def finish(self, prompt: list[int], completion: list[int]) -> None:
        pass


class _NGramSession:
    def __init__(self, max_n: int, min_n: int, prompt: list[int]) -> None:
        self.max_n, self.min_n = max_n, min_n
        self.tokens: list[int] = []
        # n-gram (a tuple; lengths differ, so one dict holds all n) -> where its latest continuation starts
        self.index: dict[tuple[int, ...], int] = {}
        self.extend(prompt)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            end = len(self.tokens)  # the n-grams ending just before `token` now have a continuation
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.index[tuple(self.tokens[end - n : end])] = end
            self.tokens.append(token)

    def propose(self, k: int) -> list[int]:
        length = len(self.tokens)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            start = self.index.get(tuple(self.tokens[length - n :]))
            if start is not None:
                return _copy(self.tokens, start, k, own=self.tokens)
        return []


# --------------------------------------------------------------------------- suffix index


class SuffixAutomaton:
    """The suffix automaton of a token list, extended one token at a time (amortised O(1)).

    State s stands for a set of substrings sharing their end positions; `length[s]` is the longest,
    `link[s]` the state of its longest suffix that ends at more positions, and `first_end[s]` the end
    index of its first occurrence (Blumer et al. 1985; the construction is the standard online one).
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [-1]
        self.last = 0

    def _new_state(self, length: int, first_end: int, transitions: dict[int, int], link: int) -> int:
        self.next.append(transitions)
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.length) - 1

    def append(self, token: int) -> None:
        position = len(self.tokens)
        self.tokens.append(token)
        current = self._new_state(self.length[self.last] + 1, position, {}, 0)
        state = self.last
        while state != -1 and token not in self.next[state]:
            self.next[state][token] = current
            state = self.link[state]
        if state != -1:
            target = self.next[state][token]
            if self.length[state] + 1 == self.length[target]:
                self.link[current] = target
            else:
                clone = self._new_state(
                    self.length[state] + 1, self.first_end[target], dict(self.next[target]), self.link[target]
                )
                while state != -1 and self.next[state].get(token) == target:
                    self.next[state][token] = clone
                    state = self.link[state]
                self.link[target] = self.link[current] = clone
        self.last = current

    def repeat(self) -> tuple[int, int]:
        """(length, start of what followed its first occurrence) of the longest suffix of the tokens
        that also occurs earlier; (0, -1) when none does."""
        state = self.link[self.last]
        if state <= 0:
            return 0, -1
        return self.length[state], self.first_end[state] + 1

    def step(self, state: int, matched: int, token: int) -> tuple[int, int]:
        """A matcher's move: (state, length) of the longest suffix of a stream found in the tokens,
        after `token` joins the stream."""
        while state and token not in self.next[state]:
            state = self.link[state]
            matched = self.length[state]
        if token in self.next[state]:
            return self.next[state][token], matched + 1
        return 0, 0


class SuffixDrafter:
    """Longest-match drafting over the sequence and a corpus of earlier completions.

    `add(tokens)` puts a document in the corpus (between generations); with `learn=True` every
    finished completion is added (a GRPO group's later samples draft from its earlier ones).
    Matches shorter than `min_match` propose nothing; the longer of the sequence's own match and
    the corpus's wins, the sequence's on a tie.
    """

    def __init__(self, min_match: int = 2, corpus: list[list[int]] | None = None, learn: bool = True) -> None:
        if min_match < 1:
            raise ValueError(f"min_match={min_match} must be >= 1")
        self.min_match = min_match
        self.learn = learn
        self.corpus = SuffixAutomaton()
        self.documents = 0
        for document in corpus or []:
            self.add(document)

    def add(self, tokens: list[int]) -> None:
        """One more document; a distinct negative separator keeps matches inside documents."""
        self.documents += 1
        for token in tokens:
            self.corpus.append(token)
        self.corpus.append(-self.documents)

    def session(self, prompt: list[int]) -> _SuffixSession:
        return _SuffixSession(self, prompt)

    def finish(self, prompt: list[int], completion: list[int]) -> None:
        if self.learn and completion:
            self.add(prompt + completion)


class _SuffixSession:
    def __init__(self, drafter: SuffixDrafter, prompt: list[int]) -> None:
        self.drafter = drafter
        self.own = SuffixAutomaton()
        self.state = self.matched = 0  # the corpus matcher
        self.documents = drafter.documents
        self.extend(prompt)

    def extend(self, tokens: list[int]) -> None:
        corpus = self.drafter.corpus
        for token in tokens:
            self.own.append(token)
            self.state, self.matched = corpus.step(self.state, self.matched, token)

    def propose(self, k: int) -> list[int]:
        if self.documents != self.drafter.documents:
            # The corpus grew since this session began: its states may have split; match afresh.
            self.documents = self.drafter.documents
            self.state = self.matched = 0
            for token in self.own.tokens:
                self.state, self.matched = self.drafter.corpus.step(self.state, self.matched, token)
        own_length, own_start = self.own.repeat()
        if max(own_length, self.matched) < self.drafter.min_match:
            return []
        if own_length >= self.matched:
            return _copy(self.own.tokens, own_start, k, own=self.own.tokens)
        corpus = self.drafter.corpus
        return _copy(corpus.tokens, corpus.first_end[self.state] + 1, k)
