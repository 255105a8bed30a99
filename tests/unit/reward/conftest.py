"""Fixtures for reward tests: a scoring context on a working bwrap sandbox, or a skip."""

from __future__ import annotations

import pytest

from tidal.errors import SandboxUnavailableError
from tidal.reward import ScoringContext
from tidal.sandbox import get_backend
from tidal.types import Limits


@pytest.fixture(scope="session")
def sandboxed() -> ScoringContext:
    try:
        backend = get_backend("bwrap")
        backend.run(["/bin/true"], {}, Limits(timeout_s=20))
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")
    return ScoringContext(backend)
