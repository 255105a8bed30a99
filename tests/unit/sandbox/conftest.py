"""Fixtures for sandbox tests: a working bwrap backend, or a skip saying why there is none."""

from __future__ import annotations

import pytest

from tidal.errors import SandboxUnavailableError
from tidal.sandbox import SandboxBackend, get_backend
from tidal.types import Limits


@pytest.fixture(scope="session")
def bwrap() -> SandboxBackend:
    try:
        backend = get_backend("bwrap")
        backend.run(["/bin/true"], {}, Limits(timeout_s=20))
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")
    return backend

