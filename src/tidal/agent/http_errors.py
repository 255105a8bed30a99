"""HTTP error statuses of an OpenAI-compatible endpoint as tidal's typed endpoint errors."""

from __future__ import annotations

import urllib.error

from tidal.errors import (
    EndpointAuthError,
    EndpointConfigError,
    EndpointError,
    EndpointRequestError,
    EndpointUnavailableError,
)


def http_error(url: str, error: urllib.error.HTTPError) -> EndpointError:
    """The typed error for an HTTP error status of an OpenAI-compatible endpoint."""
    try:
        detail = error.read(2000).decode("utf-8", errors="replace").strip()
    except OSError:
        detail = ""
    status = error.code
    text = f"{url}: HTTP {status}" + (f": {detail[:500]}" if detail else "")
    if status in (401, 403):
        return EndpointAuthError(text + "; check the API key (the variable named by api_key_env)", url, status)
    if status == 404:
        return EndpointConfigError(text + "; check the model name and that the base URL ends in /v1", url, status)
    if status in (400, 413, 422):
        return EndpointRequestError(text, url, status)
    return EndpointUnavailableError(text, url, status)  # 408, 429, 5xx and the rest: try again later
