"""Built-in task families: determinism, split hygiene, difficulty, budgets, and content checks."""

from __future__ import annotations

import collections
import csv
import re

import pytest

from tidal.errors import TidalError, UnknownNameError
from tidal.tasks import generate_tasks, known_families, reference_answer
from tidal.tasks.families import knowledge
from tidal.types import Task

FAMILIES = ["code", "general", "knowledge", "math", "reasoning"]  # single-turn, sized for the tiny model
MULTI_TURN = ["agent"]  # tests/unit/agent covers it
REAL_PROBLEMS = ["code_fn", "math_word"]  # tests/unit/tasks/test_real_problem_families.py
VERIFIERS = {
    "code": "python_tests",
    "general": "regex",
    "knowledge": "exact_match",
    "math": "math",
    "reasoning": "exact_match",
}
PROMPT_BUDGET, ANSWER_BUDGET, CODE_BUDGET = 90, 40, 70


def test_known_families_lists_the_built_ins() -> None:
    assert known_families() == sorted(FAMILIES + MULTI_TURN + REAL_PROBLEMS)


def test_unknown_family_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="known: agent, code, code_fn, general, knowledge, math, math_word, reasoning"):
        generate_tasks("poetry", 3, "train", 0)


@pytest.mark.parametrize("low, high", [(0, 3), (2, 1), (1, 6)])
def test_invalid_difficulty_range_is_refused(low: int, high: int) -> None:
    with pytest.raises(TidalError, match="difficulty range"):
        generate_tasks("math", 3, "train", 0, low, high)


def test_invalid_split_and_count_are_refused() -> None:
    with pytest.raises(TidalError, match="split"):
        generate_tasks("math", 3, "test", 0)  # type: ignore[arg-type]
    with pytest.raises(TidalError, match=">= 0"):
        generate_tasks("math", -1, "train", 0)
    assert generate_tasks("math", 0, "train", 0) == []


@pytest.mark.parametrize("name", FAMILIES)
def test_same_arguments_give_identical_tasks(name: str) -> None:
    first = generate_tasks(name, 40, "train", 7, 1, 5)
    again = generate_tasks(name, 40, "train", 7, 1, 5)
    other_seed = generate_tasks(name, 40, "train", 8, 1, 5)
    assert [t.model_dump() for t in first] == [t.model_dump() for t in again]
    assert [t.prompt for t in first] != [t.prompt for t in other_seed]


@pytest.mark.parametrize("name", FAMILIES)
def test_more_tasks_extend_fewer(name: str) -> None:
    short = generate_tasks(name, 15, "eval", 3)
    long = generate_tasks(name, 30, "eval", 3)
    assert [t.model_dump() for t in short] == [t.model_dump() for t in long[:15]]


@pytest.mark.parametrize("name", FAMILIES)
def test_train_and_eval_never_share_content(name: str) -> None:
    # Different seeds and sizes on purpose: the split must not depend on either.
    train = generate_tasks(name, 600, "train", 0, 1, 5) + generate_tasks(name, 300, "train", 11, 1, 5)
    evaluation = generate_tasks(name, 250, "eval", 0, 1, 5) + generate_tasks(name, 90, "eval", 5, 2, 4)
    assert all(t.split == "train" for t in train) and all(t.split == "eval" for t in evaluation)
    train_keys = {t.metadata["key"] for t in train}
    eval_keys = {t.metadata["key"] for t in evaluation}
    assert train_keys and eval_keys and not train_keys & eval_keys
    assert not {t.prompt for t in train} & {t.prompt for t in evaluation}


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("low, high", [(1, 3), (2, 5), (4, 4)])
def test_difficulty_spread_evenly_and_ids_unique(name: str, low: int, high: int) -> None:
    tasks = generate_tasks(name, 31, "train", 2, low, high)
    counts = collections.Counter(t.difficulty for t in tasks)
    assert set(counts) == set(range(low, high + 1))
    assert max(counts.values()) - min(counts.values()) <= 1
    assert len({t.id for t in tasks}) == len(tasks)
    assert tasks[7].id == f"{name}/train-00007"
    assert all(t.metadata["family"] == name for t in tasks)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("split", ["train", "eval"])
