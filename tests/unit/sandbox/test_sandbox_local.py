"""`unsafe_local`: no isolation, loud about it, but limits and the wall clock still hold."""

from __future__ import annotations

import logging
import secrets
import time

import pytest
from sandbox_probes import processes_with

from tidal.sandbox import SandboxStatus, get_backend
from tidal.types import Limits


def test_warns_on_every_run(caplog: pytest.LogCaptureFixture) -> None:
    backend = get_backend("unsafe_local")
    with caplog.at_level(logging.WARNING, logger="tidal.sandbox.local"):
        for _ in range(2):
            result = backend.run([backend.python, "-c", "print('hi')"], {}, Limits(timeout_s=20))
            assert result.stdout_text == "hi\n"
    warnings = [r for r in caplog.records if "WITHOUT isolation" in r.getMessage()]
    assert len(warnings) == 2


def test_workspace_files_env_and_report_channel() -> None:
    backend = get_backend("unsafe_local")
    code = (
        "import os, socket\n"
        "channel = socket.socket(fileno=int(os.environ['TIDAL_REPORT_FD']))\n"
        "data = channel.recv(100)\n"
        "channel.sendall(data[::-1])\n"
        "print(open('in.txt').read(), os.environ['HOME'] == os.getcwd(), os.environ.get('TIDAL_TEST_SECRET'))\n"
    )
    result = backend.run([backend.python, "-c", code], {"in.txt": "data"}, Limits(timeout_s=20), report_input=b"abc")
    assert result.stdout_text == "data True None\n"
    assert result.report == b"cba"


def test_timeout_kills_the_process_group() -> None:
    backend = get_backend("unsafe_local")
    marker = f"tidal-probe-{secrets.token_hex(6)}"
    code = f"import os\n# {marker}\nos.fork()\nwhile True:\n    pass\n"
    result = backend.run([backend.python, "-c", code], {}, Limits(timeout_s=1))
    assert result.status is SandboxStatus.TIMEOUT
    deadline = time.monotonic() + 3
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


def test_memory_limit() -> None:
    backend = get_backend("unsafe_local")
    result = backend.run([backend.python, "-c", "x = bytearray(8 * 1024 ** 3)"], {}, Limits(timeout_s=20, memory_mb=512))
    assert result.status is SandboxStatus.MEMORY_LIMIT
