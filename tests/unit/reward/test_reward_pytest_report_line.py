"""The report plugin's own report of a failed test (`pytest_runtest_makereport_line`, for
`--tb=line`): the same text and crash line as pytest's, and pytest's own wherever it does not apply."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TESTS = '''
import pytest


def helper(x):
    __tracebackhide__ = True
    assert x == 1, "helper says no"


def deep(n):
    if n == 0:
        raise ValueError("line one\\nline two")
    return deep(n - 1)


class Weird(Exception):
    def __str__(self):
        raise RuntimeError("will not print")


@pytest.fixture
def broken():
    raise KeyError("in set-up")


def test_passes():
    assert True


def test_assert():
    assert [1, 2] == [1, 3]


def test_deep():
    deep(5)


def test_hidden_helper():
    helper(2)


def test_chained():
    try:
        {}["k"]
    except KeyError as error:
        raise TypeError("from a key") from error


def test_context():
    try:
        1 / 0
    except ZeroDivisionError:
        raise OSError("during")


def test_fail():
    pytest.fail("said so", pytrace=False)


def test_skip():
    pytest.skip("not today")


@pytest.mark.xfail(reason="known")
def test_xfail():
    assert 0


def test_weird():
    raise Weird()


def test_setup(broken):
    pass


def test_recursion():
    def again():
        again()
    again()
'''

DUMP = '''
import json, os
import pytest

RESULTS = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    if report.outcome != "passed" or report.when == "call":
        crash = getattr(report.longrepr, "reprcrash", None)
        RESULTS.append([report.nodeid, report.when, report.outcome, str(report.longrepr),
                        str(crash) if crash is not None else None, type(report.longrepr).__name__])


def pytest_sessionfinish(session):
    with open(os.environ["DUMP_TO"], "w") as out:
        json.dump(RESULTS, out)
'''

LEAN = '''
import os
import pytest
from tidal.reward.verifiers import pytest_report

TAKEN = []


@pytest.hookimpl(tryfirst=True, specname="pytest_runtest_makereport")
def pytest_runtest_makereport_counted(item, call):
    report = pytest_report.pytest_runtest_makereport_line(item, call)
    if report is not None:
        TAKEN.append(item.name)
    return report


def pytest_sessionfinish(session):
    with open(os.environ["DUMP_TO"] + ".taken", "w") as out:
        out.write(" ".join(TAKEN))
'''


def run(folder: Path, *plugins: str, tb: str = "line") -> tuple[list[list[str]], list[str] | None]:
    """Every failed or skipped phase's report (node id, phase, outcome, text, crash line, type),
    and which tests the plugin's own report took (None without the plugin)."""
    dump = folder / f"dump-{'-'.join(plugins)}-{tb}.json"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", f"--tb={tb}",
            "-p", "dumper", *[arg for plugin in plugins for arg in ("-p", plugin)], "test_cases.py"]
    env = {"PYTHONPATH": f"{folder}:{Path(__file__).parents[3] / 'src'}", "DUMP_TO": str(dump), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    taken = Path(f"{dump}.taken")
    return json.loads(dump.read_text()), taken.read_text().split() if taken.exists() else None


def test_a_failed_test_reads_as_in_pytest_and_only_plain_failures_take_the_short_way(tmp_path: Path) -> None:
    (tmp_path / "test_cases.py").write_text(TESTS)
    (tmp_path / "dumper.py").write_text(DUMP)
    (tmp_path / "lean.py").write_text(LEAN)
    theirs, _ = run(tmp_path)
    ours, taken = run(tmp_path, "lean")
    assert ours == theirs
    assert len(ours) == 12  # 11 failed, skipped or xfailed calls and one failed set-up
    assert taken == ["test_assert", "test_deep", "test_hidden_helper", "test_xfail", "test_weird"]
    calls = {nodeid.split("::")[1]: (text, line) for nodeid, when, _, text, line, _ in ours if when == "call"}
    assert calls["test_deep"] == ("E   ValueError: line one\n    line two", f"{tmp_path}/test_cases.py:12: ValueError: line one")
    assert "helper says no" in calls["test_hidden_helper"][0]
    # Another style: pytest's own report throughout.
    ours_short, taken_short = run(tmp_path, "lean", tb="short")
    assert ours_short == run(tmp_path, tb="short")[0] and taken_short == []
