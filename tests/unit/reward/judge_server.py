"""A real OpenAI-compatible HTTP server for judge tests that answers from a script.

`ScriptedJudge(script)` serves `POST /v1/chat/completions` on 127.0.0.1 (a free port) in a thread.
Each request takes the next step of `script` (the last one repeats): a reply text, or a `Step` with
an HTTP status, a delay before answering, or a raw body. `requests` records every request body and
its headers, so a test can count tries and check what the judge was sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Step:
    reply: str = ""
    status: int = 200
    delay_s: float = 0.0
    raw: bytes | None = None  # sent as is instead of a chat completion


class ScriptedJudge:
    def __init__(self, script: list[str | Step] | Callable[[dict[str, Any]], str | Step]) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                step = judge._next({"body": body, "headers": dict(self.headers), "path": self.path})
                time.sleep(step.delay_s)
                if step.raw is not None:
                    payload = step.raw
                elif step.status == 200:
                    payload = json.dumps({"id": "x", "object": "chat.completion", "model": body.get("model"),
                                          "choices": [{"index": 0, "finish_reason": "stop",
                                                       "message": {"role": "assistant", "content": step.reply}}]}).encode()
                else:
                    payload = json.dumps({"error": {"message": step.reply or "scripted failure"}}).encode()
                try:
                    self.send_response(step.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _next(self, request: dict[str, Any]) -> Step:
        with self._lock:
            self.requests.append(request)
            if callable(self.script):
                step = self.script(request["body"])
            else:
                step = self.script[min(len(self.requests) - 1, len(self.script) - 1)]
        return Step(reply=step) if isinstance(step, str) else step

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedJudge:  # noqa: PYI034
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
