"""The functions the `code_fn` family asks for: a kind per function, with its constants.

A kind is a signature, a one-sentence docstring, a reference body and an input generator. `$name`
in the docstring and the body is a constant drawn per task (`string.Template`), so one kind is
several distinct functions (count the letter a / the letter e; chunks of 2 / of 3). Expected test
values come from running the reference on the inputs, so a reference cannot disagree with its
tests; the edge cases (empty inputs, ties, negatives) are written per kind.

Levels: 1 one expression over a string, list or number; 2 a loop or a condition; 3 dicts and
grouping; 4 parsing text into values; 5 small algorithms of 8-20 lines.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidal.tasks.families.words import WORDS, pick_word

Args = tuple[Any, ...]
Inputs = Callable[[random.Random, dict[str, Any]], Args]
Constants = Callable[[random.Random], dict[str, Any]]


@dataclass(frozen=True)
class Kind:
    kind: str
    level: int
    names: tuple[str, ...]  # function names; one is picked per task (phrasing, not content)
    signature: str  # parameters with annotations and the return annotation: "(text: str) -> int"
    doc: str  # one sentence; `$c` constants
    body: str  # the reference body, indented four spaces; `$c` constants
    inputs: Inputs  # one random argument tuple
    # Edge cases, always among the hidden tests: a tuple, or a function of the constants.
    edges: tuple[Args, ...] | Callable[[dict[str, Any]], tuple[Args, ...]] = ()
    constants: Constants = field(default=lambda rng: {})


# ----------------------------------------------------------------------------------------- inputs


def word(rng: random.Random, shortest: int = 3, longest: int = 8) -> str:
    return pick_word(rng, shortest, longest)


def sentence(rng: random.Random, low: int = 2, high: int = 6) -> str:
    return " ".join(word(rng) for _ in range(rng.randint(low, high)))


def mixed(rng: random.Random) -> str:
    """A sentence with some capitals and punctuation."""
    words = [w.capitalize() if rng.random() < 0.3 else w for w in sentence(rng, 2, 5).split()]
    return " ".join(words) + rng.choice(("", ".", "!", "?"))


def ints(rng: random.Random, low: int = -9, high: int = 20, shortest: int = 1, longest: int = 7) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(shortest, longest))]


def palindrome_or_not(rng: random.Random) -> str:
    half = word(rng, 3, 5)
    if rng.random() < 0.5:
        text = half + half[-2::-1]
        return text.capitalize() if rng.random() < 0.5 else text
    return word(rng, 4, 8)


def anagram_pair(rng: random.Random) -> Args:
    first = word(rng, 4, 7)
    if rng.random() < 0.5:
        letters = list(first)
        rng.shuffle(letters)
        return first, "".join(letters).upper() if rng.random() < 0.3 else "".join(letters)
    return first, word(rng, len(first), len(first))


def counts(rng: random.Random, size: int = 4) -> dict[str, int]:
    keys = rng.sample(WORDS[3] + WORDS[4], rng.randint(1, size))
    return {k: rng.randint(0, 30) for k in keys}


def snake(rng: random.Random) -> str:
    return "_".join(word(rng, 3, 6) for _ in range(rng.randint(1, 4)))


def camel(rng: random.Random) -> str:
    parts = [word(rng, 3, 6) for _ in range(rng.randint(1, 4))]
    return parts[0] + "".join(p.capitalize() for p in parts[1:])


def clock(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"


def version(rng: random.Random) -> str:
    return ".".join(str(rng.choice((0, 1, 2, 9, 10, 12))) for _ in range(rng.randint(1, 3)))


def bracket_text(rng: random.Random) -> str:
    if rng.random() < 0.5:  # balanced by construction
        def nest(depth: int) -> str:
            if depth == 0 or rng.random() < 0.3:
                return rng.choice(("", "x", "ab"))
            opening, closing = rng.choice(("()", "[]", "{}"))
            return opening + nest(depth - 1) + closing + (nest(depth - 1) if rng.random() < 0.4 else "")
        return nest(4)
    return "".join(rng.choice("()[]{}x") for _ in range(rng.randint(1, 8)))


def hash_grid(rng: random.Random) -> list[str]:
    width = rng.randint(1, 5)
    return ["".join(rng.choice("#..") for _ in range(width)) for _ in range(rng.randint(1, 4))]


def intervals(rng: random.Random) -> list[list[int]]:
    result = []
    for _ in range(rng.randint(1, 5)):
        start = rng.randint(0, 20)
        result.append([start, start + rng.randint(0, 6)])
    return result


def log_lines(rng: random.Random) -> list[str]:
    return [f"{rng.choice(('INFO', 'WARN', 'ERROR', 'DEBUG'))} {sentence(rng, 1, 3)}" for _ in range(rng.randint(1, 6))]


def duration(rng: random.Random) -> str:
    parts = [(rng.randint(1, 12), "h"), (rng.randint(1, 59), "m"), (rng.randint(1, 59), "s")]
    kept = [f"{n}{unit}" for n, unit in parts if rng.random() < 0.6] or [f"{parts[1][0]}m"]
    return " ".join(kept)


def grid(rng: random.Random, size: int | None = None) -> list[list[int]]:
    rows = size or rng.randint(1, 4)
    cols = size or rng.randint(1, 4)
    return [[rng.randint(-5, 9) for _ in range(cols)] for _ in range(rows)]


def choose(**options: tuple[Any, ...]) -> Constants:
    """Constants drawn from one tuple each: choose(k=(2, 3)) -> {"k": 2} or {"k": 3}."""
    def draw(rng: random.Random) -> dict[str, Any]:
        return {name: rng.choice(values) for name, values in options.items()}
    return draw


LETTERS = tuple("aeinorst")
SEPARATORS = ("_", "-", ".", "+", "/")


# ----------------------------------------------------------------------------------------- kinds

KINDS: tuple[Kind, ...] = (
    # Level 1: one expression.
    Kind("count_letter", 1, ("count_letter", "letter_count", "how_many"), "(text: str) -> int",
         "Return how many times the letter '$ch' appears in text, in either case.",
         "    return text.lower().count('$ch')",
         lambda r, c: (mixed(r),), lambda c: (("",), (c["ch"].upper() + c["ch"] + "x",)), choose(ch=LETTERS)),
    Kind("count_vowels", 1, ("count_vowels", "vowel_count"), "(text: str) -> int",
         "Return the number of vowels (a, e, i, o, u, either case) in text.",
         "    return sum(1 for c in text.lower() if c in 'aeiou')",
         lambda r, c: (mixed(r),), (("",), ("rhythm",), ("AEIOU",))),
    Kind("reverse_words", 1, ("reverse_words", "backwards_sentence"), "(sentence: str) -> str",
         "Return the words of sentence in reverse order, joined by single spaces.",
         "    return ' '.join(reversed(sentence.split()))",
         lambda r, c: (sentence(r),), (("",), ("one",), ("  two   words ",))),
    Kind("join_with", 1, ("join_words", "link_words"), "(sentence: str) -> str",
         "Return the words of sentence joined by '$sep' instead of spaces.",
         "    return '$sep'.join(sentence.split())",
         lambda r, c: (sentence(r),), (("",), ("solo",)), choose(sep=SEPARATORS)),
    Kind("remove_letter", 1, ("remove_letter", "strip_letter", "without_letter"), "(text: str) -> str",
         "Return text with every lowercase '$ch' removed.",
         "    return text.replace('$ch', '')",
         lambda r, c: (mixed(r),), (("",),), choose(ch=LETTERS)),
    Kind("sum_multiples", 1, ("sum_multiples", "multiple_total"), "(numbers: list[int]) -> int",
         "Return the sum of the numbers in the list that are multiples of $k.",
         "    return sum(n for n in numbers if n % $k == 0)",
         lambda r, c: (ints(r, -20, 40, 2, 8),), (([],), ([1],)), choose(k=(2, 3, 4, 5, 7))),
    Kind("keep_above", 1, ("keep_above", "filter_above", "larger_than"), "(numbers: list[int]) -> list[int]",
         "Return the numbers greater than $k, in their original order.",
         "    return [n for n in numbers if n > $k]",
         lambda r, c: (ints(r, c["k"] - 8, c["k"] + 8, 1, 7),), lambda c: (([],), ([c["k"]],)), choose(k=(-3, 0, 5, 10, 15))),
    Kind("swap_case", 1, ("swap_case", "flip_case"), "(text: str) -> str",
         "Return text with lowercase letters made uppercase and uppercase letters made lowercase.",
         "    return ''.join(c.lower() if c.isupper() else c.upper() for c in text)",
         lambda r, c: (mixed(r),), (("",), ("123 ABC",))),
    Kind("count_upper", 1, ("count_upper", "capital_count"), "(text: str) -> int",
         "Return how many uppercase letters text contains.",
         "    return sum(1 for c in text if c.isupper())",
         lambda r, c: (mixed(r),), (("",), ("ALL CAPS",))),
    Kind("digit_sum", 1, ("digit_sum", "sum_of_digits"), "(n: int) -> int",
         "Return the sum of the decimal digits of n (the sign is ignored).",
         "    return sum(int(d) for d in str(abs(n)))",
         lambda r, c: (r.randint(-99999, 99999),), ((0,), (-7,), (1000,))),
    Kind("count_digits", 1, ("count_digits", "digit_count"), "(n: int) -> int",
         "Return how many decimal digits n has (the sign does not count; 0 has one digit).",
         "    return len(str(abs(n)))",
         lambda r, c: (r.choice((1, -1)) * r.randint(0, 10 ** r.randint(1, 7)),), ((0,), (-5,), (10,))),
    Kind("every_kth", 1, ("every_kth", "take_every"), "(text: str) -> str",
         "Return every $k-th character of text, starting with the first.",
         "    return text[::$k]",
         lambda r, c: (sentence(r, 1, 4),), (("",), ("a",)), choose(k=(2, 3, 4))),
    Kind("last_chars", 1, ("mask_secret", "hide_all_but_last"), "(secret: str) -> str",
         "Return secret with every character except the last $k replaced by '*'.",
         "    return '*' * max(len(secret) - $k, 0) + secret[-$k:]",
         lambda r, c: ("".join(r.choice(string.digits) for _ in range(r.randint(1, 16))),), (("",), ("ab",)),
         choose(k=(2, 3, 4))),
    Kind("repeat_chars", 1, ("stretch", "repeat_each"), "(text: str) -> str",
         "Return text with each character repeated $k times.",
         "    return ''.join(c * $k for c in text)",
         lambda r, c: (word(r, 3, 6),), (("",), ("a b",)), choose(k=(2, 3))),
    # Level 2: a loop or a condition.
    Kind("is_palindrome", 2, ("is_palindrome", "reads_same_backwards"), "(text: str) -> bool",
         "Return True if text reads the same forwards and backwards, ignoring case.",
         "    lowered = text.lower()\n    return lowered == lowered[::-1]",
         lambda r, c: (palindrome_or_not(r),), (("",), ("Ab",), ("Aba",))),
    Kind("longest_word", 2, ("longest_word", "biggest_word"), "(sentence: str) -> str",
         "Return the longest word of sentence; the first one if several are equally long, '' if there is none.",
         "    best = ''\n    for w in sentence.split():\n        if len(w) > len(best):\n            best = w\n    return best",
         lambda r, c: (sentence(r, 2, 7),), (("",), ("cat dog",))),
    Kind("count_long_words", 2, ("count_long_words", "long_word_count"), "(sentence: str) -> int",
         "Return how many words of sentence have more than $k letters.",
         "    return sum(1 for w in sentence.split() if len(w) > $k)",
         lambda r, c: (sentence(r, 2, 8),), (("",),), choose(k=(3, 4, 5, 6))),
    Kind("second_largest", 2, ("second_largest", "runner_up"), "(numbers: list[int]) -> int | None",
         "Return the second largest distinct number in the list, or None if there are fewer than two distinct numbers.",
         "    distinct = sorted(set(numbers))\n    return distinct[-2] if len(distinct) >= 2 else None",
         lambda r, c: (ints(r, -5, 15, 2, 7),), (([],), ([4, 4],), ([1, 2],))),
    Kind("running_total", 2, ("running_total", "prefix_sums", "cumulative"), "(numbers: list[int]) -> list[int]",
         "Return the running totals of the list: element i is the sum of the first i + 1 numbers.",
         "    totals, total = [], 0\n    for n in numbers:\n        total += n\n        totals.append(total)\n    return totals",
         lambda r, c: (ints(r),), (([],), ([5],))),
    Kind("differences", 2, ("differences", "steps_between"), "(numbers: list[int]) -> list[int]",
         "Return the differences between neighbours: element i is numbers[i + 1] - numbers[i].",
         "    return [b - a for a, b in zip(numbers, numbers[1:])]",
         lambda r, c: (ints(r, -9, 20, 2, 7),), (([],), ([3],))),
    Kind("count_between", 2, ("count_between", "in_range_count"), "(numbers: list[int]) -> int",
         "Return how many numbers lie between $lo and $hi, both included.",
         "    return sum(1 for n in numbers if $lo <= n <= $hi)",
         lambda r, c: (ints(r, c["lo"] - 5, c["hi"] + 5, 1, 8),), lambda c: (([],), ([c["lo"], c["hi"]],)),
         lambda r: dict(zip(("lo", "hi"), sorted(r.sample(range(-5, 16), 2))))),
    Kind("clamp_all", 2, ("clamp_all", "limit_values"), "(numbers: list[int]) -> list[int]",
         "Return the list with every number below $lo raised to $lo and every number above $hi lowered to $hi.",
         "    return [min(max(n, $lo), $hi) for n in numbers]",
         lambda r, c: (ints(r, c["lo"] - 6, c["hi"] + 6, 1, 7),), (([],),),
         lambda r: dict(zip(("lo", "hi"), sorted(r.sample(range(-5, 16), 2))))),
    Kind("rotate_left", 2, ("rotate_left", "shift_left"), "(items: list[int]) -> list[int]",
         "Return the list rotated left by $k places (the first $k items move to the end); an empty list stays empty.",
         "    if not items:\n        return []\n    shift = $k % len(items)\n    return items[shift:] + items[:shift]",
         lambda r, c: (ints(r, 0, 9, 1, 7),), (([],), ([1],)), choose(k=(1, 2, 3))),
    Kind("chunks", 2, ("chunks", "split_into_groups", "batches"), "(items: list[int]) -> list[list[int]]",
         "Return the list cut into consecutive pieces of $k items; the last piece may be shorter.",
         "    return [items[i:i + $k] for i in range(0, len(items), $k)]",
         lambda r, c: (ints(r, 0, 9, 1, 9),), (([],),), choose(k=(2, 3, 4))),
    Kind("dedupe", 2, ("dedupe", "unique_in_order"), "(items: list[int]) -> list[int]",
         "Return the list without repeated values, keeping the first occurrence of each in order.",
         "    seen, result = set(), []\n    for item in items:\n        if item not in seen:\n            seen.add(item)\n"
         "            result.append(item)\n    return result",
         lambda r, c: (ints(r, 0, 6, 2, 9),), (([],),)),
    Kind("index_of_max", 2, ("index_of_max", "argmax"), "(numbers: list[int]) -> int",
         "Return the index of the largest number (the first one on a tie), or -1 for an empty list.",
         "    if not numbers:\n        return -1\n    return numbers.index(max(numbers))",
         lambda r, c: (ints(r, -5, 9, 1, 7),), (([],), ([3, 3],))),
    Kind("product_nonzero", 2, ("product_nonzero", "multiply_nonzero"), "(numbers: list[int]) -> int",
         "Return the product of the numbers that are not zero (1 if there are none).",
         "    product = 1\n    for n in numbers:\n        if n != 0:\n            product *= n\n    return product",
         lambda r, c: (ints(r, -4, 6, 1, 6),), (([],), ([0, 0],))),
    Kind("alternating_sum", 2, ("alternating_sum", "zigzag_sum"), "(numbers: list[int]) -> int",
         "Return numbers[0] - numbers[1] + numbers[2] - numbers[3] + ... (0 for an empty list).",
         "    return sum(n if i % 2 == 0 else -n for i, n in enumerate(numbers))",
         lambda r, c: (ints(r),), (([],), ([7],))),
    Kind("is_prime", 2, ("is_prime", "prime"), "(n: int) -> bool",
         "Return True if n is a prime number.",
         "    if n < 2:\n        return False\n    d = 2\n    while d * d <= n:\n        if n % d == 0:\n            return False\n"
         "        d += 1\n    return True",
         lambda r, c: (r.choice((2, 3, 5, 7, 11, 13, 29, 31, 37, 41, 53, 61, 71, 97, 101)) if r.random() < 0.5
                       else r.randint(4, 120),), ((0,), (1,), (2,), (-7,), (49,))),
    Kind("label_number", 2, ("label", "fizz_label"), "(n: int) -> str",
         "Return '$a$b' if n is a multiple of both $x and $y, '$a' if only of $x, '$b' if only of $y, else str(n).",
         "    if n % $x == 0 and n % $y == 0:\n        return '$a$b'\n    if n % $x == 0:\n        return '$a'\n"
         "    if n % $y == 0:\n        return '$b'\n    return str(n)",
         lambda r, c: (r.choice((c["x"] * r.randint(1, 9), c["y"] * r.randint(1, 9), r.randint(1, 60))),),
         lambda c: ((1,), (c["x"] * c["y"],)),
         lambda r: {**dict(zip(("x", "y"), r.choice(((2, 3), (3, 5), (2, 7), (4, 5), (3, 7))))),
                    **dict(zip(("a", "b"), r.choice((("Fizz", "Buzz"), ("Ping", "Pong"), ("Tick", "Tock")))))}),
    Kind("collatz_steps", 2, ("collatz_steps", "steps_to_one"), "(n: int) -> int",
         "Return how many steps n (>= 1) takes to reach 1, halving it when even and making it 3n + 1 when odd.",
         "    steps = 0\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n    return steps",
         lambda r, c: (r.randint(2, 60),), ((1,), (2,))),
    Kind("reverse_number", 2, ("reverse_number", "flip_digits"), "(n: int) -> int",
         "Return n with its digits in reverse order, keeping its sign (leading zeros disappear).",
         "    flipped = int(str(abs(n))[::-1])\n    return -flipped if n < 0 else flipped",
         lambda r, c: (r.randint(-9999, 9999),), ((0,), (120,), (-45,))),
    Kind("longest_run", 2, ("longest_run", "max_streak"), "(items: list[int]) -> int",
         "Return the length of the longest run of equal neighbouring items (0 for an empty list).",
         "    best = current = 0\n    previous = object()\n    for item in items:\n"
         "        current = current + 1 if item == previous else 1\n        previous = item\n"
         "        best = max(best, current)\n    return best",
         lambda r, c: ([r.choice((1, 2, 3)) for _ in range(r.randint(1, 10))],), (([],), ([5],))),
    Kind("caesar", 2, ("caesar", "shift_letters", "encode"), "(text: str) -> str",
         "Return text with each lowercase letter shifted $k places forward in the alphabet, wrapping from z to a; "
         "other characters stay as they are.",
         "    result = []\n    for c in text:\n        if 'a' <= c <= 'z':\n"
         "            c = chr((ord(c) - ord('a') + $k) % 26 + ord('a'))\n        result.append(c)\n    return ''.join(result)",
         lambda r, c: (mixed(r),), (("",), ("xyz!",)), choose(k=(1, 2, 3, 5, 13))),
    Kind("is_anagram", 2, ("is_anagram", "same_letters"), "(a: str, b: str) -> bool",
         "Return True if a and b use exactly the same letters the same number of times, ignoring case.",
         "    return sorted(a.lower()) == sorted(b.lower())",
         lambda r, c: anagram_pair(r), (("", ""), ("ab", "abb"))),
    Kind("merge_sorted", 2, ("merge_sorted", "merge_lists"), "(a: list[int], b: list[int]) -> list[int]",
         "Given two lists sorted in increasing order, return one sorted list with all their items, without using sort.",
         "    i = j = 0\n    merged = []\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
         "            merged.append(a[i])\n            i += 1\n        else:\n            merged.append(b[j])\n            j += 1\n"
         "    return merged + a[i:] + b[j:]",
         lambda r, c: (sorted(ints(r, 0, 20, 0, 5)), sorted(ints(r, 0, 20, 0, 5))), (([], []), ([1], []))),
    Kind("interleave", 2, ("interleave", "alternate_items"), "(a: list[int], b: list[int]) -> list[int]",
         "Return a[0], b[0], a[1], b[1], ...; when one list runs out, the rest of the other follows.",
         "    result = []\n    for i in range(max(len(a), len(b))):\n        if i < len(a):\n            result.append(a[i])\n"
         "        if i < len(b):\n            result.append(b[i])\n    return result",
         lambda r, c: (ints(r, 0, 9, 0, 4), ints(r, 10, 19, 0, 4)), (([], []), ([1, 2, 3], [9]))),
    Kind("top_k", 2, ("top_k", "largest_few"), "(numbers: list[int]) -> list[int]",
         "Return the $k largest numbers in decreasing order (all of them if there are fewer than $k).",
         "    return sorted(numbers, reverse=True)[:$k]",
         lambda r, c: (ints(r, -9, 30, 1, 8),), (([],),), choose(k=(2, 3))),
    Kind("positions_of", 2, ("positions_of", "find_all"), "(items: list[int], target: int) -> list[int]",
         "Return the indices at which target occurs in items, in increasing order.",
         "    return [i for i, item in enumerate(items) if item == target]",
         lambda r, c: (ints(r, 0, 4, 1, 9), r.randint(0, 4)), (([], 1), ([2, 2], 2))),
    Kind("moving_average", 2, ("moving_average", "window_means"), "(numbers: list[int]) -> list[float]",
         "Return the averages of every window of $k consecutive numbers, each rounded to 2 decimals.",
         "    return [round(sum(numbers[i:i + $k]) / $k, 2) for i in range(len(numbers) - $k + 1)]",
         lambda r, c: (ints(r, 0, 20, 2, 8),), (([],), ([1],)), choose(k=(2, 3))),
    # Level 3: dicts, grouping, text into structures.
    Kind("word_counts", 3, ("word_counts", "count_words", "tally_words"), "(text: str) -> dict[str, int]",
         "Return a dict mapping each word of text, lowercased, to how many times it appears; words shorter than $k "
         "letters are not counted.",
         "    counts = {}\n    for w in text.lower().split():\n        if len(w) >= $k:\n            counts[w] = counts.get(w, 0) + 1\n"
         "    return counts",
         lambda r, c: (" ".join(r.choice(("the", "a", "Cat", "dog", "cat", "The", "an", "bird", "Bird"))
                                for _ in range(r.randint(1, 8))),),
         (("",),), choose(k=(1, 2, 3, 4))),
    Kind("letter_frequency", 3, ("letter_frequency", "letter_counts"), "(text: str) -> dict[str, int]",
         "Return a dict mapping each letter of text (lowercased; other characters skipped) to its count.",
         "    counts = {}\n    for c in text.lower():\n        if c.isalpha():\n            counts[c] = counts.get(c, 0) + 1\n"
         "    return counts",
         lambda r, c: (mixed(r),), (("",), ("1, 2!",))),
    Kind("most_common_letter", 3, ("most_common_letter", "top_letter"), "(text: str) -> str",
         "Return the lowercase letter that appears most often in text (ignoring case and non-letters); on a tie the "
         "one that appears first; '' if there are no letters.",
         "    counts = {}\n    for c in text.lower():\n        if c.isalpha():\n            counts[c] = counts.get(c, 0) + 1\n"
         "    best = ''\n    for c in counts:\n        if best == '' or counts[c] > counts[best]:\n            best = c\n"
         "    return best",
         lambda r, c: (mixed(r),), (("",), ("abab",), ("B a b",))),
    Kind("group_by_length", 3, ("group_by_length", "by_length"), "(words: list[str]) -> dict[int, list[str]]",
         "Return a dict mapping each word length to the words of that length, in their original order; words "
         "shorter than $k letters are left out.",
         "    groups = {}\n    for w in words:\n        if len(w) >= $k:\n            groups.setdefault(len(w), []).append(w)\n"
         "    return groups",
         lambda r, c: ([word(r, 3, 7) for _ in range(r.randint(1, 6))],), (([],),), choose(k=(1, 4, 5, 6))),
    Kind("group_by_initial", 3, ("group_by_initial", "index_by_letter"), "(words: list[str]) -> dict[str, list[str]]",
         "Return a dict mapping each lowercase first letter to the words starting with it, sorted alphabetically; "
         "empty strings are skipped.",
         "    groups = {}\n    for w in words:\n        if w:\n            groups.setdefault(w[0].lower(), []).append(w)\n"
         "    return {k: sorted(v) for k, v in groups.items()}",
         lambda r, c: ([word(r, 3, 7) for _ in range(r.randint(1, 7))],), (([],), (["", "b", "B"],))),
    Kind("invert_dict", 3, ("invert", "swap_keys_values"), "(mapping: dict[str, int]) -> dict[int, list[str]]",
         "Return a dict mapping each value of mapping to the sorted list of keys that have it.",
         "    inverted = {}\n    for key, value in mapping.items():\n        inverted.setdefault(value, []).append(key)\n"
         "    return {value: sorted(keys) for value, keys in inverted.items()}",
         lambda r, c: ({k: r.randint(1, 3) for k in r.sample(WORDS[3], r.randint(1, 5))},), (({},),)),
    Kind("keys_above", 3, ("keys_above", "big_entries"), "(scores: dict[str, int]) -> list[str]",
         "Return, sorted alphabetically, the keys whose value is at least $k.",
         "    return sorted(k for k, v in scores.items() if v >= $k)",
         lambda r, c: (counts(r, 6),), (({},),), choose(k=tuple(range(1, 26)))),
    Kind("merge_counts", 3, ("merge_counts", "add_tallies"), "(a: dict[str, int], b: dict[str, int]) -> dict[str, int]",
         "Return a new dict with every key of a and b, each mapped to the sum of its values in both.",
         "    merged = dict(a)\n    for key, value in b.items():\n        merged[key] = merged.get(key, 0) + value\n    return merged",
         lambda r, c: (counts(r), counts(r)), (({}, {}), ({"x": 1}, {}))),
    Kind("best_key", 3, ("best_key", "winner"), "(scores: dict[str, int]) -> str | None",
         "Return the key with the $which value (the alphabetically first on a tie), or None for an empty dict.",
         "    if not scores:\n        return None\n    return min(scores, key=lambda k: ($sign scores[k], k))",
         lambda r, c: (counts(r, 6),), (({},), ({"b": 2, "a": 2},)), lambda r: r.choice(({"which": "highest", "sign": "-"}, {"which": "lowest", "sign": ""}))),
    Kind("nested_get", 3, ("nested_get", "dig"), "(data: dict, path: str) -> object",
         "Return the value found by following the keys of path, separated by '$sep', through nested dicts, or None "
         "if any key is missing.",
         "    current = data\n    for key in path.split('$sep'):\n        if not isinstance(current, dict) or key not in current:\n"
         "            return None\n        current = current[key]\n    return current",
         lambda r, c: ({"a": {"b": {"c": r.randint(0, 9)}, "d": r.randint(0, 9)}, "e": r.randint(0, 9)},
                       r.choice(("a.b.c", "a.d", "e", "a.b", "a.x", "e.f", "z")).replace(".", c["sep"])),
         lambda c: (({}, "a"), ({"a": 1}, f"a{c['sep']}b")), choose(sep=(".", "/", ":", ">"))),
    Kind("pair_up", 3, ("pair_up", "zip_to_dict"), "(keys: list[str], values: list[int]) -> dict[str, int]",
         "Return a dict pairing keys[i] with values[i]; extra keys or values are ignored, and a repeated key keeps "
         "its last value.",
         "    return {k: v for k, v in zip(keys, values)}",
         lambda r, c: ([r.choice(WORDS[3][:6]) for _ in range(r.randint(0, 5))], ints(r, 0, 9, 0, 5)), (([], [1]),)),
    Kind("anagram_groups", 3, ("anagram_groups", "group_anagrams"), "(words: list[str]) -> list[list[str]]",
         "Group words that are anagrams of each other; return the groups in order of their first word's position, "
         "each group in original order.",
         "    groups = {}\n    for w in words:\n        groups.setdefault(''.join(sorted(w)), []).append(w)\n"
         "    return list(groups.values())",
         lambda r, c: ([r.choice(("listen", "silent", "enlist", "stone", "notes", "onset", "cat", "act", "dog"))
                        for _ in range(r.randint(1, 6))],), (([],),)),
    Kind("transpose", 3, ("transpose", "flip_grid"), "(matrix: list[list[int]]) -> list[list[int]]",
         "Return the transpose of a rectangular matrix (rows become columns); [] stays [].",
         "    if not matrix:\n        return []\n    return [[row[j] for row in matrix] for j in range(len(matrix[0]))]",
         lambda r, c: (grid(r),), (([],), ([[1, 2, 3]],))),
    Kind("row_sums", 3, ("row_sums", "sum_rows"), "(matrix: list[list[int]]) -> list[int]",
         "Return the sum of each row of matrix.",
         "    return [sum(row) for row in matrix]",
         lambda r, c: (grid(r),), (([],), ([[]],))),
    Kind("diagonal_sum", 3, ("diagonal_sum", "trace_both"), "(matrix: list[list[int]]) -> int",
         "Return the sum of both diagonals of a square matrix, counting a shared centre cell once.",
         "    n = len(matrix)\n    total = 0\n    for i in range(n):\n        total += matrix[i][i]\n"
         "        if i != n - 1 - i:\n            total += matrix[i][n - 1 - i]\n    return total",
         lambda r, c: (grid(r, r.randint(1, 4)),), (([],), ([[5]],))),
    # Level 4: parsing.
    Kind("parse_pairs", 4, ("parse_pairs", "parse_settings"), "(text: str) -> dict[str, int]",
         "Parse text like 'a=1$sep b=22' (pairs separated by '$sep', spaces around them ignored) into a dict of ints; "
         "empty pieces are skipped.",
         "    result = {}\n    for piece in text.split('$sep'):\n        piece = piece.strip()\n        if piece:\n"
         "            key, value = piece.split('=')\n            result[key.strip()] = int(value)\n    return result",
         lambda r, c: (f"{c['sep']} ".join(f"{word(r, 3, 5)}={r.randint(-50, 500)}" for _ in range(r.randint(1, 4))),),
         (("",),), choose(sep=(";", ",", "&", "|"))),
    Kind("clock_to_minutes", 4, ("to_minutes", "minutes_since_midnight"), "(clock: str) -> int",
         "Convert a 24-hour time 'HH${sep}MM' into the number of minutes since midnight.",
         "    hours, minutes = clock.split('$sep')\n    return int(hours) * 60 + int(minutes)",
         lambda r, c: (clock(r).replace(":", c["sep"]),), lambda c: ((f"00{c['sep']}00",), (f"23{c['sep']}59",)),
         choose(sep=(":", ".", "h"))),
    Kind("minutes_to_clock", 4, ("to_clock", "format_minutes"), "(minutes: int) -> str",
         "Format a number of minutes as 'H${sep}MM' (hours not padded, may exceed 24; minutes two digits).",
         "    return f'{minutes // 60}$sep{minutes % 60:02d}'",
         lambda r, c: (r.randint(0, 3000),), ((0,), (59,), (60,)), choose(sep=(":", "h", "."))),
    Kind("sum_field", 4, ("sum_numbers_in", "total_of_list"), "(text: str) -> int",
         "Return the sum of the integers in a '$sep'-separated text such as '3$sep 4$sep -2' (0 for empty text).",
         "    return sum(int(part) for part in text.split('$sep') if part.strip())",
         lambda r, c: (f"{c['sep']} ".join(str(n) for n in ints(r, -20, 99, 1, 6)),), (("",),),
         choose(sep=(",", ";", "|"))),
    Kind("extract_numbers", 4, ("extract_numbers", "numbers_in_text"), "(text: str) -> list[int]",
         "Return the integers written in text, in order; a '-' directly before digits makes a number negative.",
         "    numbers, current = [], ''\n    for c in text + ' ':\n        if c.isdigit() or (c == '-' and current == ''):\n"
         "            current += c\n        else:\n            if current not in ('', '-'):\n                numbers.append(int(current))\n"
         "            current = '-' if c == '-' else ''\n    return numbers",
         lambda r, c: (" ".join(r.choice((word(r), str(r.randint(-99, 999)), f"x{r.randint(0, 9)}")) for _ in range(5)),),
         (("",), ("a-b",), ("5-3",))),
    Kind("duration_seconds", 4, ("to_seconds", "parse_duration"), "(text: str) -> int",
         "Convert a duration like '1h 30m 5s' (any of the h, m, s parts, in that order, separated by spaces) into seconds.",
         "    seconds = 0\n    for part in text.split():\n        value, unit = int(part[:-1]), part[-1]\n"
         "        seconds += value * {'h': 3600, 'm': 60, 's': 1}[unit]\n    return seconds",
         lambda r, c: (duration(r),), (("0s",), ("1h",))),
    Kind("compare_versions", 4, ("compare_versions", "version_cmp"), "(a: str, b: str) -> int",
         "Compare two dotted versions such as '1.10.2' part by part as numbers (missing parts count as 0); return -1 "
         "if a is older, 1 if newer, 0 if equal.",
         "    x = [int(p) for p in a.split('.')]\n    y = [int(p) for p in b.split('.')]\n    n = max(len(x), len(y))\n"
         "    x += [0] * (n - len(x))\n    y += [0] * (n - len(y))\n    return (x > y) - (x < y)",
         lambda r, c: (version(r), version(r)), (("1.0", "1"), ("1.2", "1.10"), ("2", "1.9.9"))),
    Kind("query_string", 4, ("parse_query", "query_params"), "(query: str) -> dict[str, str]",
         "Parse a query like 'a=1${sep}b=x' (pairs separated by '$sep') into a dict of strings; a key without '=' "
         "maps to ''.",
         "    result = {}\n    for piece in query.split('$sep'):\n        if piece:\n            key, _, value = piece.partition('=')\n"
         "            result[key] = value\n    return result",
         lambda r, c: (c["sep"].join(r.choice((f"{word(r, 3, 5)}={word(r, 3, 5)}", f"{word(r, 3, 4)}={r.randint(0, 99)}",
                                          word(r, 3, 4))) for _ in range(r.randint(1, 4))),), (("",), ("flag",)),
         choose(sep=("&", ";"))),
    Kind("log_levels", 4, ("count_levels", "log_summary"), "(lines: list[str]) -> dict[str, int]",
         "Each line starts with a level word (such as INFO or ERROR) and a space; return how many lines each level has.",
         "    counts = {}\n    for line in lines:\n        level = line.split(' ', 1)[0]\n"
         "        counts[level] = counts.get(level, 0) + 1\n    return counts",
         lambda r, c: (log_lines(r),), (([],),)),
    Kind("camel_to_snake", 4, ("camel_to_snake", "to_snake_case"), "(name: str) -> str",
         "Convert a camelCase name to snake_case: each capital letter becomes '_' and its lowercase letter.",
         "    return ''.join('_' + c.lower() if c.isupper() else c for c in name)",
         lambda r, c: (camel(r),), (("",), ("x",))),
    Kind("snake_to_camel", 4, ("snake_to_camel", "to_camel_case"), "(name: str) -> str",
         "Convert a snake_case name to camelCase: the first word stays lowercase, the others are capitalised.",
         "    first, *rest = name.split('_')\n    return first + ''.join(part.capitalize() for part in rest)",
         lambda r, c: (snake(r),), (("",), ("one",))),
    Kind("to_base", 4, ("to_base", "in_base"), "(n: int) -> str",
         "Return the non-negative integer n written in base $k (digits 0-9 only).",
         "    if n == 0:\n        return '0'\n    digits = ''\n    while n:\n        digits = str(n % $k) + digits\n"
         "        n //= $k\n    return digits",
         lambda r, c: (r.randint(1, 500),), ((0,), (1,)), choose(k=(2, 3, 4, 5, 6, 7, 8, 9))),
    Kind("from_binary", 4, ("from_binary", "binary_value"), "(bits: str) -> int",
         "Return the value of a string of 0s and 1s read as a binary number, without calling int(bits, 2).",
         "    value = 0\n    for bit in bits:\n        value = value * 2 + (bit == '1')\n    return value",
         lambda r, c: ("".join(r.choice("01") for _ in range(r.randint(1, 10))),), (("0",), ("1",))),
    # Level 5: small algorithms.
    Kind("rle_encode", 5, ("rle_encode", "compress"), "(text: str) -> str",
         "Run-length encode text: each run of a repeated character becomes the character followed by the run's length.",
         "    if not text:\n        return ''\n    parts = []\n    current, count = text[0], 1\n    for c in text[1:]:\n"
         "        if c == current:\n            count += 1\n        else:\n            parts.append(f'{current}{count}')\n"
         "            current, count = c, 1\n    parts.append(f'{current}{count}')\n    return ''.join(parts)",
         lambda r, c: ("".join(r.choice("abc") * r.randint(1, 4) for _ in range(r.randint(1, 5))),), (("",), ("z",))),
    Kind("rle_decode", 5, ("rle_decode", "expand_runs"), "(code: str) -> str",
         "Decode text like 'a3b12c1' (a letter then its count) into the repeated letters: 'aaabbbbbbbbbbbbc'.",
         "    result, letter, digits = [], '', ''\n    for c in code:\n        if c.isdigit():\n            digits += c\n"
         "        else:\n            if letter:\n                result.append(letter * int(digits))\n            letter, digits = c, ''\n"
         "    if letter:\n        result.append(letter * int(digits))\n    return ''.join(result)",
         lambda r, c: ("".join(f"{r.choice('xyz')}{r.randint(1, 12)}" for _ in range(r.randint(1, 4))),), (("",),)),
    Kind("balanced", 5, ("balanced", "brackets_match"), "(text: str) -> bool",
         "Return True if the brackets (), [] and {} in text are balanced and properly nested; other characters are ignored.",
         "    pairs = {')': '(', ']': '[', '}': '{'}\n    stack = []\n    for c in text:\n        if c in '([{':\n"
         "            stack.append(c)\n        elif c in pairs:\n            if not stack or stack.pop() != pairs[c]:\n"
         "                return False\n    return not stack",
         lambda r, c: (bracket_text(r),), (("",), ("(]",), ("((",), ("x)",))),
    Kind("merge_intervals", 5, ("merge_intervals", "union_ranges"), "(intervals: list[list[int]]) -> list[list[int]]",
         "Merge overlapping or touching [start, end] intervals and return them sorted by start.",
         "    merged = []\n    for start, end in sorted(intervals):\n        if merged and start <= merged[-1][1]:\n"
         "            merged[-1][1] = max(merged[-1][1], end)\n        else:\n            merged.append([start, end])\n"
         "    return merged",
         lambda r, c: (intervals(r),), (([],), ([[1, 2], [2, 3]],))),
    Kind("word_wrap", 5, ("wrap", "word_wrap"), "(text: str) -> list[str]",
         "Break the words of text into lines of at most $k characters (words joined by single spaces); a longer word "
         "gets a line of its own.",
         "    lines, line = [], ''\n    for w in text.split():\n        if line and len(line) + 1 + len(w) > $k:\n"
         "            lines.append(line)\n            line = w\n        else:\n            line = f'{line} {w}' if line else w\n"
         "    if line:\n        lines.append(line)\n    return lines",
         lambda r, c: (sentence(r, 2, 9),), (("",), ("extraordinarily long",)), choose(k=tuple(range(6, 21)))),
    Kind("evaluate", 5, ("evaluate", "calculate"), "(expression: str) -> int",
         "Evaluate an expression of non-negative integers joined by +, - and * (spaces allowed), with * binding tighter; "
         "do not use eval.",
         "    tokens = expression.replace(' ', '')\n    total, term, number, op = 0, 1, 0, '+'\n    sign = 1\n"
         "    for c in tokens + '+':\n        if c.isdigit():\n            number = number * 10 + int(c)\n"
         "            continue\n        term = term * number if op == '*' else number\n        if c in '+-':\n"
         "            total += sign * term\n            sign = 1 if c == '+' else -1\n        op, number = c, 0\n    return total",
         lambda r, c: (" ".join(str(r.randint(0, 20)) + " " + r.choice("+-*") for _ in range(r.randint(1, 4)))
                       + " " + str(r.randint(0, 20)),), (("7",), ("2*3*4",), ("10-2*3",))),
    Kind("common_prefix", 5, ("common_prefix", "shared_start"), "(words: list[str]) -> str",
         "Return the longest prefix shared by all the words ('' for an empty list).",
         "    if not words:\n        return ''\n    prefix = words[0]\n    for w in words[1:]:\n"
         "        while not w.startswith(prefix):\n            prefix = prefix[:-1]\n    return prefix",
         lambda r, c: ([r.choice(("inter", "intra", "in", "under", "")) + word(r, 3, 5) for _ in range(r.randint(1, 4))],),
         (([],), (["same", "same"],))),
    Kind("two_sum", 5, ("two_sum", "pair_indices"), "(numbers: list[int], target: int) -> list[int]",
         "Return [i, j] with i < j and numbers[i] + numbers[j] == target, choosing the smallest j and then the smallest "
         "i; [] if no pair exists.",
         "    seen = {}\n    for j, n in enumerate(numbers):\n        if target - n in seen:\n            return [seen[target - n], j]\n"
         "        seen.setdefault(n, j)\n    return []",
         lambda r, c: (ints(r, 0, 12, 2, 7), r.randint(2, 20)), (([], 3), ([3, 3], 6))),
    Kind("spiral", 5, ("spiral", "spiral_order"), "(matrix: list[list[int]]) -> list[int]",
         "Return the items of a rectangular matrix in clockwise spiral order, starting at the top left.",
         "    result = []\n    rows = [list(row) for row in matrix]\n    while rows:\n        result += rows.pop(0)\n"
         "        rows = [list(row) for row in zip(*rows)][::-1]\n    return result",
         lambda r, c: (grid(r),), (([],), ([[1]],))),
    Kind("flood_count", 5, ("count_regions", "count_islands"), "(grid: list[str]) -> int",
         "grid is a list of equal-length strings of '$cell' and '.'; return how many groups of '$cell' cells there are, cells "
         "joining when they touch up, down, left or right.",
         "    seen = set()\n    regions = 0\n    for i, row in enumerate(grid):\n        for j, cell in enumerate(row):\n"
         "            if cell == '$cell' and (i, j) not in seen:\n                regions += 1\n                stack = [(i, j)]\n"
         "                while stack:\n                    a, b = stack.pop()\n"
         "                    if (a, b) in seen or not (0 <= a < len(grid) and 0 <= b < len(row)) or grid[a][b] != '$cell':\n"
         "                        continue\n                    seen.add((a, b))\n"
         "                    stack += [(a + 1, b), (a - 1, b), (a, b + 1), (a, b - 1)]\n    return regions",
         lambda r, c: ([row.replace("#", c["cell"]) for row in hash_grid(r)],),
         lambda c: (([],), (["..."],), ([f"{c['cell']}.{c['cell']}", f".{c['cell']}."],)), choose(cell=("#", "*", "o", "x"))),
)
