"""`knowledge`: short factual questions from the table `tasks/data/knowledge.csv`.

A model cannot answer a fact it never saw, so eval here measures something narrower than new
knowledge: whether a fact learned under one phrasing is recalled under another. The split is
therefore by (fact, phrasing): for every fact exactly one phrasing, chosen by a stable hash, is
held out for eval, and the fact's other phrasings are train. A large enough train set covers
every fact; a small one (n well below the number of train items) may miss some.

Difficulty is by relation, roughly how memorable its answers are to a model that starts from
nothing: irregular plurals share letters with the question, element symbols and baby-animal
names do not.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tidal.tasks.families.registry import Draft, Split, family, stable_fraction

TABLE = Path(__file__).resolve().parent.parent / "data" / "knowledge.csv"

# relation -> (difficulty, question phrasings)
RELATIONS: dict[str, tuple[int, tuple[str, ...]]] = {
    "plural": (1, (
        "What is the plural of {s}?",
        "Give the plural form of {s}.",
        "One {s}, two what?",
        "What do you call more than one {s}?",
    )),
    "opposite": (2, (
        "What is the opposite of {s}?",
        "Give the opposite of {s}.",
        "Which word means the opposite of {s}?",
    )),
    "capital": (3, (
        "What is the capital of {s}?",
        "Name the capital city of {s}.",
        "Which city is the capital of {s}?",
        "{s} has which city as its capital?",
    )),
    "symbol": (4, (
        "What is the chemical symbol for {s}?",
        "Give the symbol of the element {s}.",
        "Which element symbol stands for {s}?",
    )),
    "baby": (5, (
        "What is a baby {s} called?",
        "A young {s} is called what?",
        "What do you call a baby {s}?",
    )),
}


@dataclass(frozen=True)
class Fact:
    relation: str
    subject: str
    answer: str
    aliases: tuple[str, ...]


@lru_cache(maxsize=1)
def load_facts() -> dict[int, tuple[Fact, ...]]:
    """The table grouped by difficulty level, in file order."""
    by_level: dict[int, list[Fact]] = {}
    with TABLE.open(encoding="utf-8", newline="") as handle:
        for row_number, row in enumerate(csv.DictReader(handle), start=2):
            if row["relation"] not in RELATIONS:
                raise ValueError(f"{TABLE}:{row_number}: unknown relation {row['relation']!r}")
            aliases = tuple(a for a in (row["aliases"] or "").split("|") if a)
            fact = Fact(row["relation"], row["subject"], row["answer"], aliases)
            by_level.setdefault(RELATIONS[fact.relation][0], []).append(fact)
    return {level: tuple(facts) for level, facts in by_level.items()}


def eval_phrasing(relation: str, subject: str) -> int:
    """The index of the one phrasing of this fact that is held out for eval."""
    count = len(RELATIONS[relation][1])
    return int(stable_fraction(f"knowledge\x00{relation}|{subject}") * count)


def split_of(key: str) -> Split:
    relation, subject, phrasing = key.split("|")
    return "eval" if int(phrasing) == eval_phrasing(relation, subject) else "train"


@family("knowledge", split_of=split_of)
def make_knowledge(rng: random.Random, difficulty: int) -> Draft:
    fact = rng.choice(load_facts()[difficulty])
    phrasings = RELATIONS[fact.relation][1]
    phrasing = rng.randrange(len(phrasings))
    verifier = {"name": "exact_match", "answer": fact.answer, "aliases": list(fact.aliases)}
    return Draft(
        key=f"{fact.relation}|{fact.subject}|{phrasing}",
        prompt=phrasings[phrasing].format(s=fact.subject),
        reference=fact.answer,
        verifier=verifier,
        metadata={"relation": fact.relation, "phrasing": phrasing},
    )
