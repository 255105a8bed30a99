"""The benchmark-style held-out sets (configs/data/bench_*.jsonl, issue 44): they import through the
`code-tests` and `qa` formats, every code reference passes its tests in the sandbox, every math
answer parses and scores, the files are what scripts/bench_sets.py writes, and the auditor's
duplicate check finds no bench problem in the generators' train split."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tidal.audit.duplicates import DuplicateIndex
from tidal.config.schema import RewardConfig
from tidal.errors import SandboxUnavailableError
from tidal.reward.registry import known_verifiers
from tidal.reward.scorer import Scorer
from tidal.reward.verifiers.math_answer import parse_number
from tidal.sandbox import get_backend
from tidal.tasks import generate_tasks, reference_answer
from tidal.tasks.importers import import_tasks
from tidal.types import Limits

ROOT = Path(__file__).resolve().parents[3]
CODE, MATH = ROOT / "configs/data/bench_code.jsonl", ROOT / "configs/data/bench_math.jsonl"


def _code():
    return import_tasks(CODE, "code-tests", split="test", known_verifiers=known_verifiers())


def _math():
    return import_tasks(MATH, "qa", split="test", known_verifiers=known_verifiers())


def test_files_are_what_the_script_writes() -> None:
    spec = importlib.util.spec_from_file_location("bench_sets", ROOT / "scripts/bench_sets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    code = [module.code_row(i, *p) for i, p in enumerate(module.CODE)]
    maths = [module.math_row(*p) for p in module.MATH]
    assert [json.loads(line) for line in CODE.read_text().splitlines()] == code
    assert [json.loads(line) for line in MATH.read_text().splitlines()] == maths


def test_math_set_imports_and_every_answer_parses_and_scores() -> None:
    tasks = _math()
    assert len(tasks) >= 100 and {t.split for t in tasks} == {"eval"} and {t.domain for t in tasks} == {"math"}
    scorer = Scorer(RewardConfig(), backend=None)
    try:
        scores = scorer.score_many([(t, reference_answer(t)) for t in tasks])
    finally:
        scorer.close()
    for task, score in zip(tasks, scores):
        assert task.verifier.name == "math" and parse_number(task.verifier.args["answer"]) is not None, task.id
        assert score.value == 1.0, (task.id, score)


def test_every_code_reference_passes_in_the_sandbox() -> None:
    try:
        get_backend("bwrap").run(["/bin/true"], {}, Limits(timeout_s=20))
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")
    tasks = _code()
    assert len(tasks) >= 100 and {t.split for t in tasks} == {"eval"} and {t.domain for t in tasks} == {"code"}
    scorer = Scorer(RewardConfig(), backend=get_backend("bwrap"))
    try:
        scores = scorer.score_many([(t, reference_answer(t)) for t in tasks])
        wrong = scorer.score_many([(t, f"```python\ndef {t.metadata['entry_point']}(*args):\n    return None\n```")
                                   for t in tasks[:10]])
    finally:
        scorer.close()
    assert [t.id for t, s in zip(tasks, scores) if s.value != 1.0] == []
    assert all(s.value == 0.0 for s in wrong)


def test_no_bench_problem_is_in_the_generators_train_split() -> None:
    index = DuplicateIndex()
    train = [t for family in ("code", "code_fn", "math", "math_word")
             for t in generate_tasks(family, 250, "train", 1234, 1, 5)]
    for task in train:
        index.check(task)
    bench = _code() + _math()
    findings = [(t.id, f.message) for t in bench for f in index.check(t) if f.evidence.get("across_splits")]
    assert findings == []
    control = DuplicateIndex()  # the check does see a bench problem that is also in train
    control.check(bench[0].model_copy(update={"id": "copy", "split": "train"}))
    assert control.check(bench[0])


def test_the_real_model_main_job_evaluates_on_the_bench_sets() -> None:
    from tidal.config.load import load_config
    from tidal.tasks.importers import load_sources

    domains = load_config(ROOT / "configs/quickstart_smollm2.yaml").tasks.domains
    for name, size in (("code_bench", len(_code())), ("math_bench", len(_math()))):
        tasks = load_sources([s.model_dump() for s in domains[name].sources], known_verifiers=known_verifiers())
        assert domains[name].weight == 0 and len(tasks) == size and {t.split for t in tasks} == {"eval"}
