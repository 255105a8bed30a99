"""A streamed chat completion (`"stream": true`, server-sent events), reassembled into the reply a
non-streamed request returns, with the time to its first token.

Only for timing: an endpoint that streams lets the eval measure time to first token (the first
chunk that carries content or a tool call), which a non-streamed request cannot. The chunks'
`delta`s are joined: `content` concatenated, `tool_calls` merged by `index` (id, name, and the
`arguments` text concatenated), the last `finish_reason` kept, and `usage` taken from the final
chunk (`stream_options.include_usage`). A server that ignores `stream` and answers with one JSON
body is read as a plain reply, with no first-token time. Failures are typed as `EndpointClient._post`'s are; a
stream that breaks off or holds a line that is not JSON is `EndpointUnavailableError` (the server
failed, not the model).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from tidal.agent.http_errors import http_error
from tidal.agent.protocol import TurnTimeout
from tidal.errors import EndpointUnavailableError

MAX_STREAM_BYTES = 8 << 20


def stream_chat(client: Any, body: dict[str, Any],
                deadline: float | None = None) -> tuple[dict[str, Any], float | None]:
    """(the reply as a non-streamed request gives it, seconds to the first token or None), with the
    client's quick retries of unavailable endpoints. With `deadline` (time.monotonic()) the socket
    timeout is cut to what is left, the stream is abandoned when it passes, and no retry starts
    after it: `TurnTimeout`, as `EndpointClient.chat` does."""
    for attempt in range(client.request_retries + 1):
        timeout = client.timeout_s if deadline is None else min(client.timeout_s, deadline - time.monotonic())
        if timeout <= 0:
            raise TurnTimeout(f"{client.base_url}: the episode's wall time ran out before the reply")
        try:
            return _stream_once(client, body, timeout, deadline)
        except EndpointUnavailableError:
            if deadline is not None and time.monotonic() >= deadline:
                raise TurnTimeout(f"{client.base_url}: no reply before the episode's wall time ran out") from None
            if attempt == client.request_retries:
                raise
            time.sleep(client.retry_delay_s * (2 ** attempt))
    raise AssertionError("unreachable")


def _stream_once(client: Any, body: dict[str, Any], timeout_s: float,
                 deadline: float | None) -> tuple[dict[str, Any], float | None]:
    url = client.base_url + "/chat/completions"
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if client.api_key:
        headers["Authorization"] = f"Bearer {client.api_key}"
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    request = urllib.request.Request(url, json.dumps(payload).encode("utf-8"), headers, method="POST")
    started = time.perf_counter()
    state = _Reply()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            if response.headers.get_content_type() == "application/json":
                return _plain(response.read(MAX_STREAM_BYTES + 1), url), None
            read = 0
            for raw in response:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TurnTimeout(f"{url}: the stream was cut at the episode's wall time")
                read += len(raw)
                if read > MAX_STREAM_BYTES:
                    raise EndpointUnavailableError(f"{url}: stream over {MAX_STREAM_BYTES >> 20} MiB", url)
                if state.add_line(raw, url) and state.first_token_s is None:
                    state.first_token_s = time.perf_counter() - started
                if state.done:
                    break
    except urllib.error.HTTPError as error:
        raise http_error(url, error) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
        reason = getattr(error, "reason", error)
        raise EndpointUnavailableError(f"{url}: the stream broke off ({reason})", url) from None
    if not state.done and not state.chunks:
        raise EndpointUnavailableError(f"{url}: the stream held no chunks", url)
    return state.reply(), state.first_token_s


def _plain(data: bytes, url: str) -> dict[str, Any]:
    """The reply of a server that ignored `stream` and answered in one JSON body: no first-token time."""
    if len(data) > MAX_STREAM_BYTES:
        raise EndpointUnavailableError(f"{url}: response over {MAX_STREAM_BYTES >> 20} MiB", url)
    try:
        parsed = json.loads(data)
    except ValueError:
        raise EndpointUnavailableError(f"{url}: the response is not JSON: {data[:200]!r}", url) from None
    if not isinstance(parsed, dict):
        raise EndpointUnavailableError(f"{url}: the response is not a JSON object", url)
    return parsed


class _Reply:
    """The reply being assembled from chunks."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] = {}
        self.chunks = 0
        self.done = False
        self.first_token_s: float | None = None

    def add_line(self, raw: bytes, url: str) -> bool:
        """Take one SSE line; whether it carried the model's first output (content or a call)."""
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            return False  # blank separators, comments, `event:` lines
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            self.done = True
            return False
        try:
            chunk = json.loads(data)
        except ValueError:
            raise EndpointUnavailableError(f"{url}: a stream chunk is not JSON: {data[:200]!r}", url) from None
        if not isinstance(chunk, dict):
            raise EndpointUnavailableError(f"{url}: a stream chunk is not a JSON object", url)
        self.chunks += 1
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        output = False
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                self.content.append(delta["content"])
                output = True
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    self._merge_call(call)
                    output = True
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
        return output

    def _merge_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self.calls))
        entry = self.calls.setdefault(index if isinstance(index, int) else len(self.calls),
                                      {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        if isinstance(function.get("name"), str):
            entry["function"]["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            entry["function"]["arguments"] += function["arguments"]

    def reply(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return {"choices": [{"message": message, "finish_reason": self.finish or "stop"}], "usage": self.usage}
