"""Near-duplicates across splits that the shingle keys miss: short prompts with a few words
changed, and code tasks that are one problem under two wordings.

A prompt of a dozen words has a handful of word 3-grams and four or five content words, so one
changed word breaks most of the near key (duplicates.py) and leaves too few shared content words
for the paraphrase key, which asks a short answer to share `paraphrase.WEAK_SHARED` of them (`What
is 12 times 7?` / `Compute 12 times 7.`: 3). Here two prompts of at most `SHORT_WORDS` words each,
from different splits, with the same solution and the same numbers in the same order, are a
near-duplicate when

- their similarity is at least `SHORT_SIMILARITY`: the largest of the Jaccard similarity of their
  words (stemmed, function words kept), of their character 3-grams, and of how much of the smaller
  set of content words the other holds (containment: words added around the same question);
- and, when the only solution they share is a short answer (`paraphrase.WEAK_CHARS`), no content
  word was *replaced*: one prompt's content words hold the other's, words that only phrase the
  question (`PHRASING`: how *many*, *count*, *compute*) aside. A short answer is shared by
  chance (`first letter of log` / `first letter of lion`, both `l`); a restatement keeps the
  operands and changes the phrasing around them.

For code, a pair is the same problem whatever the prompts say when the answers must define the same
functions (the names the reference defines and the tests import) and the tests hold the same
assertions' constants (at least `MIN_ASSERTIONS`): `clamp01(-2) == 0`, `clamp01(0.5) == 0.5`.

Solutions index the entries, so a task is compared only with the earlier tasks of the same
solution (a few per key in a templated family); a short prompt keeps its normalised text, numbers
and content words, a few hundred bytes.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field

from tidal.audit.code import callable_names
from tidal.audit.paraphrase import (
    WEAK,
    assertion_constants,
    content_words,
    numbers,
    stem,
)
from tidal.types import Task

# Words that phrase a question rather than pose it: a restatement may swap them freely.
PHRASING = frozenset({"many", "much", "count", "compute", "calculate", "determine", "evaluate", "figure", "work",
                      "out", "answer", "state", "say", "show", "solve", "express", "result", "value", "tell", "find"})
SHORT_WORDS = 12  # a prompt with more words is left to the shingle and paraphrase keys
SHORT_SIMILARITY = 0.6
MIN_ASSERTIONS = 2
CHAR_GRAM = 3
WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class ShortMatch:
    kind: str  # short | tests
    other_id: str
    other_split: str
    similarity: float


@dataclass(frozen=True)
class _Entry:
    """What a short prompt keeps: its normalised text (words and 3-grams are made from it for the
    few candidates that share its solution and numbers), numbers and content words."""

    task_id: str
    split: str
    text: str
    numbers: tuple[str, ...]
    content: frozenset[str]


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def _grams(text: str) -> frozenset[str]:
    return frozenset(text[i:i + CHAR_GRAM] for i in range(max(len(text) - CHAR_GRAM + 1, 1)))


def _words(text: str) -> frozenset[str]:
    return frozenset(stem(w) for w in WORD.findall(text))


def similarity(a: _Entry, b: _Entry) -> float:
    """The largest of word, character 3-gram and content-word containment similarity."""
    smaller = min(len(a.content), len(b.content))
    containment = len(a.content & b.content) / smaller if smaller >= 2 else 0.0
    return max(_jaccard(_words(a.text), _words(b.text)), _jaccard(_grams(a.text), _grams(b.text)), containment)


def code_key(task: Task) -> str | None:
    """The functions an answer must define and the tests' assertion constants, hashed; None when
    the task has fewer than `MIN_ASSERTIONS` assertions with constants or no named function."""
    names = callable_names(task)
    asserted = assertion_constants(task)
    if not names or len(asserted) < MIN_ASSERTIONS:
        return None
    return hashlib.sha256(repr((sorted(names), sorted(asserted))).encode()).hexdigest()[:32]


@dataclass
class ShortPromptIndex:
    """Short prompts by solution key and code tasks by `code_key`; `match` then `add`, in input order."""

    threshold: float = SHORT_SIMILARITY
    by_solution: dict[str, list[_Entry]] = field(default_factory=lambda: defaultdict(list))
    code: dict[str, list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))

    def entry(self, task: Task, prompt: str) -> _Entry | None:
        words = WORD.findall(unicodedata.normalize("NFKC", prompt).casefold())
        if len(words) > SHORT_WORDS:
            return None
        return _Entry(task.id, task.split, " ".join(words), numbers(prompt), frozenset(content_words(prompt)))

    def match(self, task: Task, prompt: str, keys: frozenset[str]) -> ShortMatch | None:
        """The most similar earlier task of another split that this one restates, if any."""
        key = code_key(task)
        for other_id, other_split in self.code.get(key, []) if key else []:
            if other_split != task.split:
                return ShortMatch("tests", other_id, other_split, 1.0)
        mine = self.entry(task, prompt)
        if mine is None:
            return None
        best: ShortMatch | None = None
        for solution in keys:
            weak = solution.startswith(WEAK)
            for other in self.by_solution.get(solution.removeprefix(WEAK), []):
                if other.split == task.split or other.numbers != mine.numbers:
                    continue
                if weak and (mine.content - other.content - PHRASING) and (other.content - mine.content - PHRASING):
                    continue  # an operand replaced: another question with the same short answer
                score = similarity(mine, other)
                if score >= self.threshold and (best is None or score > best.similarity):
                    best = ShortMatch("short", other.task_id, other.split, score)
        return best

    def add(self, task: Task, prompt: str, keys: frozenset[str]) -> None:
        key = code_key(task)
        if key:
            self.code[key].append((task.id, task.split))
        mine = self.entry(task, prompt)
        if mine is not None:
            for solution in keys:
                self.by_solution[solution.removeprefix(WEAK)].append(mine)
