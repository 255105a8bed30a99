"""Time to first token from a streaming endpoint: a real HTTP server on a loopback port sends SSE
chunks with pauses; the streamed reply is reassembled into the same turn a plain reply gives."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tidal.agent.endpoint import EndpointPolicy
from tidal.errors import EndpointUnavailableError
from tidal.tasks import generate_tasks

BEFORE_FIRST_S = 0.3


def _chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        body = {"choices": [], "usage": usage}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


CALL = [_chunk({"role": "assistant"}),  # no output yet: the first token is the next chunk
        _chunk({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "write_", "arguments": '{"path": '}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"name": "file", "arguments": '"x", "content": "hi"}'}}]}),
        _chunk({}, finish="tool_calls"), _chunk({}, usage={"prompt_tokens": 40, "completion_tokens": 9}),
        b"data: [DONE]\n\n"]


@pytest.fixture
def stream_server() -> Iterator[Any]:
    state: dict[str, Any] = {"chunks": CALL, "requests": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            state["requests"].append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            time.sleep(BEFORE_FIRST_S / 2)
            for at, chunk in enumerate(state["chunks"]):
                if at == 1:
                    time.sleep(BEFORE_FIRST_S / 2)
                self.wfile.write(chunk)
                self.wfile.flush()
                time.sleep(0.05)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield state
    server.shutdown()
    server.server_close()


def _conversation(url: str, stream: bool) -> Any:
    policy = EndpointPolicy("m", url, request_retries=0, retry_delay_s=0.0, stream=stream)
    task = generate_tasks("agent", 1, "eval", seed=3, min_difficulty=1, max_difficulty=1)[0]
    tools = [{"type": "function", "function": {"name": "write_file", "parameters": {"type": "object"}}}]
    return policy.start(task, task.messages(), tools)


def test_a_streamed_reply_is_the_same_turn_with_its_first_token_time(stream_server: Any) -> None:
    turn = _conversation(stream_server["url"], stream=True).generate(64)
    assert stream_server["requests"][0]["stream"] is True
    assert stream_server["requests"][0]["stream_options"] == {"include_usage": True}
    assert [c.name for c in turn.parsed.calls] == ["write_file"] and turn.parsed.calls[0].arguments == {
        "path": "x", "content": "hi"}
    assert turn.call_ids == ["call_1"] and turn.finish_reason == "tool_calls"
    assert (turn.tokens_in, turn.tokens_out) == (40, 9)
    assert turn.first_token_s is not None and BEFORE_FIRST_S <= turn.first_token_s < turn.generation_s


def test_a_broken_stream_is_an_infra_error(stream_server: Any) -> None:
    stream_server["chunks"] = [_chunk({"content": "hi"}), b"data: {not json\n\n"]
    with pytest.raises(EndpointUnavailableError, match="not JSON"):
        _conversation(stream_server["url"], stream=True).generate(64)


def test_a_server_that_ignores_stream_gives_a_plain_turn_without_a_first_token_time() -> None:
    reply = {"choices": [{"message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 5, "completion_tokens": 1}}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        turn = _conversation(f"http://127.0.0.1:{server.server_address[1]}/v1", stream=True).generate(8)
    finally:
        server.shutdown()
        server.server_close()
    assert turn.text == "done" and turn.tokens_out == 1 and turn.first_token_s is None
