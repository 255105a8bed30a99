"""Containment probes for the bwrap backend: each fails on a host where the containment is missing."""

from __future__ import annotations

import json
import os
import secrets
import time
import uuid

from sandbox_probes import processes_with

from tidal.sandbox import SandboxBackend, SandboxResult, SandboxStatus
from tidal.types import Limits


def run_python(backend: SandboxBackend, code: str, **limits: float) -> tuple[str, SandboxResult]:
    result = backend.run([backend.python, "-c", code], {}, Limits(**{"timeout_s": 20, **limits}))
    return result.stdout_text, result


def test_runs_in_the_workspace_with_a_scrubbed_environment(bwrap: SandboxBackend) -> None:
    os.environ["TIDAL_TEST_SECRET"] = "leak"
    try:
        result = bwrap.run(
            [bwrap.python, "main.py"],
            {"main.py": "import os, json; print(json.dumps([os.getcwd(), sorted(os.listdir('.')), dict(os.environ), os.getuid()]))",
             "data/input.txt": "hello"},
            Limits(timeout_s=20),
            env={"EXTRA": "1"},
            after=lambda workspace: (workspace / "data" / "input.txt").read_text(),
        )
    finally:
        del os.environ["TIDAL_TEST_SECRET"]
    cwd, listing, env, uid = json.loads(result.stdout_text)
    assert result.status is SandboxStatus.OK and result.exit_code == 0
    assert cwd == "/workspace" and listing == ["data", "main.py"]
    assert env["HOME"] == "/workspace" and env["PYTHONHASHSEED"] == "0" and env["TZ"] == "UTC"
    assert env["LANG"] == "C.UTF-8" and env["PYTHONDONTWRITEBYTECODE"] == "1" and env["EXTRA"] == "1"
    assert "TIDAL_TEST_SECRET" not in env
    assert uid == 65534
    assert result.after_value == "hello"


def test_no_network(bwrap: SandboxBackend) -> None:
    code = (
        "import socket\n"
        "print(sorted(name for _, name in socket.if_nameindex()))\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 80), timeout=3)\n"
        "    print('connected')\n"
        "except OSError as error:\n"
        "    print('refused', error.errno)\n"
    )
    out, _ = run_python(bwrap, code)
    assert out.splitlines()[0] == "['lo']"
    assert out.splitlines()[1].startswith("refused")


def test_host_files_are_not_visible(bwrap: SandboxBackend) -> None:
    name = f"tidal-probe-{uuid.uuid4().hex}"
    host_file = os.path.join("/tmp", name)
    with open(host_file, "w") as file:
        file.write("secret")
    try:
        code = (
            "import os\n"
            f"print(os.path.exists('/tmp/{name}'), os.path.exists('/root'), os.path.exists('/home'),\n"
            f"      os.path.exists({os.getcwd()!r}), os.path.exists('/work'), os.listdir('/tmp'))\n"
            "import sys; print([p for p in sys.path if 'site-packages' in p or '.venv' in p])\n"
        )
        out, _ = run_python(bwrap, code)
    finally:
        os.unlink(host_file)
    assert out.splitlines()[0] == "False False False False False []"
    assert ".venv" not in out and "/root" not in out


def test_system_folders_are_read_only(bwrap: SandboxBackend) -> None:
    code = (
        "import sys\n"
        "for path in ['/usr/tidal-probe', sys.prefix + '/tidal-probe', '/opt/tidal/site/tidal-probe']:\n"
        "    try:\n"
        "        open(path, 'w').write('x'); print('wrote', path)\n"
        "    except OSError as error:\n"
        "        print('denied', error.errno)\n"
    )
    out, _ = run_python(bwrap, code)
    assert out.count("denied") == 3, out


