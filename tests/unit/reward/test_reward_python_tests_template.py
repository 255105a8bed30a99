"""python_tests from a template (pytest_template.py): a task's tests collected once per zygote and
forked once per answer score every answer exactly as a pytest session of its own does, in both
modes, whatever the answer does at import; tests a template cannot stand in for run whole
sessions."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tidal.reward import ScoringContext, get_verifier
from tidal.reward.verifiers import python_tests
from tidal.reward.verifiers.process_mode import template_problems
from tidal.reward.verifiers.python_tests import python_tests_batch
from tidal.sandbox.pool import SandboxPool
from tidal.types import Outcome, Score, Task

TESTS = {
    "test_a.py": "from solution import sum_evens\nimport solution as s\n\n\n"
                 "def test_basic():\n    assert sum_evens([1, 2, 3, 4]) == 6\n\n\n"
                 "def test_module():\n    assert s.sum_evens([]) == 0\n",
    "test_b.py": "import pytest\n\nfrom solution import sum_evens as se\n\n\n"
                 "@pytest.mark.parametrize('xs, want', [([2], 2), ([-2, 3], -2)])\n"
                 "def test_more(xs, want):\n    assert se(xs) == want\n",
    "test_c.py": "def test_without_the_answer():\n    assert 1 + 1 == 2\n",
    "conftest.py": "import pytest\n\n\n@pytest.fixture\ndef numbers():\n    return [1, 2]\n",
}
CORRECT = "def sum_evens(xs):\n    return sum(x for x in xs if x % 2 == 0)\n"
ANSWERS = {
    "correct": CORRECT,
    "wrong": "def sum_evens(xs):\n    return 0\n",
    "partly right": "def sum_evens(xs):\n    return sum(x for x in xs if x % 2 == 0 and x > 0)\n",
    "syntax error": "def sum_evens(xs) return 0\n",
    "missing name": "def other(xs):\n    return 0\n",
    "raises at import": "raise ValueError('not today')\n" + CORRECT,
    "memory at import": "blob = bytearray(8 * 1024 ** 3)\n" + CORRECT,
    # Fails the first import only: pytest imports it again for the next test module, and so must a template.
    "fails once": "import os\nif not os.path.exists('flag'):\n    open('flag', 'w').close()\n"
                  "    raise ImportError('the first time')\n" + CORRECT,
    "exits at import": "import os\nos._exit(3)\n",
    "hangs": "def sum_evens(xs):\n    while True:\n        pass\n",
    "daemon": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\n    os._exit(0)\n" + CORRECT,
}


def task(mode: str, tests: dict[str, str] | None = None) -> Task:
    return Task(id=f"code/template-{mode}", domain="code", prompt="Write sum_evens(xs).",
                verifier={"name": "python_tests", "mode": mode}, tests=tests or TESTS, limits={"timeout_s": 4})


@pytest.fixture
def pool(sandboxed: ScoringContext) -> Iterator[SandboxPool]:
    with SandboxPool(sandboxed.sandbox(), size=1) as pool:
        yield pool


def outcomes(scores: list[Score]) -> list[tuple[float, Outcome]]:
    return [(round(score.value, 6), score.outcome) for score in scores]


@pytest.mark.parametrize("mode", ["in_process", "out_of_process"])
def test_a_template_scores_every_answer_as_a_session_of_its_own(
    pool: SandboxPool, sandboxed: ScoringContext, mode: str
) -> None:
    answers = list(ANSWERS.values())
    batched = python_tests_batch(task(mode), answers, ScoringContext(pool))  # type: ignore[arg-type]
    assert pool.stats.templates == 1 and pool.stats.unvouched == 0  # one template served them all
    assert pool.stats.from_bases == 0  # a task with a conftest.py gets a template started alone
    with ThreadPoolExecutor(max_workers=2) as threads:  # two sandboxes at a time, as a scorer runs them
        single = list(threads.map(lambda answer: get_verifier("python_tests")(task(mode), answer, sandboxed), answers))
    for name, one, alone in zip(ANSWERS, batched, single):
        assert (round(one.value, 6), one.outcome) == (round(alone.value, 6), alone.outcome), (name, one.detail, alone.detail)
        assert one.info.get("tamper") == alone.info.get("tamper") or name == "daemon", name
        if name == "wrong":  # the same evidence: pytest's crash line, then the exception
            assert one.info["failure"] == alone.info["failure"] and ".py:" in one.info["failure"].split("\n")[0]
        if name == "syntax error":  # a collection error ends the session as failed (1), not interrupted (2)
            assert one.info["exit_code"] == alone.info["exit_code"] == 1, (one.info, alone.info)
            assert "SyntaxError" in one.info["failure"] and "SyntaxError" in alone.info["failure"]
    verdicts = dict(zip(ANSWERS, outcomes(batched)))
    assert verdicts["correct"] == (1.0, Outcome.PASSED) and verdicts["wrong"] == (0.4, Outcome.FAILED)
    assert verdicts["hangs"][1] is Outcome.TIMEOUT and verdicts["daemon"][1] is Outcome.TAMPERED
    assert verdicts["memory at import"][1] is Outcome.MEMORY_LIMIT
    if mode == "in_process":  # the failed import is the first test module's collection error only...
        failing = batched[list(ANSWERS).index("fails once")].info["failing"]
        assert "test_a.py::test_basic (did not run)" in failing
        assert "test_b.py::test_more[xs0-2] (did not run)" in failing  # ...the second one was collected


def evidence(score: Score) -> tuple[Any, ...]:
    info = score.info
    return (round(score.value, 6), score.outcome, info.get("tamper"), info.get("failure"), info.get("failing"),
            info.get("exit_code"))


@pytest.mark.parametrize("mode", ["in_process", "out_of_process"])
def test_a_template_forked_from_a_base_scores_as_one_started_alone(
    pool: SandboxPool, sandboxed: ScoringContext, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tasks without a conftest.py or pytest configuration get templates forked from the zygote's
    # base (pytest configured and its session started, before collection), one base for them all.
    tests = {name: text for name, text in TESTS.items() if name != "conftest.py"}
    other = {"test_d.py": "from solution import sum_evens\n\n\ndef test_d():\n    assert sum_evens([4]) == 4\n"}
    answers = [answer for name, answer in ANSWERS.items() if name not in ("hangs", "daemon")]
    from_base = python_tests_batch(task(mode, tests), answers, ScoringContext(pool))  # type: ignore[arg-type]
    second = python_tests_batch(task(mode, other), [CORRECT, ANSWERS["wrong"]], ScoringContext(pool))  # type: ignore[arg-type]
    assert (pool.stats.started, pool.stats.templates, pool.stats.from_bases, pool.stats.unvouched) == (1, 2, 2, 0)
    assert outcomes(second) == [(1.0, Outcome.PASSED), (0.0, Outcome.FAILED)]
    monkeypatch.setattr(python_tests, "_base", lambda *args: None)
    with SandboxPool(sandboxed.sandbox(), size=1) as alone_pool:
        alone = python_tests_batch(task(mode, tests), answers, ScoringContext(alone_pool))  # type: ignore[arg-type]
        assert (alone_pool.stats.templates, alone_pool.stats.from_bases) == (1, 0)
    assert [evidence(score) for score in from_base] == [evidence(score) for score in alone]
    assert outcomes(from_base)[0] == (1.0, Outcome.PASSED)


def test_tests_that_need_the_answer_while_imported_run_whole_sessions(pool: SandboxPool) -> None:
    tests = {"test_a.py": "from solution import sum_evens\nEXPECTED = sum_evens([2])\n\n\n"
                          "def test_basic():\n    assert sum_evens([1, 2, 3, 4]) == 6\n"}
    scores = python_tests_batch(task("in_process", tests), [CORRECT, ANSWERS["wrong"]], ScoringContext(pool))  # type: ignore[arg-type]
    assert outcomes(scores) == [(1.0, Outcome.PASSED), (0.0, Outcome.FAILED)]
    assert pool.stats.templates == 0


# What an answer's process out of process must not start with: it is a fork of the zygote's nursery,
# and every module the nursery holds is page tables each such fork copies and each exit tears down
# (docs/design/sandbox.md, "Cost").
NOT_IN_THE_NURSERY = ("typing", "dataclasses", "inspect", "pathlib", "shutil", "platform", "pytest")


def test_an_answers_process_out_of_process_starts_lean(pool: SandboxPool) -> None:
    answer = ("import sys\n\n\ndef inherited():\n"
              f"    return sorted(name for name in {NOT_IN_THE_NURSERY!r} if name in sys.modules)\n")
    tests = {"test_a.py": "from solution import inherited\n\n\ndef test_lean():\n    assert inherited() == []\n"}
    (score,) = python_tests_batch(task("out_of_process", tests), [answer], ScoringContext(pool))  # type: ignore[arg-type]
    assert pool.stats.templates == 1  # a template's job, with the nursery's companion
    assert (score.value, score.outcome) == (1.0, Outcome.PASSED), score.detail


def test_template_problems() -> None:
    paths = ["test_a.py", "test_b.py", "test_c.py"]
    assert template_problems("in_process", "solution.py", TESTS, {}, paths) == []
    assert template_problems("out_of_process", "solution.py", TESTS, {}, paths) == []
    hooks = {**TESTS, "conftest.py": "def pytest_collection_modifyitems(items):\n    items.reverse()\n"}
    assert "conftest.py: line 1: defines the hook pytest_collection_modifyitems" in template_problems(
        "out_of_process", "solution.py", hooks, {}, paths)
    for source, why in [
        ("from solution import f\nX = f(1)\n", "uses f while the module is imported"),
        ("from solution import f\n\n@f\ndef test_a():\n    pass\n", "uses f while the module is imported"),
        ("from solution import f\n\ndef test_a(g=f):\n    pass\n", "uses f while the module is imported"),
        ("from solution import f\n\nclass TestX:\n    g = f\n", "uses f while the module is imported"),
        ("try:\n    from solution import f\nexcept ImportError:\n    f = None\n", "under a statement or in a class"),
        ("from solution import *\n", "imports * from solution"),
        ("from solution import test_helper\n", "imports test_helper from solution"),
        ("import importlib\nM = importlib.import_module('solution')\n", "names the module 'solution'"),
    ]:
        found = template_problems("in_process", "solution.py", {"test_a.py": source}, {}, ["test_a.py"])
        assert any(why in problem for problem in found), (source, found)
    helper = template_problems("in_process", "solution.py", {"test_a.py": "def test_a():\n    pass\n",
                                                             "helpers.py": "from solution import f\n"}, {}, ["test_a.py"])
    assert helper == ["helpers.py: line 1: imports solution but pytest does not collect it"]
    assert template_problems("in_process", "solution.py", TESTS, {"pytest.ini": "[pytest]\n"}, paths) == [
        "pytest.ini: a pytest configuration file"]


def test_a_plugin_from_the_workspace_is_still_reported(pool: SandboxPool, sandboxed: ScoringContext) -> None:
    # The report plugin names only plugins registered from the workspace (not pytest's own): one
    # that is not a conftest the task shipped is a tamper signal, alone and in a zygote alike.
    tests = {"test_a.py": "pytest_plugins = ['helper_plugin']\n\n\ndef test_a():\n    assert True\n",
             "helper_plugin.py": "def pytest_configure(config):\n    pass\n"}
    one = get_verifier("python_tests")(task("in_process", tests), CORRECT, sandboxed)
    batched = python_tests_batch(task("in_process", tests), [CORRECT, CORRECT + "\n"], ScoringContext(pool))  # type: ignore[arg-type]
    for score in [one, *batched]:
        assert score.outcome is Outcome.TAMPERED
        assert "a pytest plugin was registered from helper_plugin.py" in score.info["tamper"]


FIXTURE_SCAN = """
import sys, types
sys.path.insert(0, sys.argv[1])
import pytest
from tidal.reward.verifiers import python_tests, pytest_template

