"""python_tests' modes and tamper signals: which mode `auto` picks, the wire codec of the
out_of_process mode, the static tamper scan (and what it must not flag), and, sandboxed, the
out_of_process semantics (exceptions, per-call timeouts, data only) and the code family's
reference solutions."""

from __future__ import annotations

import importlib.util
import math
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from test_reward_python_tests import CORRECT, TESTS, make_task

from tidal.reward import ScoringContext, get_verifier
from tidal.reward.verifiers.process_mode import choose_mode, out_of_process_problems
from tidal.reward.verifiers.python_tests import prepare
from tidal.reward.verifiers.tamper_scan import scan_answer
from tidal.tasks import generate_tasks
from tidal.tasks.reference import reference_answer
from tidal.types import Outcome, Task


def _load_proxy() -> Any:
    path = Path(__file__).parents[3] / "src/tidal/reward/verifiers/function_proxy.py"
    spec = importlib.util.spec_from_file_location("tidal_function_proxy_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


proxy = _load_proxy()


# ----------------------------------------------------------------------------- mode choice


def problems(tests: str, entrypoint: str = "solution.py", files: dict[str, str | bytes] | None = None) -> list[str]:
    return out_of_process_problems(entrypoint, {"test_solution.py": tests}, files or {}, ["test_solution.py"])


def test_function_style_tests_run_out_of_process() -> None:
    assert problems(TESTS) == []
    assert problems("from solution import f\ndef test_a():\n    assert f('solution.py') == 1\n") == []  # a file name
    assert problems("import solution as s\nimport pytest\ndef test_a():\n    with pytest.raises(ValueError):\n"
                    "        s.f(-1)\n    assert s.g(x=1) == {1: (2,)}\n") == []
    assert choose_mode("auto", []) == ("out_of_process", "the tests only call the answer's functions with data")


@pytest.mark.parametrize("tests, why", [
    ("from solution import *\ndef test_a():\n    assert f(1) == 1\n", "import *"),
    ("from solution import Stack\ndef test_a():\n    assert isinstance(Stack(), Stack)\n", "uses Stack as a value"),
    ("import solution\ndef test_a():\n    assert solution.LIMIT == 3\n", "uses solution as a value"),
    ("from solution import f\nEXPECTED = f(2)\ndef test_a():\n    assert EXPECTED\n", "while the module is imported"),
    ("import pytest\nfrom solution import f\n@pytest.mark.parametrize('x', [f(1)])\ndef test_a(x):\n    pass\n",
     "while the module is imported"),
    ("def test_a(monkeypatch):\n    monkeypatch.setattr('solution.f', len)\n", "names the module"),
    ("import importlib\ndef test_a():\n    assert importlib.import_module('solution')\n", "names the module"),
    ("from solution import f\ndef test_a():\n    assert list(map(f, [1])) == [1]\n", "uses f as a value"),
])
def test_tests_that_need_the_answer_in_process(tests: str, why: str) -> None:
    found = problems(tests)
    assert any(why in p for p in found), found
    mode, reason = choose_mode("auto", found)
    assert mode == "in_process" and why in reason
    assert choose_mode("out_of_process", found)[0] == ""  # asked for, not allowed: a task problem
    assert choose_mode("in_process", [])[0] == "in_process"


def test_entrypoints_and_task_files_that_need_in_process() -> None:
    assert problems(TESTS, entrypoint="lib/core.py") == ["the entrypoint lib/core.py is not a top-level module"]
    assert problems(TESTS, files={"helper.py": "import solution\n"}) == ["helper.py: a task file imports solution"]
    found = out_of_process_problems("solution.py", {"test_solution.py": TESTS, "data.json": "{}"}, {}, ["test_solution.py"])
    assert found == ["data.json: not a test module, conftest.py or __init__.py"]


def test_prepare_records_the_mode_and_rejects_bad_arguments() -> None:
    assert prepare(make_task(), CORRECT).mode == "out_of_process"  # type: ignore[union-attr]
    forced = make_task(verifier={"name": "python_tests", "mode": "in_process"})
    assert prepare(forced, CORRECT).mode == "in_process"  # type: ignore[union-attr]
    for args in ({"mode": "sideways"}, {"call_timeout_s": -1}):
        bad = make_task(verifier={"name": "python_tests", **args})
        result = prepare(bad, CORRECT)
        assert not hasattr(result, "mode") and result.outcome is Outcome.INFRA_ERROR  # type: ignore[union-attr]
    impossible = make_task(verifier={"name": "python_tests", "mode": "out_of_process"},
                           tests={"test_solution.py": "import solution\ndef test_a():\n    assert solution.X\n"})
    result = prepare(impossible, CORRECT)
    assert result.outcome is Outcome.INFRA_ERROR and "uses solution as a value" in result.detail  # type: ignore[union-attr]


def test_the_code_family_runs_out_of_process() -> None:
    for task in generate_tasks("code", 10, "train", seed=3, min_difficulty=1, max_difficulty=5):
        prepared = prepare(task, reference_answer(task))
        assert prepared.mode == "out_of_process" and prepared.static == [], task.id  # type: ignore[union-attr]


# ----------------------------------------------------------------------------- the wire codec


@pytest.mark.parametrize("value", [
    None, True, 0, -5, 2 ** 80, 1.5, float("inf"), -float("inf"), 1 + 2j, "é\n", b"\x00\xff", bytearray(b"ab"),
    [1, [2, (3, None)]], (1,), (), {"a": 1, 2: [3], (4, 5): {6}}, {1, 2}, frozenset({"x"}), range(1, 10, 3),
])
def test_values_cross_unchanged(value: Any) -> None:
    back = proxy.decode(proxy.encode(value))
    assert back == value and type(back) is type(value)


def test_what_crosses_is_plain_data() -> None:
    class Anything:
        def __eq__(self, other: object) -> bool:
            return True

    class Int(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    with pytest.raises(proxy.Unsupported):
        proxy.encode(Anything())
    with pytest.raises(proxy.Unsupported):
        proxy.encode(len)
    back = proxy.decode(proxy.encode(Int(0)))
    assert type(back) is int and back != 5
    assert list(proxy.decode(proxy.encode(x * 2 for x in range(3)))) == [0, 2, 4]
    assert proxy.decode(proxy.encode({1: 2}.keys())) == {1}
    assert math.isnan(proxy.decode(proxy.encode(float("nan"))))


@pytest.mark.parametrize("data", [{"t": [1], "x": 2}, {"evil": []}, {"d": [[[1], 2]]}, {"f": "1e999x"}, {"t": 5}, object()])
def test_malformed_values_are_protocol_errors(data: Any) -> None:
    with pytest.raises(proxy.ProtocolError):
        proxy.decode(data)


def test_remote_errors_keep_builtin_types() -> None:
    error = proxy.remote_error("ValueError", "bad")
    assert isinstance(error, ValueError) and isinstance(error, proxy.CandidateError) and type(error).__name__ == "ValueError"
    assert isinstance(proxy.remote_error("KeyError", "k"), LookupError)
    for name in ("SystemExit", "KeyboardInterrupt", "Skipped", "Exception", "UnicodeDecodeError"):
        plain = proxy.remote_error(name, "x")
        assert type(plain) is proxy.CandidateError and plain.remote_type == name


# ----------------------------------------------------------------------------- static scan

HONEST = '''"""Sum helper. See test_solution.py for how it is checked; mentions conftest and pytest.ini."""
import functools, gc, inspect, logging, os, sys, traceback, warnings
from collections import namedtuple

DATA = os.path.join(os.path.dirname(__file__), "data.txt")
sys.setrecursionlimit(3000)
Point = namedtuple("Point", "x y")

class Money:
    def __eq__(self, other):
        return isinstance(other, Money) and self.cents == other.cents

def f(xs):
    """Returns the sum; raises on bad input."""
    try:
        with open(DATA) as file:
            file.read()
    except OSError:
        logging.getLogger(__name__).debug(traceback.format_exc())
    warnings.warn("slow", stacklevel=2) if len(xs) > 10 ** 9 else None
    gc.collect()
    inspect.signature(f)
    print("debug", file=sys.stderr)
    if not isinstance(xs, list):
        sys.exit("f needs a list")
    return sum(xs)

def main():
    sys.exit(0 if f([1]) == 1 else 1)

if __name__ == "__main__":
    sys.exit(main())
'''


def test_the_scan_leaves_honest_code_alone() -> None:
    assert scan_answer(HONEST, ["test_solution.py"]) == []
    assert scan_answer("def f(:\n", ["test_solution.py"]) == []  # does not parse: the run will fail on its own


def test_the_scan_shows_none_of_the_compilers_warnings_about_an_answer() -> None:
    """The compiler's "invalid decimal literal" and "invalid escape sequence" are the answer's
    business: the scan, which parses every answer on the host, shows neither (they went to the
    run's console)."""
    code = 'def f(xs):\n    return 1if xs else 0\n\nPATTERN = "\\d+"\n'
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert scan_answer(code, ["test_solution.py"]) == []
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize("code, finding", [
    ("import _pytest.runner\n", "line 1: imports _pytest.runner"),
    ("from pluggy import HookimplMarker\n", "line 1: imports from pluggy"),
    ("import importlib\nimportlib.import_module('tidal_pytest_report')\n", "line 2: imports tidal_pytest_report"),
    ("import sys\ndef f():\n    return sys._getframe(1).f_locals\n", "line 3: calls sys._getframe"),
    ("import inspect as i\ndef f():\n    return i.stack()\n", "line 3: calls inspect.stack"),
    ("from gc import get_referrers\n", "line 1: imports gc.get_referrers"),
    ("def f(e):\n    return e.__traceback__.tb_frame.f_back\n", "line 2: uses .tb_frame"),
    ("import os\nos._exit(0)\n", "line 2: calls os._exit at import"),
    ("exit()\n", "line 1: calls exit at import"),
    ("raise SystemExit\n", "line 1: raises SystemExit at import"),
    ("def f():\n    raise KeyboardInterrupt()\n", "line 2: raises KeyboardInterrupt"),
    ("open('test_solution.py').read()\n", "line 1: names 'test_solution.py'"),
    ("x = open('conftest.py', 'w')\n", "line 1: names 'conftest'"),
    ("import glob\nglob.glob('test_*')\n", "line 2: names 'test_*'"),
    ("import sys\nsys.modules['pytest'] = None\n", "line 2: assigns to sys.modules[...]"),
    ("import sys\nsys.meta_path.insert(0, object())\n", "line 2: changes sys.meta_path"),
    ("import builtins\nbuiltins.AssertionError = Exception\n", "line 2: assigns to a builtin"),
    ("setattr(__builtins__, 'len', None)\n", "line 1: changes a builtin"),
    ("import socket\ns = socket.socket(fileno=3)\n", "line 2: opens a socket on an inherited descriptor"),
    ("import os\nos.write(5, b'x')\n", "line 2: writes to inherited descriptor 5"),
    ("class A:\n    def __eq__(self, other):\n        return True\n", "line 2: __eq__ always returns True"),
    ("class A(str):\n    __ne__ = lambda self, other: False\n", "line 2: __ne__ always returns False"),
])
def test_the_scan_finds_test_targeted_code(code: str, finding: str) -> None:
    found = scan_answer(code, ["test_solution.py"])
    assert any(f.startswith(finding) for f in found), found


# ----------------------------------------------------------------------------- sandboxed

PROBE_TESTS = '''\
import pytest
from solution import f, g

def test_errors_keep_their_type():
    with pytest.raises(KeyError):
        f({"a": 1}, "b")

def test_values_are_data():
    assert f({"a": (1, 2)}, "a") == (1, 2)
    assert g() == [1, {"x": {2, 3}}]

def test_custom_objects_do_not_cross():
    with pytest.raises(Exception, match="cannot cross"):
        g(custom=True)
'''
PROBE_ANSWER = '''\
def f(mapping, key):
    return mapping[key]

class Box:
    pass

def g(custom=False):
    return Box() if custom else [1, {"x": {2, 3}}]
'''


def probe_task(tests: str = PROBE_TESTS, **args: Any) -> Task:
    return Task(id="code/probe", domain="code", prompt="p", verifier={"name": "python_tests", **args},
                tests={"test_solution.py": tests}, limits={"timeout_s": 6})


def test_out_of_process_semantics(sandboxed: ScoringContext) -> None:
    result = get_verifier("python_tests")(probe_task(), PROBE_ANSWER, sandboxed)
    assert (result.outcome, result.value, result.info["mode"]) == (Outcome.PASSED, 1.0, "out_of_process"), result.detail


def test_a_call_past_its_limit_is_a_timeout(sandboxed: ScoringContext) -> None:
    answer = "import time\ndef f(m, k):\n    time.sleep(30)\ndef g(custom=False):\n    return [1, {'x': {2, 3}}]\n"
    result = get_verifier("python_tests")(probe_task(call_timeout_s=1), answer, sandboxed)
    assert result.outcome is Outcome.TIMEOUT and result.value == 0.0, result.detail
    assert "1s call limit" in result.detail and result.info["wall_s"] < 5


def test_a_test_passing_a_non_data_value_is_a_task_problem(sandboxed: ScoringContext) -> None:
    tests = "from solution import f\ndef test_a():\n    assert f(len, 'x') == 1\n"
    result = get_verifier("python_tests")(probe_task(tests), PROBE_ANSWER, sandboxed)
    assert result.outcome is Outcome.INFRA_ERROR and "set verifier mode: in_process" in result.detail


def test_the_answer_process_cannot_read_the_tests(sandboxed: ScoringContext) -> None:
    answer = ("import glob\nFOUND = sorted(glob.glob('*'))\n"
              "def f(m, k):\n    return FOUND\ndef g(custom=False):\n    return 0\n")
    tests = "from solution import f\ndef test_a():\n    assert f(0, 0) == ['solution.py']\n"
    result = get_verifier("python_tests")(probe_task(tests), answer, sandboxed)
    assert result.outcome is Outcome.PASSED, result.detail  # the workspace holds only the answer by then
    assert result.info["mode"] == "out_of_process"


def test_code_family_references_score_one_in_both_modes(sandboxed: ScoringContext) -> None:
    tasks = generate_tasks("code", 5, "train", seed=11, min_difficulty=1, max_difficulty=5)
    for task in tasks:
        for mode in ("auto", "in_process"):
            variant = Task.model_validate({**task.model_dump(), "verifier": {**task.verifier.model_dump(), "mode": mode}})
            result = get_verifier("python_tests")(variant, reference_answer(task), sandboxed)
            assert (result.outcome, result.value) == (Outcome.PASSED, 1.0), (task.id, mode, result.detail)
            assert result.info["mode"] == ("out_of_process" if mode == "auto" else "in_process")
