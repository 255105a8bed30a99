"""The harness on real sandboxes: infra errors retried and reported apart, an OpenAI-compatible
endpoint (a real HTTP server on a loopback port) driving episodes, and typed endpoint failures."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tidal.agent import AgentOutcome, OraclePolicy, run_episode
from tidal.agent.endpoint import EndpointPolicy
from tidal.errors import EndpointAuthError, SandboxUnavailableError, TaskFormatError
from tidal.eval.harness import evaluate, finish_eval, read_results, run_eval
from tidal.eval.settings import EvalSettings, Retries
from tidal.sandbox import get_backend
from tidal.sandbox.base import SandboxBackend
from tidal.tasks import generate_tasks
from tidal.types import Task


@pytest.fixture(scope="module")
def bwrap() -> SandboxBackend:
    try:
        return get_backend("bwrap")
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")


def _tasks(n: int) -> list[Task]:
    return generate_tasks("agent", n, "eval", seed=3, min_difficulty=1, max_difficulty=1)


class FlakyBackend:
    """The real backend, whose first `failures` session commands fail as a host fault would."""

    def __init__(self, inner: SandboxBackend, failures: int) -> None:
        self.inner, self.failures, self.lock = inner, failures, threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run_in(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            if self.failures > 0:
                self.failures -= 1
                raise SandboxUnavailableError("simulated host fault: cannot start bwrap")
        return self.inner.run_in(*args, **kwargs)


FAST = EvalSettings(retries=Retries(attempts=3, backoff_s=0.0))


def test_infra_errors_are_retried_and_reported_apart(bwrap: SandboxBackend, tmp_path: Path) -> None:
    tasks = _tasks(2)
    waits: list[float] = []
    run = run_eval(OraclePolicy(), tasks[:1], tmp_path / "a", FlakyBackend(bwrap, 1), FAST, sleep=waits.append)
    (record,) = run.records
    assert record["outcome"] == "pass" and record["attempts"] == 2
    assert "simulated host fault" in record["retried_infra_errors"][0] and waits == [0.0]

    out = tmp_path / "b"
    run = run_eval(OraclePolicy(), tasks, out, FlakyBackend(bwrap, 1000), FAST, sleep=waits.append)
    assert [r["outcome"] for r in run.records] == ["infra_error", "infra_error"]
    assert all(r["attempts"] == 3 for r in run.records)
    summary = finish_eval(out, FAST)
    assert summary["infra_errors"] == 2 and summary["scored"] == 0 and summary["pass_rate"] is None
    # A rerun retries exactly the infra errors, and the latest record of each pair wins.
    run = run_eval(OraclePolicy(), tasks, out, bwrap, FAST)
    assert run.ran == 2 and sorted(r["outcome"] for r in run.records) == ["pass", "pass"]
    assert finish_eval(out, FAST)["infra_errors"] == 0


class ChatServer:
    """A chat-completions server on a loopback port that answers from a script of replies."""

    def __init__(self, replies: list[tuple[int, dict[str, Any] | str, float]]) -> None:
        self.replies, self.requests = list(replies), []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append({"body": body, "auth": self.headers.get("Authorization")})
                status, reply, delay = owner.replies.pop(0) if owner.replies else (500, "script ran out", 0.0)
                time.sleep(delay)
                data = (reply if isinstance(reply, str) else json.dumps(reply)).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ChatServer] = []

    def start(replies: list[tuple[int, dict[str, Any] | str, float]]) -> ChatServer:
        servers.append(ChatServer(replies))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _call_reply(name: str, arguments: str) -> tuple[int, dict[str, Any], float]:
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}]}
    return 200, {"choices": [{"message": message, "finish_reason": "tool_calls"}],
                 "usage": {"prompt_tokens": 50, "completion_tokens": 7}}, 0.0


def _policy(url: str, **options: Any) -> EndpointPolicy:
    return EndpointPolicy("m", url, **{"request_retries": 0, "retry_delay_s": 0.0, **options})


def test_endpoint_policy_drives_an_episode(bwrap: SandboxBackend, serve: Any, monkeypatch: Any) -> None:
    task = _tasks(1)[0]
    name = task.prompt.split("file ")[1].split(" ")[0]
    word = task.prompt.split()[-1].rstrip(".")
    server = serve([_call_reply("write_file", '{"path": "x", "content": '),  # broken JSON arguments
                    _call_reply("write_file", json.dumps({"path": name, "content": word + "\n"})),
                    _call_reply("submit", "{}")])
    monkeypatch.setenv("TIDAL_TEST_KEY", "sekret")
    result = run_episode(task, _policy(server.url, api_key_env="TIDAL_TEST_KEY"), bwrap)
    assert result.outcome is AgentOutcome.PASS, result.detail
    assert [s.validity for s in result.steps] == ["parse_error", "valid", "valid"]
    assert result.steps[0].recovered is True and result.steps[1].tokens_in == 50
    first, second = server.requests[0], server.requests[1]
    assert first["auth"] == "Bearer sekret" and first["body"]["tools"][0]["type"] == "function"
    # The bad call was answered on its own id, so the conversation stays valid OpenAI.
    assert second["body"]["messages"][-1]["tool_call_id"] == "call_write_file"


def test_a_401_stops_the_eval_and_keeps_finished_results(bwrap: SandboxBackend, serve: Any, tmp_path: Path) -> None:
    tasks = _tasks(3)
    server = serve([_call_reply("submit", "{}"), (401, {"error": "bad key"}, 0.0)])
    with pytest.raises(EndpointAuthError, match="HTTP 401"):
        run_eval(_policy(server.url), tasks, tmp_path, bwrap, FAST)
    records = read_results(tmp_path / "results.jsonl")
    assert [r["task_id"] for r in records] == [tasks[0].id] and records[0]["outcome"] == "fail"


def test_unreachable_and_slow_endpoints_are_infra_errors(bwrap: SandboxBackend, serve: Any, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    task = _tasks(1)[0]
    run = run_eval(_policy(closed), [task], tmp_path / "down", bwrap, FAST, sleep=lambda s: None)
    assert run.records[0]["outcome"] == "infra_error" and "cannot reach" in run.records[0]["detail"]
    server = serve([(200, {"choices": []}, 2.0)])
    result = run_episode(task, _policy(server.url, timeout_s=0.3), bwrap)
    assert result.outcome is AgentOutcome.INFRA_ERROR and result.reward is None


def test_a_task_folder_with_missing_files_is_a_typed_error(tmp_path: Path) -> None:
    (tmp_path / "suite" / "t1").mkdir(parents=True)
    (tmp_path / "suite" / "t1" / "instruction.md").write_text("do it")
    with pytest.raises(TaskFormatError, match="t1/task.toml: missing"):
        evaluate("oracle", [tmp_path / "suite"], tmp_path / "out")
    assert not (tmp_path / "out" / "results.jsonl").exists()
