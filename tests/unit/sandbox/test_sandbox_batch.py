"""Batched bwrap runs: one sandbox, one zygote, a forked child per job. Each probe fails if a job
could see or touch an earlier or later job, or if the batch vouched for a job it could not."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sandbox_probes import processes_with

from tidal.sandbox import SandboxBackend, SandboxResult, SandboxStatus
from tidal.sandbox.base import AfterRun, BatchBackend, BatchJob
from tidal.sandbox.batch import CLEAN_FILE, CLEAN_SOURCE, CONTROL_ENV, ZYGOTE_SOURCE
from tidal.types import Limits


def job(
    backend: SandboxBackend, code: str, *, report: bytes | None = None, after: AfterRun | None = None, **limits: float
) -> BatchJob:
    """`python -m main` with `code` as main.py."""
    argv = [backend.python, "-s", "-B", "-m", "main"]
    return BatchJob(argv, {"main.py": code}, Limits(**{"timeout_s": 20, **limits}), after=after, report_input=report)


def batch(backend: SandboxBackend, *codes: str, **limits: float) -> list[SandboxResult | None]:
    assert isinstance(backend, BatchBackend)
    return backend.run_batch([job(backend, code, **limits) for code in codes])


def test_jobs_share_one_zygote_but_not_their_workspace_or_report(bwrap: SandboxBackend) -> None:
    code = (
        "import os, sys, json, socket\n"
        "channel = socket.socket(fileno=int(os.environ['TIDAL_REPORT_FD']))\n"
        "nonce = channel.recv(100)\n"
        "channel.sendall(b'got ' + nonce)\n"
        "print(json.dumps([os.getcwd(), sorted(os.listdir('.')), os.environ['HOME'], sys.path[0], os.getppid(),\n"
        "                  sorted(os.listdir('/proc/self/fd')), os.environ.get('TIDAL_CONTROL_FD')]))\n"
        "try:\n"
        "    os.listdir(f'/proc/{os.getppid()}/fd')\n"
        "    print('zygote fds readable')\n"
        "except OSError:\n"
        "    print('zygote fds hidden')\n"
        "open('left-behind.txt', 'w').write('x')\n"
    )
    assert isinstance(bwrap, BatchBackend)
    seen: list[list[str]] = []
    jobs = [job(bwrap, code, report=f"nonce-{i}".encode(), after=lambda w: seen.append(sorted(os.listdir(w))))
            for i in range(3)]
    results = bwrap.run_batch(jobs)
    parents = set()
    for index, result in enumerate(results):
        assert result is not None and result.status is SandboxStatus.OK, result
        assert result.report == f"got nonce-{index}".encode()
        first, second = result.stdout_text.splitlines()
        cwd, listing, home, path0, parent, fds, control = json.loads(first)
        assert cwd == home == path0 == f"/workspace/{index}"
        assert listing == ["main.py"]  # nothing of the job before
        assert fds == ["0", "1", "2", "3", "4"]  # std streams, the report channel, listdir's own
        assert control is None and second == "zygote fds hidden"
        parents.add(parent)
    assert len(parents) == 1  # one zygote forked them all
    assert seen == [["left-behind.txt", "main.py"]] * 3


def test_a_daemon_does_not_outlive_its_job(bwrap: SandboxBackend) -> None:
    marker = f"tidal-probe-{secrets.token_hex(6)}"
    daemon = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'], start_new_session=True)\n"
        "if __import__('os').fork() == 0:\n"
        "    __import__('os').setsid()\n"
        "    __import__('time').sleep(60)\n"
    )
    census = (
        "import os\n"
        "for pid in sorted(os.listdir('/proc')):\n"
        "    if pid.isdigit():\n"
        "        print(pid, open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ').decode())\n"
    )
    first, second = batch(bwrap, daemon, census)
    assert first is not None and second is not None
    assert marker not in second.stdout_text
    assert len(second.stdout_text.splitlines()) == 3, second.stdout_text  # bwrap's init, the zygote, this job
    assert processes_with(marker) == []


def test_scratch_space_is_emptied_between_jobs(bwrap: SandboxBackend) -> None:
    writer = (
        "for folder in ('/tmp', '/dev/shm'):\n"
        "    try:\n"
        "        open(folder + '/left', 'w').write('x')\n"
        "    except OSError:\n"
        "        pass\n"
    )
    reader = "import os\nprint(os.listdir('/tmp'), os.listdir('/dev/shm'))\n"
    _, second = batch(bwrap, writer, reader)
    assert second is not None and second.stdout_text == "[] []\n"


def test_each_job_has_its_own_limits_and_clock(bwrap: SandboxBackend) -> None:
    loop, memory, fine = "while True:\n    pass\n", "x = bytearray(4 * 1024 ** 3)\n", "print('fine')\n"
    results = batch(bwrap, loop, memory, fine, timeout_s=1.5, memory_mb=256)
    assert [r.status if r else None for r in results] == [SandboxStatus.TIMEOUT, SandboxStatus.MEMORY_LIMIT, SandboxStatus.OK]
    assert results[2] is not None and results[2].stdout_text == "fine\n"


def test_output_read_in_passes_arrives_whole_or_capped_and_never_holds_a_job_to_its_timeout(bwrap: SandboxBackend) -> None:
    """A job's streams are read every few ms while it runs (batch.BATCH_S): what a job writes in
    lines, in bursts past a pipe's size, or after it closed its report, all arrives, in order."""
    from tidal.sandbox.base import OUTPUT_CAP_BYTES

    lines = (
        "import os, socket, sys, time\n"
        "channel = socket.socket(fileno=int(os.environ['TIDAL_REPORT_FD']))\n"
        "channel.recv(100)\n"
        "for i in range(60):\n"
        "    channel.sendall(f'event {i}\\n'.encode())\n"
        "    print(f'line {i}', flush=True)\n"
        "    if i % 20 == 0:\n"
        "        time.sleep(0.03)\n"
        "channel.close()\n"
        "print('after the report', file=sys.stderr)\n"
    )
    burst = (
        "import os, socket, sys\n"
        "channel = socket.socket(fileno=int(os.environ['TIDAL_REPORT_FD']))\n"
        "channel.recv(100)\n"
        "channel.sendall(b'r' * (3 << 20))\n"
        "sys.stdout.write('o' * (3 << 20))\n"
        "sys.stdout.flush()\n"
        "sys.stderr.write('e' * 100)\n"
    )
    assert isinstance(bwrap, BatchBackend)
    results = bwrap.run_batch([job(bwrap, lines, report=b"n", timeout_s=10), job(bwrap, burst, report=b"n", timeout_s=10)])
    first, second = results
    assert first is not None and first.status is SandboxStatus.OK, first
    assert first.report.decode().splitlines() == [f"event {i}" for i in range(60)]
    assert first.stdout_text.splitlines() == [f"line {i}" for i in range(60)]
    assert first.stderr_text == "after the report\n" and not first.stdout_truncated
    assert second is not None and second.status is SandboxStatus.OK, second
    assert second.report == b"r" * (3 << 20) and not second.report_truncated
    assert second.stdout == b"o" * OUTPUT_CAP_BYTES and second.stdout_truncated
    assert second.stderr == b"e" * 100 and not second.stderr_truncated


