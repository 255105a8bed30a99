"""Fixtures for the pipeline tests: a real local Ray cluster (started with `ray start --head` on
127.0.0.1, stopped after the session) and the config overrides that put a run on a backend."""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

BACKENDS = ["local", "ray"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """The address (127.0.0.1:port) of a Ray head node this session started, with 2 CPUs.

    Token authentication with a fresh token, set in this process's environment (which the cluster,
    its actors and any driver the tests start inherit): otherwise whether Ray asks for a token
    depends on whether some earlier `ray.init()` left one in ~/.ray/auth_token, and a driver
    without it cannot join."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install 'tidal[ray]' (scripts/setup.sh does)")
    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    ray_cli = str(Path(sys.executable).parent / "ray")
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="tidal-ray-")  # its own session folder, logs included
    try:
        started = subprocess.run(
            [ray_cli, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2",
             "--include-dashboard=false", "--object-store-memory", str(300 * 2**20), "--temp-dir", temp_dir,
             "--disable-usage-stats"],
            capture_output=True, text=True, timeout=180, check=False,
        )
        if started.returncode:
            pytest.fail(f"ray start failed ({started.returncode}):\n{started.stdout[-3000:]}\n{started.stderr[-3000:]}")
        yield f"127.0.0.1:{port}"
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        # `ray stop` stops every Ray node of this machine: there is no other one in a test run.
        subprocess.run([ray_cli, "stop", "--force"], capture_output=True, timeout=120, check=False)
        shutil.rmtree(temp_dir, ignore_errors=True)  # the cluster's session folder and logs
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> list[str]:
    """Config overrides that run the async loop on each backend in turn (Ray: the session's cluster)."""
    if request.param == "ray":
        return ["pipeline.backend=ray", f"pipeline.ray_address={request.getfixturevalue('ray_cluster')}"]
    return ["pipeline.backend=local"]
