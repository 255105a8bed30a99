"""Fixtures shared by every test folder: a headless Chromium for the pages tidal writes or serves.

The browser is Debian's `chromium` (installed by .ci/run), driven by the `playwright` package
through its executable path: nothing is downloaded. `open_page(url, width)` gives a page loaded at
that viewport width; pages are closed after the test, the browser after the session.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser")


def chromium_path() -> str:
    """The Chromium executable on PATH; a test that needs it fails (not skips) without it."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no chromium on PATH: install Debian's chromium (`apt-get install chromium`; .ci/run does)")


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the session (a playwright Browser)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True,
                                             args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def open_page(chromium: Any) -> Iterator[Callable[..., Any]]:
    """`open_page(url, width=1200, height=900)`: a new page at that viewport, loaded (network idle).
    Console errors and failed requests are collected on `page.tidal_errors` for the test to check."""
    pages: list[Any] = []

    def open_(url: str, width: int = 1200, height: int = 900) -> Any:
        context = chromium.new_context(viewport={"width": width, "height": height})
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("requestfailed", lambda request: errors.append(f"request failed: {request.url}"))
        page.tidal_errors = errors
        pages.append(context)
        page.goto(url, wait_until="networkidle")
        return page

    yield open_
    for context in pages:
        context.close()
