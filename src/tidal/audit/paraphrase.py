"""Paraphrased near-duplicates across splits: an eval task reworded into the train split (or the
other way round) contaminates the held-out rate even though no sentence is shared.

The near-duplicate key of duplicates.py (word 3-grams, Jaccard 0.8) finds copies with a word or
two changed; a paraphrase shares the content words, not the phrasing. So here a prompt becomes its
set of content words: NFKC, case folded, punctuation dropped, numbers in one canonical form
(`1,000` and `1000.0` are `1000`), function words left out (`STOPWORDS`), and a light suffix
stemming (`flows`, `flowing`, `flowed` are `flow`). Its MinHash signature (`PERMUTATIONS`
blake2b-hashed words, multiply-shift permutations) is indexed by LSH in `BANDS` bands of
`ROWS` rows, so pairs with an estimated Jaccard similarity near 0.3 and above become candidates
without comparing all pairs (the probability that a pair at similarity s is a candidate is
1 - (1 - s^ROWS)^BANDS: 0.56 at 0.2, 0.93 at 0.4, 0.995 at 0.5).

A candidate from the other split is a paraphrase when the exact Jaccard similarity of the two
content-word sets (kept per task, a few hundred bytes) is at least `paraphrase_jaccard` (config,
0.4), it has the same numbers in the same order (templated siblings such as `7 cards and 5 more`
and `5 shells and 7 more` are different problems), and it has the same solution: the same solution
key (duplicates.solution_key: the answer, the canonical reference) or the same tests: at least 3
assertions holding the same constants, inputs and expected values (`assertion_constants`), since a
reworded code task often has a reworded reference and renamed functions too. Sharing a whole test set is far more specific than sharing a one-word answer, so
such a pair needs only half the threshold; a pair whose only common solution is a short answer
(at most `WEAK_CHARS` characters: "3", "l", "Po") must also share `WEAK_SHARED` content words,
since short prompts with short answers coincide by chance (`first letter of log` / `of lion`).
Answers are compared with their case (`BOOK` and `book` answer different tasks).
"""

from __future__ import annotations

import ast
import hashlib
import re
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tidal import pyast
from tidal.audit.code import test_sources
from tidal.types import Task

ROWS = 3
BANDS = 42
PERMUTATIONS = ROWS * BANDS
_RNG = np.random.default_rng(20261206)
_A = _RNG.integers(1, 2**63 - 1, PERMUTATIONS, dtype=np.uint64) | np.uint64(1)
_B = _RNG.integers(0, 2**63 - 1, PERMUTATIONS, dtype=np.uint64)
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
WORD = re.compile(r"[^\W\d]\w*|\d+(?:\.\d+)?")
_FUNCTION_WORDS = """
a about above after again all also am an and any are as at be been before being below between both but by
can could did do does doing down during each few for from further had has have having he her here hers him his
how i if in into is it its itself just me more most my no nor not now of off on once only or other our out over
own same she should so some such than that the their them then there these they this those through to too under
until up very was we were what when where which while who whom why will with would you your yours
give find name tell write please return returns given named called
"""
STOPWORDS = frozenset(_FUNCTION_WORDS.split())
VOWELS = set("aeiouy")
STRONG = "strong-"  # the prefix of a solution key that pins a whole test set
WEAK = "weak-"  # the prefix of a short answer's key
WEAK_CHARS = 3
WEAK_SHARED = 4  # content words a pair must share when its only common solution is a short answer


def _number(text: str) -> str:
    value = text.replace(",", "")
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return value.lstrip("0") or "0"


def stem(word: str) -> str:
    """A light suffix stemmer (plural -s, -ies/-ied, -ing, -ed), enough to make the inflections of
    a word one shingle: `flows`, `flowing`, `flowed` -> `flow`; `running` -> `run`."""
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith(("ies", "ied")) and len(word) > 4:
        return word[:-3] + "y"
    for suffix in ("ing", "ed"):
        base = word[: -len(suffix)]
        if word.endswith(suffix) and len(base) >= 3 and VOWELS & set(base) and not word.endswith("eed"):
            return base[:-1] if len(base) > 3 and base[-1] == base[-2] and base[-1] not in "lsz" else base
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def content_words(text: str) -> set[str]:
    """The prompt's shingles: canonical numbers and stemmed content words (module docstring)."""
    text = NUMBER.sub(lambda m: " " + _number(m.group()) + " ", unicodedata.normalize("NFKC", text).casefold())
    return {w if w[0].isdigit() else stem(w) for w in WORD.findall(text)
            if w[0].isdigit() or (len(w) > 1 and w not in STOPWORDS)}