def test_process_limit_matches_a_single_run(bwrap: SandboxBackend) -> None:
    code = (
        "import os, time\nforked = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        forked += 1\n"
        "except OSError:\n"
        "    print(forked)\n"
    )
    single = bwrap.run([bwrap.python, "-s", "-B", "-m", "main"], {"main.py": code}, Limits(timeout_s=20, pids=12))
    batched = batch(bwrap, code, code, pids=12)
    assert [r.stdout_text if r else None for r in batched] == [single.stdout_text] * 2
    assert int(single.stdout_text) < 12


def test_exit_codes_and_signals_read_as_in_a_single_run(bwrap: SandboxBackend) -> None:
    codes = ["raise SystemExit(3)", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "import os\nos._exit(200)",
             "import sys\nsys.exit('bye')", "raise ValueError('at import')"]
    singles = [bwrap.run([bwrap.python, "-s", "-B", "-m", "main"], {"main.py": c}, Limits(timeout_s=20)) for c in codes]
    batched = batch(bwrap, *codes)
    for single, result in zip(singles, batched):
        assert result is not None
        assert (result.status, result.exit_code, result.signal) == (single.status, single.exit_code, single.signal)
    assert batched[3] is not None and b"bye" in batched[3].stderr
    assert batched[4] is not None and b"ValueError: at import" in batched[4].stderr


@pytest.mark.parametrize("attack", [
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
    "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n",
    "import os, resource\nresource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (8, 8))\n",
    "import os\nos.setpriority(os.PRIO_PROCESS, os.getppid(), 19)\n",
])
def test_a_job_that_harms_the_zygote_leaves_the_rest_unscored(bwrap: SandboxBackend, attack: str) -> None:
    results = batch(bwrap, "print('before')", attack, "print('after')", timeout_s=2)
    assert results[0] is not None and results[0].stdout_text == "before\n"
    assert results[2] is None  # the caller runs it alone
    if "SIGSTOP" in attack or "kill(-1" in attack or "getppid(), signal.SIGKILL" in attack:
        assert results[1] is None  # the zygote could not say how the attacker itself ended


