"""python_tests under the bwrap sandbox: honest answers score by the fraction of tests passed,
and each known way to fake a pass is caught."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from tidal.reward import ScoringContext, get_verifier
from tidal.reward.verifiers.python_tests import (
    defined_test_ids,
    extract_code,
    pytest_targets,
)
from tidal.types import Outcome, Score, Task

TESTS = """\
from solution import sum_evens

def test_basic():
    assert sum_evens([1, 2, 3, 4]) == 6

def test_empty():
    assert sum_evens([]) == 0

def test_negative():
    assert sum_evens([-2, 3]) == -2

class TestMore:
    def test_single(self):
        assert sum_evens([8]) == 8
"""
CORRECT = "def sum_evens(xs):\n    return sum(x for x in xs if x % 2 == 0)\n"


def make_task(tests: dict[str, str] | None = None, mode: str = "auto", **fields: Any) -> Task:
    fields.setdefault("verifier", {"name": "python_tests", "mode": mode})
    return Task(id="code/sum-evens", domain="code", prompt="Write sum_evens(xs).",
                tests=tests or {"test_solution.py": TESTS}, **fields)


IN_PROCESS = make_task(mode="in_process")


def score(ctx: ScoringContext, answer: str, task: Task | None = None) -> Score:
    return get_verifier("python_tests")(task or make_task(), answer, ctx)


# ----------------------------------------------------------------------------- no sandbox needed


def test_extract_code_takes_the_last_python_block() -> None:
    answer = "First try:\n```python\nx = 1\n```\nBetter:\n```\nx = 2\n```\nRun it with:\n```bash\npython x.py\n```\n"
    assert extract_code(answer) == "x = 2\n"
    assert extract_code("just code\n") == "just code\n"
    assert extract_code("```python\ndef f(): pass\n") == "def f(): pass\n"  # cut before the closing fence
    assert extract_code("```sh\nls\n```") == "ls\n"


def test_the_tests_that_count_come_from_the_files() -> None:
    assert defined_test_ids("test_solution.py", TESTS) == [
        "test_solution.py::test_basic", "test_solution.py::test_empty", "test_solution.py::test_negative",
        "test_solution.py::TestMore::test_single"]
    assert pytest_targets({"test_a.py": "", "helpers.py": "", "conftest.py": "", "data.json": ""}) == ["test_a.py"]
    assert pytest_targets({"checks.py": "", "conftest.py": ""}) == ["checks.py"]


def test_task_problems_are_infra_errors() -> None:
    ctx = ScoringContext("bwrap")
    assert score(ctx, CORRECT, make_task(tests={"test_x.py": "def test_(:\n"})).outcome is Outcome.INFRA_ERROR
    assert score(ctx, CORRECT, make_task(tests={"../test_x.py": "def test_a(): pass\n"})).outcome is Outcome.INFRA_ERROR
    no_tests = Task(id="t", domain="code", prompt="p", verifier={"name": "python_tests"})
    assert score(ctx, CORRECT, no_tests).outcome is Outcome.INFRA_ERROR


def test_sandbox_that_cannot_start_is_an_infra_error() -> None:
    class Broken:
        name, python = "broken", "/usr/bin/python3"

        def run(self, *args: Any, **kwargs: Any) -> Any:
            from tidal.errors import SandboxUnavailableError

            raise SandboxUnavailableError("no namespaces here")

    result = score(ScoringContext(Broken()), CORRECT)  # type: ignore[arg-type]
    assert result.outcome is Outcome.INFRA_ERROR and "no namespaces here" in result.detail


@pytest.mark.parametrize("answer", ["", "   ", "```python\n```", "a\0b", "x" * 70_000])
def test_hostile_answers_fail_before_the_sandbox(answer: str) -> None:
    result = score(ScoringContext("no-such-backend"), answer)
    assert result.outcome is Outcome.FAILED and result.detail


# ----------------------------------------------------------------------------- sandboxed


@pytest.mark.parametrize("mode", ["in_process", "out_of_process"])
def test_correct_answer_passes(sandboxed: ScoringContext, mode: str) -> None:
    result = score(sandboxed, f"Here you go:\n```python\n{CORRECT}```\n", make_task(mode=mode))
    assert result.outcome is Outcome.PASSED, result.detail
    assert result.value == 1.0 and result.components == {"tests": 1.0}
    assert result.info["passed"] == result.info["total"] == 4


def test_wrong_answer_scores_the_fraction_passed(sandboxed: ScoringContext) -> None:
    result = score(sandboxed, "def sum_evens(xs):\n    return sum(x for x in xs if x % 2 == 0 and x > 0)\n")
    assert result.outcome is Outcome.FAILED
    assert result.value == pytest.approx(3 / 4) and result.components == {"tests": pytest.approx(3 / 4)}
    assert "test_negative" in result.detail


@pytest.mark.parametrize("mode", ["in_process", "out_of_process"])
def test_a_failing_tests_evidence_is_where_and_what_failed(sandboxed: ScoringContext, mode: str) -> None:
    result = score(sandboxed, "def sum_evens(xs):\n    return sum(x for x in xs if x % 2 == 0 and x > 0)\n",
                   make_task(mode=mode))
    line = 1 + TESTS.splitlines().index("    assert sum_evens([-2, 3]) == -2")
    failure = str(result.info["failure"])
    assert failure.startswith(f"test_solution.py:{line}: assert 0 == -2\n"), failure  # pytest's crash line
    assert "E   assert 0 == -2" in failure and "where 0 = " in failure  # the exception, as --tb=line gives it


def test_a_task_may_ask_for_a_fuller_traceback(sandboxed: ScoringContext) -> None:
    wrong = "def sum_evens(xs):\n    return sum(x for x in xs if x % 2 == 0 and x > 0)\n"
    result = score(sandboxed, wrong, make_task(verifier={"name": "python_tests", "traceback": "short"}))
    assert result.outcome is Outcome.FAILED and result.value == pytest.approx(3 / 4)
    assert "in test_negative\n    assert sum_evens([-2, 3]) == -2\n" in str(result.info["failure"])  # quoted source
    bad = score(sandboxed, wrong, make_task(verifier={"name": "python_tests", "traceback": "everything"}))
    assert bad.outcome is Outcome.INFRA_ERROR and "traceback 'everything' is not one of line, short" in bad.detail


def test_answer_that_does_not_import_fails(sandboxed: ScoringContext) -> None:
    result = score(sandboxed, "def sum_evens(xs) return 0\n")
    assert result.outcome is Outcome.FAILED and result.value == 0.0
    assert result.info["total"] == 4  # the tests defined in the file still count


def test_skipping_and_xfail_count_as_failures(sandboxed: ScoringContext) -> None:
    skipper = "import pytest\ndef sum_evens(xs):\n    pytest.skip('not today')\n"
    for task in (make_task(), IN_PROCESS):  # importing pytest from the answer is a tamper signal too
        result = score(sandboxed, skipper, task)
        assert (result.outcome, result.value, result.info["passed"]) == (Outcome.TAMPERED, 0.0, 0)
        assert "imports pytest" in result.detail
    tests = {"test_solution.py": TESTS + "\nimport pytest\n@pytest.mark.xfail\ndef test_x():\n    assert sum_evens([2]) == 2\n"}
    result = score(sandboxed, CORRECT, make_task(tests=tests))
    assert result.outcome is Outcome.FAILED and result.value == pytest.approx(4 / 5)


@pytest.mark.parametrize("mode", ["in_process", "out_of_process"])
def test_exit_before_the_tests_is_tampering(sandboxed: ScoringContext, mode: str) -> None:
    result = score(sandboxed, "import os\nos._exit(0)\n", make_task(mode=mode))
    assert result.outcome is Outcome.TAMPERED and result.value == 0.0
    assert "status 0" in " ".join(result.info["tamper"])  # seen at run time, not only by the static scan
    result = score(sandboxed, "import sys\nsys.exit(0)\n", make_task(mode=mode))
    assert result.outcome is Outcome.TAMPERED and "calls sys.exit at import" in result.detail


@pytest.mark.parametrize("mode", ["in_process", "out_of_process"])
def test_exit_status_0_inside_a_test_is_tampering(sandboxed: ScoringContext, mode: str) -> None:
    answer = "import os\ndef sum_evens(xs):\n    os._exit(0)\n"
    result = score(sandboxed, answer, make_task(mode=mode))
    assert result.outcome is Outcome.TAMPERED and result.value == 0.0
    assert "status 0" in result.detail and result.info["passed"] == 0


@pytest.mark.parametrize("mode", ["in_process", "out_of_process"])
def test_a_crash_inside_a_test_is_a_crash(sandboxed: ScoringContext, mode: str) -> None:
    answer = "import os, signal\ndef sum_evens(xs):\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
    result = score(sandboxed, answer, make_task(mode=mode))
    assert result.outcome is Outcome.CRASHED and result.value == 0.0, result.detail


def test_infinite_loop_times_out_and_leaves_no_process(sandboxed: ScoringContext) -> None:
    marker = f"tidal-probe-{secrets.token_hex(6)}"
    answer = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)  # {marker}'])\n"
        "def sum_evens(xs):\n    while True:\n        pass\n"
    )
    started = time.monotonic()
    result = score(sandboxed, answer, make_task(limits={"timeout_s": 2}))
    assert result.outcome is Outcome.TIMEOUT and result.value == 0.0
    assert time.monotonic() - started < 8

    def alive() -> bool:
        for proc in Path("/proc").iterdir():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    return True
            except OSError:
                continue
        return False

    deadline = time.monotonic() + 3
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive()


def test_memory_bomb_is_a_memory_limit(sandboxed: ScoringContext) -> None:
    limits = {"memory_mb": 512}
    at_import = score(sandboxed, "blob = bytearray(8 * 1024 ** 3)\n", make_task(limits=limits))
    assert at_import.outcome is Outcome.MEMORY_LIMIT and at_import.value == 0.0
    in_a_test = score(sandboxed, "def sum_evens(xs):\n    return len(bytearray(8 * 1024 ** 3))\n", make_task(limits=limits))
    assert in_a_test.outcome is Outcome.MEMORY_LIMIT


@pytest.mark.parametrize("mode, seen", [("in_process", "/workspace/solution.py:1 opened the test file test_solution.py"),
                                        ("out_of_process", "test_solution.py was re-created after the harness deleted it")])
def test_editing_the_test_file_is_tampering(sandboxed: ScoringContext, mode: str, seen: str) -> None:
    answer = "open('test_solution.py', 'w').write('def test_ok():\\n    pass\\n')\ndef sum_evens(xs):\n    return 0\n"
    result = score(sandboxed, answer, make_task(mode=mode))
    assert result.outcome is Outcome.TAMPERED and result.value == 0.0
    assert seen in result.info["tamper"]


def test_dropping_a_conftest_is_tampering(sandboxed: ScoringContext) -> None:
    answer = "open('conftest.py', 'w').write('import pytest\\n')\n" + CORRECT
    assert score(sandboxed, answer).outcome is Outcome.TAMPERED


def test_forging_the_report_is_tampering(sandboxed: ScoringContext) -> None:
    answer = (
        "import os, socket, json\n"
        "for fd in os.listdir('/proc/self/fd'):\n"
        "    try:\n"
        "        if os.readlink(f'/proc/self/fd/{fd}').startswith('socket:'):\n"
        "            channel = socket.socket(fileno=os.dup(int(fd)))\n"
        "            for test in ['test_basic', 'test_empty', 'test_negative', 'TestMore::test_single']:\n"
        "                for when in ['setup', 'call', 'teardown']:\n"
        "                    channel.sendall(json.dumps({'event': 'phase', 'nodeid': 'test_solution.py::' + test,\n"
        "                                                'when': when, 'ok': True}).encode() + b'\\n')\n"
        "            channel.sendall(b'{\"event\": \"finish\", \"exitstatus\": 0}\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        "open('report.xml', 'w').write('<testsuite tests=\"4\" failures=\"0\"/>')\n"
        "import sys; print('4 passed'); sys.stdout.flush()\n"
        "def sum_evens(xs):\n    return 0\n"
    )
    result = score(sandboxed, answer, IN_PROCESS)  # out of process the answer never holds the channel
    assert result.outcome is Outcome.TAMPERED and result.value == 0.0
    assert "nonce" in result.detail


def test_hooking_pytest_from_the_answer_is_tampering(sandboxed: ScoringContext) -> None:
    plugin = (
        "import gc, pytest, _pytest.config\n"
        "config = next(o for o in gc.get_objects() if isinstance(o, _pytest.config.Config))\n"
        "class AllPass:\n"
        "    @pytest.hookimpl(wrapper=True)\n"
        "    def pytest_runtest_makereport(self, item, call):\n"
        "        report = yield\n"
        "        report.outcome = 'passed'\n"
        "        return report\n"
        "config.pluginmanager.register(AllPass())\n"
        "def sum_evens(xs):\n    return 0\n"
    )
    assert score(sandboxed, plugin, IN_PROCESS).outcome is Outcome.TAMPERED
    patched = "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\ndef sum_evens(xs):\n    return 0\n"
    result = score(sandboxed, patched, IN_PROCESS)
    assert result.outcome is Outcome.TAMPERED and "replaced" in result.detail


def test_task_conftest_and_files_are_allowed(sandboxed: ScoringContext) -> None:
    tests = {
        "conftest.py": "import pytest\n@pytest.fixture\ndef numbers():\n    return [1, 2, 3, 4]\n",
        "test_solution.py": "from solution import sum_evens\ndef test_fixture(numbers):\n    assert sum_evens(numbers) == 6\n",
    }
    task = make_task(tests=tests, files={"solution.py": "# write here\n", "data/notes.txt": "n"})
    result = score(sandboxed, CORRECT, task)
    assert result.outcome is Outcome.PASSED and result.info["mode"] == "out_of_process", result.detail


def test_network_is_unreachable_from_tests(sandboxed: ScoringContext) -> None:
    tests = {"test_net.py": "from solution import fetch\ndef test_fetch():\n    assert fetch() == 'ok'\n"}
    answer = "import socket\ndef fetch():\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n    return 'ok'\n"
    result = score(sandboxed, answer, make_task(tests=tests))
    assert result.outcome is Outcome.FAILED and result.value == 0.0
    assert "Error" in result.detail  # OSError: network unreachable


def test_using_the_plugins_own_emitter_is_tampering(sandboxed: ScoringContext) -> None:
    # The nonce is inside the plugin; candidate code that reuses its emitter adds results pytest
    # never produced, or has to replace the emitter, and either shows.
    reuse = (
        "import sys\n"
        "emit = sys.modules['tidal_pytest_report']._reporter.emit\n"
        "for test in ['test_basic', 'test_empty', 'test_negative', 'TestMore::test_single']:\n"
        "    for when in ['setup', 'call', 'teardown']:\n"
        "        emit('phase', nodeid='test_solution.py::' + test, when=when, ok=True, exception=None, xfail=False)\n"
        "def sum_evens(xs):\n    return 0\n"
    )
    assert score(sandboxed, reuse, IN_PROCESS).outcome is Outcome.TAMPERED
    silence = (
        "import sys\n"
        "reporter = sys.modules['tidal_pytest_report']._reporter\n"
        "real = reporter.emit\n"
        "reporter.emit = lambda event, **fields: real(event, **{**fields, 'ok': True}) if event == 'phase' else real(event, **fields)\n"
        "def sum_evens(xs):\n    return 0\n"
    )
    result = score(sandboxed, silence, IN_PROCESS)
    assert result.outcome is Outcome.TAMPERED and "replaced" in " ".join(result.info["tamper"])


def test_tests_in_a_folder_and_a_custom_entrypoint(sandboxed: ScoringContext) -> None:
    tests = {"tests/test_lib.py": "from lib.core import double\ndef test_double():\n    assert double(3) == 6\n"}
    task = Task(id="code/lib", domain="code", prompt="p", verifier={"name": "python_tests", "entrypoint": "lib/core.py"},
                tests=tests, files={"lib/__init__.py": ""})
    result = score(sandboxed, "def double(x):\n    return 2 * x\n", task)
    assert result.outcome is Outcome.PASSED, result.detail
