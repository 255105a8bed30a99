"""Fixtures for the escape probes (docs/security.md lists them all).

`probe` runs programs in the bwrap sandbox and, after the test, checks from the host that no
process of the sandbox user that the test started is left. The others stand up things on the host
for a probe to reach for: a loopback TCP and UDP listener, Unix sockets, a secret file in /tmp, a
process running as the host's uid 65534.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from escape_probes import (
    SANDBOX_UID,
    HostSecret,
    HostSleeper,
    Listeners,
    ProbeRunner,
    boot_ticks,
    wait_until_gone,
)

from tidal.errors import SandboxUnavailableError
from tidal.sandbox import SandboxBackend, get_backend
from tidal.types import Limits


@pytest.fixture(scope="session")
def backend() -> SandboxBackend:
    try:
        backend = get_backend("bwrap")
        backend.run(["/bin/true"], {}, Limits(timeout_s=20))
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")
    return backend


@pytest.fixture
def probe(backend: SandboxBackend) -> Iterator[ProbeRunner]:
    """A probe runner for this test; afterwards, no process it started may be alive on the host."""
    runner = ProbeRunner(backend, secrets.token_hex(8), boot_ticks() - 1)
    yield runner
    left = wait_until_gone(runner.marker, runner.since_ticks)
    assert not left, f"sandbox processes outlived the run: {[p.pid for p in left]}"


@pytest.fixture
def listeners() -> Iterator[Listeners]:
    folder = tempfile.mkdtemp(prefix="tidal-security-", dir="/tmp")
    os.chmod(folder, 0o755)  # reachable by uid 65534 on the host: only the namespaces stand between
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix_path = socket.socket(socket.AF_UNIX)
    unix_path.bind(os.path.join(folder, "host.sock"))
    os.chmod(os.path.join(folder, "host.sock"), 0o777)
    unix_path.listen()
    unix_abstract = socket.socket(socket.AF_UNIX)
    unix_abstract.bind(f"\0tidal-security-{secrets.token_hex(6)}")
    unix_abstract.listen()
    sockets = (tcp, udp, unix_path, unix_abstract)
    for sock in sockets:
        sock.setblocking(False)
    try:
        yield Listeners(tcp, udp, unix_path, unix_abstract)
    finally:
        for sock in sockets:
            sock.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def host_secret() -> Iterator[HostSecret]:
    folder = Path(tempfile.mkdtemp(prefix="tidal-security-", dir="/tmp"))
    folder.chmod(0o755)
    value = f"tidal-host-secret-{secrets.token_hex(12)}"
    path = folder / "secret.txt"
    path.write_text(value)
    path.chmod(0o644)
    try:
        yield HostSecret(path, value)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def env_secret(monkeypatch: pytest.MonkeyPatch) -> str:
    """A secret in the harness's own environment, which the sandbox must not inherit."""
    value = f"tidal-env-secret-{secrets.token_hex(12)}"
    monkeypatch.setenv("TIDAL_TEST_SECRET", value)
    return value


@pytest.fixture
def host_nobody_process() -> Iterator[HostSleeper]:
    """A host process running as uid 65534, the sandbox user's host uid: only the pid namespace
    keeps a probe from seeing or signalling it. Root hosts only (a normal user cannot start it)."""
    if os.geteuid() != 0:
        pytest.skip("starting a process as uid 65534 needs a root host")
    tag = f"{secrets.randbelow(900) + 100}.{secrets.randbelow(10 ** 6):06d}"
    process = subprocess.Popen(["sleep", tag], user=SANDBOX_UID, group=SANDBOX_UID, extra_groups=[])
    try:
        yield HostSleeper(process, tag)
    finally:
        process.kill()
        process.wait()
