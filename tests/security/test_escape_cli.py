"""Escape probes through `tidal sandbox run`: the command line gets the same sandbox as the library
(namespaces, seccomp, scrubbed environment), and its `--file DEST` cannot write outside the
workspace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from escape_probes import MARKER_ENV, PRELUDE, Listeners, ProbeRunner, probe_output

from tidal.sandbox import SandboxResult, SandboxStatus

TIDAL = str(Path(sys.executable).with_name("tidal"))


def tidal_sandbox_run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TIDAL, "sandbox", "run", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env}, check=False)


def test_cli_runs_the_same_sandbox(probe: ProbeRunner, listeners: Listeners, env_secret: str) -> None:
    code = PRELUDE + (
        "import socket\n"
        "status = open('/proc/self/status').read()\n"
        f"tcp = socket.socket(); tcp.settimeout(2)\n"
        f"report(uid=os.getuid(), secret='TIDAL_TEST_SECRET' in os.environ, seccomp='Seccomp:\\t2' in status,\n"
        f"       tcp=attempt(tcp.connect, ('127.0.0.1', {listeners.tcp_port})), checkout=os.path.exists({os.getcwd()!r}),\n"
        f"       usr=attempt(open, '/usr/tidal-cli-probe', 'w'), pids=sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    done = tidal_sandbox_run(["--json", "--timeout-s", "10", "--", "python3", "-c", code], {MARKER_ENV: probe.marker})
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(done.stdout)
    assert record["outcome"] == "ok", record
    out = probe_output(SandboxResult(SandboxStatus.OK, 0, None, record["stdout"].encode(), b"", False, False, 0.0))
    assert out["uid"] == 65534 and out["secret"] is False and out["checkout"] is False, out
    assert out["tcp"] in ("ECONNREFUSED", "ENETUNREACH") and out["usr"] == "EROFS", out
    assert len(out["pids"]) <= 3, out  # bwrap's init and the command: no host process
    assert out["seccomp"] is True, "tidal sandbox run did not put the command under the seccomp filter"
    assert env_secret not in done.stdout + done.stderr
    assert listeners.contacted() == []
    assert not os.path.exists("/usr/tidal-cli-probe")


def test_cli_file_destination_cannot_leave_the_workspace(tmp_path: Path) -> None:
    source = tmp_path / "payload.txt"
    source.write_text("payload")
    target = tmp_path / "escaped.txt"
    for destination in ("../../../../../../../" + str(target), str(target), "a/../../escaped.txt"):
        done = tidal_sandbox_run(["--file", f"{source}:{destination}", "--", "/bin/true"], {})
        assert done.returncode != 0 and "relative path" in done.stderr, (destination, done.stderr[-1000:])
        assert not target.exists()
