"""The report plugin ends a harnessed session's process once `finish` is reported (`_end`): the
threads that are not daemons joined, the atexit functions run, the exit status pytest's; the
terminal summary and the plugins' unconfigure steps skipped. A plain pytest run is left alone."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from tidal.reward.verifiers.python_tests import (
    HARNESS_FILES,
    PLUGIN_MODULE,
    PYTEST_OPTIONS,
)

TESTS = '''
import atexit
import threading
import time

from solution import f

atexit.register(lambda: print("atexit ran", flush=True))


def test_passes():
    worker = threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True)))
    worker.start()
    assert f() == 1


def test_fails():
    assert f() == 2
'''
CONFTEST = 'def pytest_unconfigure(config):\n    print("unconfigure ran", flush=True)\n'


def run(folder: Path, harnessed: bool) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
    harness = folder / "harness"
    harness.mkdir(exist_ok=True)
    for name, text in HARNESS_FILES.items():
        (harness / name).write_text(text)
    argv = [sys.executable, "-B", "-m", "pytest", "-p", PLUGIN_MODULE, *PYTEST_OPTIONS, "--tb=line", "test_cases.py"]
    env = {"PYTHONPATH": str(harness), "PATH": "/usr/bin:/bin"}
    if not harnessed:
        done = subprocess.run(argv, cwd=folder / "work", env=env, capture_output=True, text=True, timeout=120, check=False)
        return done, []
    ours, theirs = socket.socketpair()
    settings = {"nonce": "n0nce", "mode": "in_process", "module": "solution",
                "tests": [str(folder / "work" / "test_cases.py")]}
    ours.sendall(json.dumps(settings).encode())
    ours.shutdown(socket.SHUT_WR)
    env["TIDAL_REPORT_FD"] = str(theirs.fileno())
    try:
        done = subprocess.run(argv, cwd=folder / "work", env=env, capture_output=True, text=True, timeout=120,
                              check=False, pass_fds=[theirs.fileno()])
    finally:
        theirs.close()
    data = b""
    while chunk := ours.recv(65536):
        data += chunk
    ours.close()
    return done, [json.loads(line) for line in data.decode().splitlines()]


def test_a_harnessed_session_ends_after_its_finish_event_and_a_plain_run_does_not(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "test_cases.py").write_text(TESTS)
    (work / "conftest.py").write_text(CONFTEST)
    (work / "solution.py").write_text("def f():\n    return 1\n")
    done, events = run(tmp_path, harnessed=True)
    finish = [event for event in events if event["event"] == "finish"]
    assert all(event["nonce"] == "n0nce" for event in events)
    assert [event["exitstatus"] for event in finish] == [1] and done.returncode == 1, done.stdout + done.stderr
    assert "thread done" in done.stdout and "atexit ran" in done.stdout  # the interpreter's exit steps ran
    assert done.stdout.index("thread done") < done.stdout.index("atexit ran")  # threads first, as at exit
    assert "unconfigure ran" not in done.stdout and "1 failed, 1 passed" not in done.stdout
    plain, _ = run(tmp_path, harnessed=False)
    assert plain.returncode == 1
    assert "unconfigure ran" in plain.stdout and "1 failed, 1 passed" in plain.stdout
    assert "atexit ran" in plain.stdout
