"""Check 9, paraphrases across splits: real rewordings of a task in the other split are found,
with their similarity; templated siblings and distinct tasks with the same answer are not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidal.audit import audit_tasks
from tidal.audit.paraphrase import ParaphraseIndex, content_words, numbers, stem
from tidal.config.schema import AuditConfig
from tidal.tasks import generate_tasks, write_tasks
from tidal.types import Task

PALINDROME_TESTS = ("from solution import is_palindrome\n\n\ndef test_words():\n    assert is_palindrome('level') == True\n"
                    "    assert is_palindrome('kayak') == True\n    assert is_palindrome('tidal') == False\n"
                    "    assert is_palindrome('noon') == True\n")


def text(task_id: str, split: str, prompt: str, answer: str, verifier: str = "exact_match") -> Task:
    return Task.model_validate({"id": task_id, "domain": "knowledge", "split": split, "prompt": prompt,
                                "verifier": {"name": verifier, "answer": answer}, "reference": answer})


def code(task_id: str, split: str, prompt: str, reference: str) -> Task:
    return Task.model_validate({"id": task_id, "domain": "code", "split": split, "prompt": prompt,
                                "verifier": {"name": "python_tests"}, "tests": {"test_solution.py": PALINDROME_TESTS},
                                "reference": reference})


PARAPHRASES = [
    (text("a", "eval", "Which river is the longest river that flows entirely within the borders of Italy, from the Alps "
          "to the Adriatic Sea?", "Po"),
     text("b", "train", "Name the longest river flowing wholly inside Italy's borders, running from the Alps to the "
          "Adriatic.", "Po")),
    (text("a", "eval", "Ann has 12 apples and buys 30 more. How many apples does Ann have?", "42", "math"),
     text("b", "train", "If Ann owns 12 apples and then purchases another 30, how many apples does she have now?", "42",
          "math")),
    (text("a", "eval", "Who wrote the novel Pride and Prejudice, published in 1813?", "Jane Austen"),
     text("b", "train", "The 1813 novel Pride and Prejudice was written by which author?", "Jane Austen")),
    (text("a", "eval", "A train travels 60 km in 1.5 hours. What is its average speed in km per hour?", "40", "math"),
     text("b", "train", "A car covers 60 km in 1.5 hours. What is its mean speed in km/h?", "40", "math")),
    # A reworded code task with a reworded reference: the same tests make it the same problem.
    (code("a", "eval", "Write a Python function is_palindrome(s) that returns True when the string s reads the same "
          "forwards and backwards.", "def is_palindrome(s):\n    return s == s[::-1]\n"),
     code("b", "train", "Implement is_palindrome(s): return True if the string s is identical when reversed, otherwise "
          "False.", "def is_palindrome(word):\n    return list(word) == list(reversed(word))\n")),
]

DISTINCT = [
    # Templated siblings: the same answer by chance, other numbers (or the same numbers in another order).
    (text("a", "eval", "Lea has 7 cards and picks up 5 more. How many cards does Lea have?", "12", "math"),
     text("b", "train", "Lea has 5 shells and finds 7 more. How many shells does Lea have?", "12", "math")),
    (text("a", "eval", "Ann has 12 apples and buys 30 more. How many apples does Ann have?", "42", "math"),
     text("b", "train", "Ann has 20 apples and buys 22 more. How many apples does Ann have?", "42", "math")),
    # Different questions with the same short answer.
    (text("a", "eval", "Which river flows through Turin?", "Po"),
     text("b", "train", "Which river is the longest river that flows entirely within the borders of Italy?", "Po")),
    (text("a", "eval", "Which letter comes first in log?", "l"), text("b", "train", "What is the first letter of lion?", "l")),
    # Worded alike, different answers.
    (text("a", "eval", "Which city is the capital of France?", "Paris"),
     text("b", "train", "Name the capital city of Germany.", "Berlin")),
    (text("a", "eval", "Reply with BREAD in lower case.", "bread"), text("b", "train", "Reply with bread in upper case.", "BREAD")),
]


def audit(tasks: list[Task], tmp_path: Path, **config: Any) -> dict:
    path = tmp_path / "tasks.jsonl"
    write_tasks(tasks, path)
    return audit_tasks([path], AuditConfig(**config), checks=["duplicates"], progress=False).by_id()


def test_normalisation() -> None:
    assert [stem(w) for w in ("flows", "flowing", "flowed", "running", "cities", "speed", "boss")] == [
        "flow", "flow", "flow", "run", "city", "speed", "boss"]
    assert content_words("The Alps, the ALPS; 1,000 and 1000.0!") == {"alp", "1000"}
    assert numbers("7 cards and 5 more") != numbers("5 shells and 7 more")


@pytest.mark.parametrize("pair", range(len(PARAPHRASES)))
def test_paraphrases_across_splits_are_found(pair: int, tmp_path: Path) -> None:
    first, second = PARAPHRASES[pair]
    by_id = audit([first, second], tmp_path)
    [finding] = by_id["b"].findings
    assert (finding.severity, finding.evidence["kind"], finding.evidence["duplicate_of"]) == ("warn", "paraphrase", "a")
    assert finding.evidence["across_splits"] and 0 < finding.evidence["similarity"] < 0.8
    assert "similarity" in finding.message


@pytest.mark.parametrize("pair", range(len(DISTINCT)))
def test_distinct_tasks_are_not_paraphrases(pair: int, tmp_path: Path) -> None:
    first, second = DISTINCT[pair]
    by_id = audit([first, second], tmp_path)
    assert by_id["b"].findings == []


def test_only_across_splits_and_the_threshold_is_config(tmp_path: Path) -> None:
    first, second = PARAPHRASES[0]
    assert audit([first, second.model_copy(update={"split": "eval"})], tmp_path)["b"].findings == []
    assert audit([first, second], tmp_path, paraphrase_jaccard=0.9)["b"].findings == []


def test_the_index_finds_a_paraphrase_among_many() -> None:
    index = ParaphraseIndex(threshold=0.4)
    others = generate_tasks("reasoning", 300, "train", 0)
    first, second = PARAPHRASES[2]
    for task in [*others, first]:
        _, bands, entry = index.match(task, task.prompt, frozenset({task.id}))
        index.add(bands, entry)
    found, _, _ = index.match(second, second.prompt, frozenset({"a", "b"}))
    assert found is not None and found.other_id == "a" and found.similarity == 0.5


@pytest.mark.parametrize("family", ["math", "reasoning", "general", "code", "agent"])
def test_built_in_families_have_no_paraphrases_across_splits(family: str, tmp_path: Path) -> None:
    tasks = [t for split in ("train", "eval") for t in generate_tasks(family, 60, split, 0, 1, 5)]  # type: ignore[arg-type]
    by_id = audit(tasks, tmp_path)
    assert not [a.task_id for a in by_id.values() for f in a.findings if f.evidence.get("kind") == "paraphrase"]