def test_tasks_validate_and_fit_the_length_budget(name: str, split: str) -> None:
    for task in generate_tasks(name, 150, split, 4, 1, 5):
        assert Task.model_validate(task.model_dump()) == task
        assert task.domain == name and task.verifier.name == VERIFIERS[name]
        assert isinstance(task.prompt, str) and len(task.prompt) <= PROMPT_BUDGET, task.prompt
        budget = CODE_BUDGET if name == "code" else ANSWER_BUDGET
        assert task.reference and len(task.reference) <= budget, task.reference


def test_math_answers_are_right_and_difficulty_grades() -> None:
    for task in generate_tasks("math", 200, "train", 1, 1, 5):
        numbers = [int(n) for n in re.findall(r"\d+", task.prompt)]
        assert eval(task.metadata["key"]) == int(task.reference) >= 0  # keys are like "12+7-3"
        assert task.verifier.args == {"answer": task.reference}
        level = task.difficulty
        if level == 1:
            assert len(numbers) == 2 and max(numbers) <= 9
        elif level == 2:
            assert len(numbers) == 2 and numbers[0] >= 10 and numbers[1] <= 9
        elif level == 3:
            assert len(numbers) == 2 and min(numbers) >= 10
        elif level == 4:
            assert len(numbers) == 3
        else:
            assert "bags" in task.prompt


def test_code_difficulty_grades() -> None:
    for task in generate_tasks("code", 100, "train", 1, 1, 5):
        body = task.reference.splitlines()[1]
        assert task.limits.timeout_s == 10 and task.limits.memory_mb == 512
        assert task.verifier.args == {"entrypoint": "solution.py"}
        assert list(task.tests) == ["test_solution.py"]
        assert task.tests["test_solution.py"].count("assert ") == 4
        if task.difficulty == 1:
            assert "(" not in body and "(x)" in task.reference
        elif task.difficulty == 2:
            assert body.count("(") == 1
        elif task.difficulty == 3:
            assert "(xs)" in task.reference
        elif task.difficulty == 4:
            assert any(part in body for part in (" if ", "abs(", "max(x, ", "min(x, "))  # a conditional


def test_reasoning_answers_are_right() -> None:
    for task in generate_tasks("reasoning", 300, "train", 3, 1, 5):
        kind, content = task.metadata["key"].split("|")[:2]
        numbers = [int(n) for n in content.split()] if kind not in ("reverse", "letter", "length") else []
        expected = {
            "reverse": content[::-1],
            "length": str(len(content)),
            "sort": " ".join(map(str, sorted(numbers))),
            "largest": str(max(numbers or [0])),
            "smallest": str(min(numbers or [0])),
            "dedupe": " ".join(dict.fromkeys(map(str, numbers))),
        }.get(kind)
        if expected is not None:
            assert task.reference == expected, task.prompt
        if kind == "dedupe":
            assert len(set(numbers)) < len(numbers)  # there is something to remove
        assert task.verifier.args == {"answer": task.reference}


def test_reasoning_inputs_grow_with_difficulty() -> None:
    tasks = generate_tasks("reasoning", 500, "train", 3, 1, 5)
    mean_input = {
        level: sum(len(t.metadata["key"].split("|")[1]) for t in tasks if t.difficulty == level) / 100
        for level in range(1, 6)
    }
    assert all(mean_input[level] < mean_input[level + 1] for level in range(1, 5)), mean_input


def test_general_difficulty_grades() -> None:
    tasks = generate_tasks("general", 500, "train", 3, 1, 5)
    mean_answer = {
        level: sum(len(t.reference) for t in tasks if t.difficulty == level) / 100 for level in range(1, 6)
    }
    assert mean_answer[1] < mean_answer[2] < mean_answer[3] < min(mean_answer[4], mean_answer[5])