def test_wall_clock_kills_the_whole_tree(bwrap: SandboxBackend) -> None:
    marker = f"tidal-probe-{secrets.token_hex(6)}"
    code = f"import os, time\n# {marker}\nfor _ in range(3):\n    os.fork()\nwhile True:\n    pass\n"
    started = time.monotonic()
    _, result = run_python(bwrap, code, timeout_s=1.5)
    assert result.status is SandboxStatus.TIMEOUT
    assert time.monotonic() - started < 6
    deadline = time.monotonic() + 3
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


def test_signal_ignoring_sleeper_is_still_killed(bwrap: SandboxBackend) -> None:
    code = "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"
    _, result = run_python(bwrap, code, timeout_s=1)
    assert result.status is SandboxStatus.TIMEOUT


def test_memory_bomb_hits_the_memory_limit(bwrap: SandboxBackend) -> None:
    _, result = run_python(bwrap, "x = bytearray(4 * 1024 ** 3)", memory_mb=256)
    assert result.status is SandboxStatus.MEMORY_LIMIT
    assert b"MemoryError" in result.stderr


def test_fork_bomb_is_contained_by_the_pids_limit(bwrap: SandboxBackend) -> None:
    marker = f"tidal-probe-{secrets.token_hex(6)}"
    code = (
        f"import os, time\n# {marker}\nforked = 0\n"
        "try:\n"
        "    for _ in range(500):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        forked += 1\n"
        "except OSError as error:\n"
        "    print('fork failed', forked, error.errno)\n"
    )
    out, result = run_python(bwrap, code, pids=16, timeout_s=10)
    assert out.startswith("fork failed"), out
    assert int(out.split()[2]) < 16
    deadline = time.monotonic() + 3
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


def test_stdout_flood_is_capped(bwrap: SandboxBackend) -> None:
    code = "import sys\nsys.stdout.write('x' * 20_000_000)\nsys.stderr.write('y' * 20_000_000)\n"
    _, result = run_python(bwrap, code)
    assert result.status is SandboxStatus.OK
    assert result.stdout_truncated and result.stderr_truncated
    assert len(result.stdout) == bwrap.output_cap and set(result.stdout) == {ord("x")}
    assert len(result.stderr) <= bwrap.output_cap


def test_file_size_limit(bwrap: SandboxBackend) -> None:
    # Python ignores SIGXFSZ, so the write fails with EFBIG instead of the process being killed.
    code = "f = open('big', 'wb')\nf.write(b'x' * (200 * 1024 * 1024))\n"
    result = bwrap.run([bwrap.python, "-c", code], {}, Limits(timeout_s=20, memory_mb=1024),
                       after=lambda workspace: (workspace / "big").stat().st_size)
    assert result.exit_code != 0 and b"File too large" in result.stderr
    assert result.after_value <= bwrap.file_size_mb * 1024 * 1024


def test_crash_and_exit_codes(bwrap: SandboxBackend) -> None:
    _, result = run_python(bwrap, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert result.status is SandboxStatus.CRASHED and result.signal == 11
    _, result = run_python(bwrap, "raise SystemExit(3)")
    assert result.status is SandboxStatus.OK and result.exit_code == 3


def test_report_channel_is_not_in_the_workspace(bwrap: SandboxBackend) -> None:
    code = (
        "import os, socket\n"
        "channel = socket.socket(fileno=int(os.environ['TIDAL_REPORT_FD']))\n"
        "data = b''\n"
        "while chunk := channel.recv(100):\n"
        "    data += chunk\n"
        "channel.sendall(b'got ' + data)\n"
        "print(sorted(os.listdir('.')), open(os.environ['TIDAL_HARNESS'] + '/plugin.py').read())\n"
        "try:\n"
        "    open(os.environ['TIDAL_HARNESS'] + '/plugin.py', 'w')\n"
        "except OSError:\n"
        "    print('harness read-only')\n"
    )
    result = bwrap.run([bwrap.python, "-c", code], {}, Limits(timeout_s=20),
                       harness_files={"plugin.py": "# plugin"}, report_input=b"nonce")
    assert result.report == b"got nonce"
    assert result.stdout_text.splitlines() == ["[] # plugin", "harness read-only"]
