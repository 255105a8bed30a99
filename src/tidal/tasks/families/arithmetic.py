"""`math`: one-line arithmetic word problems with an exact integer answer.

Levels: 1 single-digit sums; 2 two-digit +/- one-digit; 3 two-digit +/- two-digit; 4 a + b - c;
5 small products. Results are never negative. The content key is the arithmetic alone, so an eval
problem is a new combination of numbers told with the same handful of sentence templates.
"""

from __future__ import annotations

import random

from tidal.tasks.families.registry import Draft, family

NAMES = ("Ann", "Bob", "Eva", "Tom", "Mia", "Sam", "Lea", "Max")
OBJECTS = ("apples", "pens", "books", "coins", "cards", "shells", "stamps", "eggs")
GAIN_VERBS = ("buys", "finds", "gets", "picks up")
LOSS_VERBS = ("gives away", "loses", "sells")

ADD = "{n} has {a} {o} and {verb} {b} more. How many {o} does {n} have?"
SUB = "{n} has {a} {o} and {verb} {b}. How many {o} does {n} have left?"
ADD_SUB = "{n} has {a} {o}, {gain} {b} more and {loss} {c}. How many {o} now?"
MUL = "{n} has {a} bags with {b} {o} in each. How many {o} in all?"


def _draft(key: str, prompt: str, value: int) -> Draft:
    return Draft(key, prompt, str(value), {"name": "math", "answer": str(value)})


def _add(rng: random.Random, name: str, obj: str, a: int, b: int) -> Draft:
    prompt = ADD.format(n=name, a=a, o=obj, verb=rng.choice(GAIN_VERBS), b=b)
    return _draft(f"{a}+{b}", prompt, a + b)


def _subtract(rng: random.Random, name: str, obj: str, a: int, b: int) -> Draft:
    a, b = max(a, b), min(a, b)  # results stay non-negative
    prompt = SUB.format(n=name, a=a, o=obj, verb=rng.choice(LOSS_VERBS), b=b)
    return _draft(f"{a}-{b}", prompt, a - b)


@family("math")
def make_math(rng: random.Random, difficulty: int) -> Draft:
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    if difficulty == 1:
        return _add(rng, name, obj, rng.randint(1, 9), rng.randint(1, 9))
    if difficulty in (2, 3):
        a = rng.randint(10, 99)
        b = rng.randint(1, 9) if difficulty == 2 else rng.randint(10, 99)
        operation = _add if rng.random() < 0.5 else _subtract
        return operation(rng, name, obj, a, b)
    if difficulty == 4:
        a, b = rng.randint(10, 60), rng.randint(2, 30)
        c = rng.randint(2, a + b)
        gain, loss = rng.choice(GAIN_VERBS), rng.choice(LOSS_VERBS)
        prompt = ADD_SUB.format(n=name, a=a, o=obj, gain=gain, b=b, loss=loss, c=c)
        return _draft(f"{a}+{b}-{c}", prompt, a + b - c)
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    return _draft(f"{a}*{b}", MUL.format(n=name, a=a, b=b, o=obj), a * b)
