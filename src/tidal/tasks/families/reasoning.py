"""`reasoning`: small word and list manipulations with exactly one right answer.

Kinds: reverse a word, name a letter at a position, count letters, sort numbers, largest and
smallest number, remove repeated numbers. Difficulty grows with the length of the word or list,
the size of the numbers, and (for letters) positions other than first and last. The content key
is the kind and its input, so eval items are new words and lists under the same phrasings.
"""

from __future__ import annotations

import random

from tidal.tasks.families.registry import Draft, family
from tidal.tasks.families.words import pick_word

WORD_LENGTHS = {1: (3, 3), 2: (4, 5), 3: (6, 7), 4: (8, 8), 5: (9, 10)}
LIST_LENGTHS = {1: 3, 2: 4, 3: 5, 4: 6, 5: 7}
LARGEST_NUMBER = {1: 9, 2: 9, 3: 20, 4: 99, 5: 99}
POSITIONS = {"first": 0, "second": 1, "third": 2, "fourth": 3, "last": -1}

TEMPLATES: dict[str, tuple[str, ...]] = {
    "reverse": ("Reverse the word {w}.", "Write {w} backwards."),
    "letter": ("What is the {p} letter of {w}?", "Which letter comes {p} in {w}?"),
    "length": ("How many letters are in {w}?", "Count the letters in {w}."),
    "sort": ("Sort {l} from smallest to largest.", "Put {l} in increasing order."),
    "largest": ("What is the largest of {l}?", "Which is the biggest number in {l}?"),
    "smallest": ("What is the smallest of {l}?", "Which is the lowest number in {l}?"),
    "dedupe": ("Remove repeats from {l}, keeping the order.", "Drop the duplicates in {l}, keep order."),
}


def _numbers(rng: random.Random, difficulty: int, with_repeat: bool) -> list[int]:
    length, top = LIST_LENGTHS[difficulty], LARGEST_NUMBER[difficulty]
    if with_repeat:
        # Drawing `length` values from `length - 1` distinct ones forces at least one repeat.
        pool = rng.sample(range(top + 1), length - 1)
        return [rng.choice(pool) for _ in range(length)]
    return [rng.randint(0, top) for _ in range(length)]


def _word_task(rng: random.Random, kind: str, difficulty: int) -> tuple[str, dict[str, str], str]:
    """(content key, template fields, answer) for a kind over one word."""
    word = pick_word(rng, *WORD_LENGTHS[difficulty])
    if kind == "reverse":
        return f"reverse|{word}", {"w": word}, word[::-1]
    if kind == "length":
        return f"length|{word}", {"w": word}, str(len(word))
    names = ("first", "last") if difficulty <= 2 else ("second", "third", "fourth", "last")
    position = rng.choice(names)
    return f"letter|{word}|{position}", {"w": word, "p": position}, word[POSITIONS[position]]


def _list_task(rng: random.Random, kind: str, difficulty: int) -> tuple[str, dict[str, str], str]:
    """(content key, template fields, answer) for a kind over a list of numbers."""
    numbers = _numbers(rng, difficulty, with_repeat=kind == "dedupe")
    text = " ".join(map(str, numbers))
    if kind == "sort":
        answer = " ".join(map(str, sorted(numbers)))
    elif kind == "largest":
        answer = str(max(numbers))
    elif kind == "smallest":
        answer = str(min(numbers))
    else:
        answer = " ".join(map(str, dict.fromkeys(numbers)))  # first occurrence of each, in order
    return f"{kind}|{text}", {"l": text}, answer


@family("reasoning")
def make_reasoning(rng: random.Random, difficulty: int) -> Draft:
    kind = rng.choice(tuple(TEMPLATES))
    if kind in ("reverse", "letter", "length"):
        key, fields, answer = _word_task(rng, kind, difficulty)
    else:
        key, fields, answer = _list_task(rng, kind, difficulty)
    prompt = rng.choice(TEMPLATES[kind]).format(**fields)
    return Draft(key, prompt, answer, {"name": "exact_match", "answer": answer}, metadata={"kind": kind})