def numbers(text: str) -> tuple[str, ...]:
    """The prompt's numbers in order: `7 cards and 5 more` and `5 shells and 7 more` differ."""
    return tuple(_number(m) for m in NUMBER.findall(unicodedata.normalize("NFKC", text)))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def signature(items: set[str]) -> np.ndarray:
    """(PERMUTATIONS,) uint64 MinHash signature; an empty set gets an all-ones signature."""
    if not items:
        return np.full(PERMUTATIONS, np.iinfo(np.uint64).max, dtype=np.uint64)
    values = np.array([int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "little")
                       for s in sorted(items)], dtype=np.uint64)
    with np.errstate(over="ignore"):  # multiply-shift hashing wraps around on purpose
        permuted = (values[:, None] * _A[None, :] + _B[None, :]) >> np.uint64(32)
    return permuted.min(axis=0)


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Estimated Jaccard similarity of two signatures."""
    return float(np.mean(a == b))


def solution_keys(task: Task, solution_key: str) -> frozenset[str]:
    """Keys two tasks with the same solution share: the solution key (`WEAK` when it is an answer
    of at most `WEAK_CHARS` characters, which unrelated tasks share by chance: "3", "l", "Po"), and
    the tests when at least 3 assertions hold constants (`STRONG`: a whole test set, not one answer)."""
    kind, _, value = solution_key.partition(":")
    if kind in ("answer", "pattern"):
        # Case kept: "BOOK, BOOK" and "book, book" answer two tasks, not one reworded.
        value = " ".join(unicodedata.normalize("NFKC", str(task.verifier.args[kind])).split())
        solution_key = f"{kind}:{value}"
    keys = {(WEAK if kind in ("answer", "pattern") and len(value) <= WEAK_CHARS else "") + solution_key}
    asserted = assertion_constants(task)
    if len(asserted) >= 3:
        keys.add(STRONG + "tests:" + hashlib.sha256(repr(sorted(asserted)).encode()).hexdigest()[:32])
    return frozenset(keys)


def assertion_constants(task: Task) -> list[tuple[str, ...]]:
    """Per assertion of the task's Python tests, the constants it holds (inputs and expected
    values: `is_palindrome('level') == True` -> ('level', True)), whatever the names are."""
    found: list[tuple[str, ...]] = []
    for source in test_sources(task).values():
        try:
            tree = pyast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert) or (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                                                and node.func.attr.startswith("assert")):
                constants = tuple(repr(c.value) for c in ast.walk(node) if isinstance(c, ast.Constant))
                if constants:
                    found.append(constants)
    return found


def _bare(keys: frozenset[str]) -> frozenset[str]:
    return frozenset(k.removeprefix(WEAK) for k in keys)


@dataclass
class Paraphrase:
    other_id: str
    other_split: str
    similarity: float  # exact Jaccard of the content words
    estimated: float  # MinHash's estimate, which made the pair a candidate


@dataclass
class ParaphraseIndex:
    """Signatures of the tasks seen so far, LSH-bucketed; `match` then `add`, in input order."""

    threshold: float = 0.4
    buckets: dict[tuple[int, bytes], list[int]] = field(default_factory=lambda: defaultdict(list))
    # id, split, solution keys, numbers, content words, signature
    entries: list[tuple[str, str, frozenset[str], tuple[str, ...], frozenset[str], np.ndarray]] = field(
        default_factory=list)

    def match(self, task: Task, prompt: str, keys: frozenset[str]) -> tuple[Paraphrase | None, list, tuple]:
        """The most similar earlier task of another split that paraphrases this one, if any; also
        what `add` needs (the bands and the entry). LSH finds the candidates; each is confirmed on
        its exact Jaccard similarity (the content words are kept, a few hundred bytes a task)."""
        words = frozenset(content_words(prompt))
        sig = signature(set(words))
        bands = [(band, sig[band * ROWS:(band + 1) * ROWS].tobytes()) for band in range(BANDS)]
        candidates = {i for key in bands for i in self.buckets.get(key, ())}
        nums = numbers(prompt)
        best: Paraphrase | None = None
        for i in sorted(candidates):
            other_id, other_split, other_keys, other_nums, other_words, other_sig = self.entries[i]
            shared = _bare(keys) & _bare(other_keys)
            if other_split == task.split or not shared or nums != other_nums:
                continue
            if all(WEAK + k in keys for k in shared) and len(words & other_words) < WEAK_SHARED:
                continue  # a short prompt and a short answer both happen to have
            sim = jaccard(words, other_words)
            # The same test set is far more specific than one short answer: half the similarity will do.
            needed = self.threshold / 2 if any(k.startswith(STRONG) for k in shared) else self.threshold
            if sim >= needed and (best is None or sim > best.similarity):
                best = Paraphrase(other_id, other_split, sim, similarity(sig, other_sig))
        return best, bands, (task.id, task.split, keys, nums, words, sig)

    def add(self, bands: list, entry: tuple) -> None:
        index = len(self.entries)
        self.entries.append(entry)
        for key in bands:
            self.buckets[key].append(index)