for name in python_tests.PRELOAD:  # what a zygote has imported when it indexes the plugins
    if not name.startswith(("companion:", "tidal_")):
        __import__(name)
indexed = sys.argv[3] == "indexed"
if indexed:
    pytest_template._index_plugins()
    import _pytest.fixtures
    assert _pytest.fixtures.dir is pytest_template._scan_names
    served, objects = [], []
    original = pytest_template._scan_names
    def counting(holder):
        names = original(holder)
        served.append(pytest_template._SCANNED.get(id(holder), (None,))[0] is holder)
        objects.append(not isinstance(holder, type) and type(holder) in pytest_template._SCANNED_TYPES)
        return names
    _pytest.fixtures.dir = counting

class Record:
    def pytest_collection_finish(self, session):
        manager = session._fixturemanager
        self.defs = [(d.argname, d.func.__module__, d.func.__qualname__, d.scope)
                     for d in manager._get_all_fixture_defs()]
        self.autouse = [list(names) for names in manager._node_autousenames.values()]

record = Record()
code = pytest.main(["-q", "-p", "no:cacheprovider", sys.argv[2]], plugins=[record])
print(repr((int(code), record.defs, record.autouse, (sum(served), sum(objects)) if indexed else None)))
"""


def test_the_zygote_index_of_plugin_fixtures_registers_what_a_full_scan_does(tmp_path: Path) -> None:
    # pytest_template._index_plugins shows pytest's fixture scan only the names it acts on: every
    # fixture (pytest's tmp_path, capsys, ..., and a wrapped one) must be registered as without it.
    tests = tmp_path / "test_fixtures.py"
    tests.write_text("import functools\nimport pytest\n\n\n@pytest.fixture\ndef base():\n    return 1\n\n\n"
                     "def test_uses(tmp_path, capsys, monkeypatch, base):\n    assert base == 1\n")
    src = str(Path(__file__).resolve().parents[3] / "src")
    runs = {}
    for mode in ("plain", "indexed"):
        done = subprocess.run([sys.executable, "-c", FIXTURE_SCAN, src, str(tests), mode], capture_output=True,
                              text=True, cwd=tmp_path, timeout=120, check=False)
        runs[mode] = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    (code, defs, autouse, _), (code2, defs2, autouse2, (served, objects)) = runs["plain"], runs["indexed"]
    assert code == code2 == 0
    assert defs2 == defs and autouse2 == autouse
    assert {"tmp_path", "capsys", "monkeypatch", "base"} <= {d[0] for d in defs}
    assert served >= 20  # pytest's own plugin modules came from the index
    assert objects >= 5  # and plugin objects (the session, the terminal reporter, ...) from their classes' index


def test_the_index_of_modules_imported_since_the_last_one_is_what_a_full_rescan_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A template (and a base) indexes only the modules imported since the index its zygote (or
    # base) made whole; inspect's index must come out as a rescan of every module makes it.
    import inspect

    from tidal.reward.verifiers import pytest_template

    monkeypatch.setattr(inspect, "_filesbymodname", {})
    monkeypatch.setattr(inspect, "modulesbyfile", {})
    monkeypatch.setattr(pytest_template, "_INDEXED", [])
    monkeypatch.syspath_prepend(str(tmp_path))
    pytest_template._index_modules()  # the zygote's: a full rescan
    assert pytest_template._INDEXED == [next(reversed(sys.modules))]
    for name in ("tidal_index_probe_a", "tidal_index_probe_b"):
        (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
        monkeypatch.delitem(sys.modules, name, raising=False)
        __import__(name)
    pytest_template._index_modules()  # a template's: the two new modules only
    incremental = (dict(inspect._filesbymodname), dict(inspect.modulesbyfile))  # type: ignore[attr-defined]
    assert str(tmp_path / "tidal_index_probe_b.py") in inspect.modulesbyfile
    inspect._filesbymodname.clear()  # type: ignore[attr-defined]
    inspect.modulesbyfile.clear()
    inspect.getmodule(None, "<no such file>")
    assert incremental == (inspect._filesbymodname, inspect.modulesbyfile)  # type: ignore[attr-defined]
    # The name it stopped at is gone from sys.modules: it cannot tell what is new, and rescans.
    monkeypatch.setattr(pytest_template, "_INDEXED", ["tidal_index_probe_gone"])
    assert not pytest_template._index_new_modules()
    for name in ("tidal_index_probe_a", "tidal_index_probe_b"):
        sys.modules.pop(name, None)