def test_batch_jobs_must_be_python_modules_with_the_same_flags(bwrap: SandboxBackend) -> None:
    assert isinstance(bwrap, BatchBackend)
    with pytest.raises(ValueError, match="-m"):
        bwrap.run_batch([BatchJob([bwrap.python, "main.py"], {}, Limits())])
    with pytest.raises(ValueError, match="same interpreter flags"):
        bwrap.run_batch([BatchJob([bwrap.python, "-B", "-m", "a"], {}, Limits()),
                         BatchJob([bwrap.python, "-m", "a"], {}, Limits())])


def test_the_zygote_refuses_to_run_outside_a_fresh_pid_namespace(tmp_path: Path) -> None:
    script = tmp_path / "zygote.py"
    script.write_text(ZYGOTE_SOURCE)
    (tmp_path / CLEAN_FILE).write_text(CLEAN_SOURCE)  # the zygote imports it from beside itself
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    process = subprocess.Popen([sys.executable, str(script)], env={**os.environ, CONTROL_ENV: str(theirs.fileno())},
                               pass_fds=(theirs.fileno(),))
    theirs.close()
    try:
        ours.settimeout(20)
        message = json.loads(ours.recv(1 << 16))
        assert process.wait(timeout=20) == 2
    finally:
        process.kill()
        ours.close()
    assert message["event"] == "broken" and "not alone" in message["detail"]


def test_files_left_outside_the_workspace_end_the_batch(bwrap: SandboxBackend) -> None:
    # As root, nothing outside the job's workspace and /tmp is writable; with bwrap as a normal
    # user, the sandbox's own / belongs to the sandbox user, and a module planted on PYTHONPATH
    # would be imported by the next job: the zygote must stop there.
    planter = (
        "import os\n"
        "try:\n"
        "    open('/opt/tidal/site/json.py', 'w').write('raise SystemExit(42)\\n')\n"
        "    print('planted')\n"
        "except OSError:\n"
        "    print('refused')\n"
    )
    victim = "import json\nprint('clean')\n"
    first, second = batch(bwrap, planter, victim)
    assert first is not None
    if first.stdout_text == "planted\n":
        assert second is None  # run alone, in a sandbox of its own
    else:
        assert first.stdout_text == "refused\n" and second is not None and second.stdout_text == "clean\n"


def test_pytest_jobs_get_the_plugins_their_own_options_ask_for(bwrap: SandboxBackend) -> None:
    # The zygote builds pytest's plugin manager once per set of `-p no:` options and hands each child
    # a copy: a job without the option must still get the plugin, and the output must be a single run's.
    tests = {"test_a.py": "def test_ok():\n    pass\n\ndef test_bad():\n    assert 1 == 2\n"}
    seen: list[list[str]] = []

    def pytest_job(*options: str) -> BatchJob:
        argv = [bwrap.python, "-s", "-B", "-m", "pytest", "-q", "--color=no", "-p", "no:randomly", *options, "test_a.py"]
        return BatchJob(argv, tests, Limits(timeout_s=30), env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                        after=lambda w: seen.append(sorted(os.listdir(w))))

    assert isinstance(bwrap, BatchBackend)
    jobs = [pytest_job("-p", "no:cacheprovider"), pytest_job(), pytest_job("-pno:cacheprovider")]
    results = bwrap.run_batch(jobs)
    single = bwrap.run(jobs[0].argv, tests, Limits(timeout_s=30), env=jobs[0].env)
    assert [r.exit_code if r else None for r in results] == [1, 1, 1]
    assert results[0] is not None
    assert results[0].stdout_text.rsplit(" in ", 1)[0] == single.stdout_text.rsplit(" in ", 1)[0]  # but the time
    assert "1 failed, 1 passed" in single.stdout_text
    assert [".pytest_cache" in listing for listing in seen] == [False, True, False]


def test_a_zygote_that_exits_with_our_message_unread_is_lost_not_an_oserror(tmp_path: Path) -> None:
    """A unix socket whose peer closes with data unread in its queue fails the next recv with
    ECONNRESET, before any message the peer sent: the driver must say ZygoteLost (its callers run
    the job alone), not let a ConnectionResetError escape."""
    from tidal.sandbox.batch import BatchDriver, BatchLayout, ZygoteLost

    host, zygote = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    layout = BatchLayout(tmp_path, "/workspace", None, lambda env, inside, report: {}, lambda limits: {},
                         lambda code, sig: (code, sig), 1024, 1024)
    driver = BatchDriver(host, [], layout)
    host.sendall(json.dumps({"op": "run"}).encode())  # never read by the zygote
    zygote.sendall(json.dumps({"event": "ready", "failed": []}).encode())
    zygote.close()
    with pytest.raises(ZygoteLost, match="gone"):
        driver.start()
    host.close()
