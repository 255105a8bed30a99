"""Fixtures for agent tests: a working bwrap backend (or a skip saying why there is none)."""

from __future__ import annotations

import pytest

from tidal.errors import SandboxUnavailableError
from tidal.sandbox import get_backend
from tidal.sandbox.base import SandboxBackend


@pytest.fixture(scope="session")
def bwrap() -> SandboxBackend:
    try:
        backend = get_backend("bwrap")
        backend.run(["true"], {}, __import__("tidal.types", fromlist=["Limits"]).Limits(timeout_s=10))
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")
    return backend
