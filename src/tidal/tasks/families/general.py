"""`general`: follow an output format exactly (case, brackets, quotes, repetition, prefix, JSON).

Scored by the `regex` verifier: the stripped answer must match the whole pattern. Every pattern
embeds the word itself (through `re.escape`), so it rejects the right shape with the wrong content;
it tolerates only harmless variation (spaces around commas and inside JSON, key order in JSON).
Difficulty grows from one formatting rule on a short word to two rules combined on longer words.
The content key is the kind, word and count/prefix; eval items are new combinations of those.
"""

from __future__ import annotations

import itertools
import random
import re

from tidal.tasks.families.registry import Draft, family
from tidal.tasks.families.words import pick_word

PREFIXES = ("Answer:", "Result:", "Output:", "Final:")

# kind -> phrasings; {w} is the word as shown, {k} a count, {p} a prefix.
TEMPLATES: dict[str, tuple[str, ...]] = {
    "upper": ("Write {w} in capital letters.", "Reply with {w} in upper case."),
    "lower": ("Write {w} in small letters.", "Reply with {w} in lower case."),
    "brackets": ("Write {w} inside square brackets.", "Reply with {w} wrapped in [ and ]."),
    "quotes": ("Write {w} inside double quotes.", "Reply with {w} in double quotes."),
    "repeat": ("Write {w} {k} times, separated by commas.", "Repeat {w} {k} times with commas between."),
    "prefix": ("Begin with {p} and then write {w}.", "Write {w}, starting your answer with {p}"),
    "json": ('Write a JSON object with key "word" and value "{w}".',),
    "upper_brackets": ("Write {w} in capital letters inside square brackets.",),
    "json_upper": ('Write a JSON object with key "word" and value {w} in capitals.',),
    "prefix_upper": ("Begin with {p} and then write {w} in capital letters.",),
    "json_length": ('Write a JSON object with "word" set to {w} and "length" to its length.',),
    "repeat_upper": ("Write {w} in capitals {k} times, separated by commas.",),
    "prefix_quotes": ("Begin with {p} and then write {w} inside double quotes.",),
}

# level -> kind -> (shortest word, longest word, smallest count, largest count)
LEVELS: dict[int, dict[str, tuple[int, int, int, int]]] = {
    1: {"upper": (3, 4, 0, 0), "brackets": (3, 4, 0, 0), "quotes": (3, 4, 0, 0)},
    2: {"upper": (5, 6, 0, 0), "repeat": (3, 5, 2, 3), "prefix": (3, 5, 0, 0)},
    3: {"json": (4, 7, 0, 0), "repeat": (3, 6, 3, 4), "lower": (5, 7, 0, 0)},
    4: {
        "upper_brackets": (6, 8, 0, 0),
        "json_upper": (5, 8, 0, 0),
        "prefix_upper": (5, 8, 0, 0),
        "repeat": (3, 6, 4, 5),
    },
    5: {"json_length": (6, 9, 0, 0), "repeat_upper": (4, 6, 3, 4), "prefix_quotes": (6, 9, 0, 0)},
}


def _json_pattern(members: list[tuple[str, str | int]]) -> str:
    """A JSON object with exactly these members, in any order, with any spacing."""
    parts = []
    for key, value in members:
        shown = re.escape(f'"{value}"') if isinstance(value, str) else str(value)
        parts.append(rf'"{re.escape(key)}"\s*:\s*{shown}')
    orders = [r"\s*,\s*".join(order) for order in itertools.permutations(parts)]
    return r"^\{\s*(?:" + "|".join(orders) + r")\s*\}$"


def _answer(kind: str, word: str, count: int, prefix: str) -> tuple[str, str]:
    """(reference, pattern) for one kind."""
    upper = word.upper()
    if kind in ("upper", "lower"):
        text = upper if kind == "upper" else word
        return text, f"^{re.escape(text)}$"
    if kind in ("brackets", "upper_brackets"):
        text = upper if kind == "upper_brackets" else word
        return f"[{text}]", rf"^\[\s*{re.escape(text)}\s*\]$"
    if kind == "quotes":
        return f'"{word}"', f'^"{re.escape(word)}"$'
    if kind in ("repeat", "repeat_upper"):
        text = upper if kind == "repeat_upper" else word
        pattern = rf"^{re.escape(text)}(?:\s*,\s*{re.escape(text)}){{{count - 1}}}$"
        return ", ".join([text] * count), pattern
    if kind in ("prefix", "prefix_upper", "prefix_quotes"):
        text = {"prefix": word, "prefix_upper": upper, "prefix_quotes": f'"{word}"'}[kind]
        return f"{prefix} {text}", rf"^{re.escape(prefix)}\s*{re.escape(text)}$"
    if kind in ("json", "json_upper"):
        text = upper if kind == "json_upper" else word
        return f'{{"word": "{text}"}}', _json_pattern([("word", text)])
    # json_length
    members: list[tuple[str, str | int]] = [("word", word), ("length", len(word))]
    return f'{{"word": "{word}", "length": {len(word)}}}', _json_pattern(members)


@family("general")
def make_general(rng: random.Random, difficulty: int) -> Draft:
    kind = rng.choice(tuple(LEVELS[difficulty]))
    shortest, longest, fewest, most = LEVELS[difficulty][kind]
    word = pick_word(rng, shortest, longest)
    count = rng.randint(fewest, most) if most else 0
    prefix = rng.choice(PREFIXES) if kind.startswith("prefix") else ""
    shown = word.upper() if kind == "lower" else word  # "lower" asks to undo capitals
    prompt = rng.choice(TEMPLATES[kind]).format(w=shown, k=count, p=prefix)
    reference, pattern = _answer(kind, word, count, prefix)
    key = f"{kind}|{word}|{count}|{prefix}"
    return Draft(key, prompt, reference, {"name": "regex", "pattern": pattern}, metadata={"kind": kind})
