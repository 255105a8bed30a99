"""Fixtures for the audit tests: a skip when bwrap cannot run."""

from __future__ import annotations

import pytest

from tidal.errors import SandboxUnavailableError
from tidal.sandbox import get_backend
from tidal.types import Limits


@pytest.fixture(scope="session")
def bwrap() -> None:
    try:
        get_backend("bwrap").run(["/bin/true"], {}, Limits(timeout_s=20))
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")
