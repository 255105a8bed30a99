"""The HTTP side of the LLM judge: one chat completion from an OpenAI-compatible endpoint, with
retries and backoff, and an on-disk cache of the judge's replies.

Failures are typed: `JudgeUnavailable` (timeout, refused connection, HTTP 5xx or 429 after the
retries, HTTP 4xx at once, a reply that is not a chat completion). The judge verifier turns it
into `Outcome.INFRA_ERROR`, which the gate drops: a judge that could not judge is never a 0.

The cache maps (endpoint model, rubric, prompt, answer, grade range) to the judge's reply text,
one JSON file per key under `cache_dir/<2 hex>/<sha256>.json`, written atomically (a temporary
file renamed into place), so several scoring processes can share it. Only replies that parsed
to a grade are stored; an infra error or a malformed reply is asked again next time.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_BACKOFF_S = 30.0


class JudgeUnavailable(Exception):
    """The judge gave no usable reply; `attempts` tries were made."""

    def __init__(self, message: str, attempts: int) -> None:
        self.attempts = attempts
        super().__init__(message)


def chat(endpoint: str, model: str, messages: list[dict[str, str]], *, api_key: str | None, timeout_s: float,
         retries: int, backoff_s: float, max_tokens: int) -> tuple[str, int]:
    """The judge's reply text to `messages` (temperature 0) and the number of tries it took."""
    body = json.dumps({"model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    problem = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(MAX_BACKOFF_S, backoff_s * 2 ** (attempt - 1)))
        request = urllib.request.Request(f"{endpoint}/chat/completions", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return _reply_text(response.read(), attempt + 1), attempt + 1
        except urllib.error.HTTPError as error:
            detail = error.read()[:200].decode("utf-8", "replace")
            problem = f"HTTP {error.code} from {endpoint}: {detail}"
            if error.code not in RETRY_STATUS:
                raise JudgeUnavailable(problem, attempt + 1) from None
        except TimeoutError:
            problem = f"no reply from {endpoint} within {timeout_s:g} s"
        except (urllib.error.URLError, ConnectionError, OSError) as error:
            reason = getattr(error, "reason", error)
            problem = f"cannot reach {endpoint}: {reason}"
            if isinstance(reason, (TimeoutError, socket.timeout)):
                problem = f"no reply from {endpoint} within {timeout_s:g} s"
    raise JudgeUnavailable(f"{problem} (after {retries + 1} tries)", retries + 1)


def _reply_text(raw: bytes, attempts: int) -> str:
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise JudgeUnavailable(f"the reply is not a chat completion: {raw[:200]!r}", attempts) from None
    if not isinstance(content, str):
        raise JudgeUnavailable(f"the reply's content is {type(content).__name__}, not text", attempts)
    return content


class JudgeCache:
    """The judge's replies on disk under `folder` (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder).expanduser()

    @staticmethod
    def key(model: str, rubric: str, prompt: str, answer: str, grades: tuple[int, int]) -> str:
        record = json.dumps([model, rubric, prompt, answer, list(grades)], ensure_ascii=False)
        return hashlib.sha256(record.encode("utf-8", "surrogatepass")).hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> str | None:
        try:
            data: Any = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # absent, or torn by a crash: asked again
        reply = data.get("reply") if isinstance(data, dict) else None
        return reply if isinstance(reply, str) else None

    def put(self, key: str, reply: str) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump({"reply": reply}, out)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
