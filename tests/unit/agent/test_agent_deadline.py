"""The wall-time budget holds inside a step: a command, an endpoint's reply and a local engine's
turn are all cut at what is left of the episode, which then ends `timeout` with the partial turn."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from tidal.agent.endpoint import EndpointPolicy
from tidal.agent.local import LocalPolicy
from tidal.agent.policy import ScriptedPolicy
from tidal.agent.protocol import TurnTimeout
from tidal.agent.records import AgentOutcome, Termination
from tidal.agent.runner import AgentConfig, run_episode
from tidal.agent.toolcall import format_tool_call
from tidal.sandbox.base import SandboxBackend
from tidal.types import Limits, Task

TEST = "def test_out():\n    assert open('out.txt').read().strip() == 'hello'\n"


def _task() -> Task:
    return Task(id="slow", domain="agent", prompt="Write hello into out.txt", verifier={"name": "python_tests"},
                tests={"test_out.py": TEST}, tools=["bash"], max_steps=3, limits=Limits(timeout_s=30))


def test_a_3s_command_under_a_2s_budget_ends_the_episode_at_the_budget(bwrap: SandboxBackend) -> None:
    policy = ScriptedPolicy([format_tool_call("bash", {"command": "sleep 3; echo hello > out.txt"})])
    started = time.monotonic()
    result = run_episode(_task(), policy, bwrap, AgentConfig(wall_time_s=2.0))
    elapsed = time.monotonic() - started
    assert result.outcome is AgentOutcome.TIMEOUT and result.termination is Termination.TIMEOUT
    assert result.wall_s < 3.0 and elapsed < 3.0 + result.acceptance_s
    (step,) = result.steps  # the partial turn is recorded: its call ran and was killed
    assert step.calls[0].name == "bash" and not step.calls[0].ok
    assert "during the tools of turn 0" in result.detail


class _SlowHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(3.0)
        body = b'{"choices": [{"message": {"content": "late"}, "finish_reason": "stop"}]}'
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up at its deadline

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture()
def slow_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_an_endpoint_reply_slower_than_the_budget_is_a_timeout_not_an_infra_error(
        bwrap: SandboxBackend, slow_server: str) -> None:
    policy = EndpointPolicy("slow", slow_server, timeout_s=120, request_retries=2, retry_delay_s=0.01)
    result = run_episode(_task(), policy, bwrap, AgentConfig(wall_time_s=1.5))
    assert result.outcome is AgentOutcome.TIMEOUT, result.detail
    assert result.wall_s < 3.0 and "wall time" in result.detail


def test_a_local_turn_past_its_deadline_is_cancelled_and_the_engine_carries_on() -> None:
    policy = LocalPolicy.load("tiny", device="cpu")
    try:
        conversation = policy.start(_task(), [{"role": "user", "content": "hi"}], [])
        with pytest.raises(TurnTimeout) as caught:
            conversation.generate(64, deadline=time.monotonic())
        assert caught.value.turn is not None and caught.value.turn.finish_reason == "timeout"
        turn = conversation.generate(4)  # the cancelled job left the batcher working
        assert turn.tokens_out >= 1
    finally:
        policy.close()