def _wrong_answers(task: Task) -> list[str]:
    """Answers of the right shape with the wrong content, and the right content in a wrong shape."""
    kind, word, count, _ = task.metadata["key"].split("|")
    reference = task.reference
    wrong = ["", reference + "x", reference.swapcase(), f"The answer is {reference}", word + "s"]
    wrong.append(reference.replace(word, "zebra").replace(word.upper(), "ZEBRA"))
    if kind.startswith("repeat"):
        wrong.append(reference.rsplit(",", 1)[0])  # one repetition too few
        wrong.append(reference + ", " + reference.split(",")[0])  # one too many
    if kind != "upper" and kind != "lower":
        wrong.append(word)  # the bare word, without the format
    return [w for w in wrong if w != reference]


def test_general_patterns_accept_the_reference_and_reject_wrong_answers() -> None:
    tasks = generate_tasks("general", 200, "train", 5, 1, 5) + generate_tasks("general", 50, "eval", 5, 1, 5)
    for task in tasks:
        pattern = re.compile(task.verifier.args["pattern"])
        assert pattern.fullmatch(task.reference) and pattern.search(task.reference)
        for wrong in _wrong_answers(task):
            assert not pattern.fullmatch(wrong) and not pattern.search(wrong), (task.prompt, wrong)


def test_general_patterns_tolerate_harmless_spacing() -> None:
    tasks = generate_tasks("general", 200, "train", 5, 3, 5)
    kinds = {t.metadata["kind"] for t in tasks}
    assert {"json", "json_length", "repeat"} <= kinds
    for task in tasks:
        pattern = re.compile(task.verifier.args["pattern"])
        if task.metadata["kind"] in ("json", "json_upper", "repeat", "repeat_upper"):
            spaced = task.reference.replace(": ", " :  ").replace(", ", " , ").replace("{", "{ ")
            assert pattern.fullmatch(spaced), (spaced, task.verifier.args["pattern"])
        if task.metadata["kind"] == "json_length":
            word, length = task.metadata["key"].split("|")[1], len(task.metadata["key"].split("|")[1])
            assert pattern.fullmatch(f'{{"length": {length}, "word": "{word}"}}')


def test_knowledge_table_is_well_formed() -> None:
    with knowledge.TABLE.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) >= 100
    assert len({(r["relation"], r["subject"]) for r in rows}) == len(rows)
    assert all(r["answer"].strip() == r["answer"] and r["answer"] for r in rows)
    assert {r["relation"] for r in rows} == set(knowledge.RELATIONS)
    assert all(len(phrasings) >= 3 for _, phrasings in knowledge.RELATIONS.values())


def test_knowledge_eval_facts_are_taught_in_train_with_another_phrasing() -> None:
    facts = [fact for level in knowledge.load_facts().values() for fact in level]
    for fact in facts:
        count = len(knowledge.RELATIONS[fact.relation][1])
        splits = [knowledge.split_of(f"{fact.relation}|{fact.subject}|{p}") for p in range(count)]
        assert splits.count("eval") == 1 and splits.count("train") == count - 1
    train = generate_tasks("knowledge", 1000, "train", 0, 1, 5)
    evaluation = generate_tasks("knowledge", 200, "eval", 0, 1, 5)
    trained_facts = {t.metadata["key"].rsplit("|", 1)[0] for t in train}
    assert {t.metadata["key"].rsplit("|", 1)[0] for t in evaluation} <= trained_facts
    assert len(trained_facts) == len(facts)
    for task in evaluation:
        assert task.verifier.args["answer"] == task.reference
        assert isinstance(task.verifier.args["aliases"], list)


def test_reference_answer_wraps_code_only() -> None:
    code_task = generate_tasks("code", 1, "train", 0)[0]
    assert reference_answer(code_task) == "```python\n" + code_task.reference + "```"
    math_task = generate_tasks("math", 1, "train", 0)[0]
    assert reference_answer(math_task) == math_task.reference
