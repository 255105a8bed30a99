"""`tidal serve` as a command: starts, answers the `openai` client with the key, stops on SIGTERM."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False


def test_serve_command_answers_and_stops(tmp_path: Path) -> None:
    port = _free_port()
    command = [sys.executable, "-m", "tidal.cli", "serve", "--model", "tiny", "--port", str(port), "--threads", "1", "--device", "cpu"]
    env = {**os.environ, "TIDAL_API_KEY": "secret"}  # the key from the environment, not the command line
    log = (tmp_path / "serve.log").open("w+")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 180
        while not _healthy(port):
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "tidal serve did not come up"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="secret", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert reply.choices[0].finish_reason in ("stop", "length")
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(60)
    text = (tmp_path / "serve.log").read_text()
    # uvicorn shuts down gracefully, then re-raises the signal so the parent sees how it ended.
    assert code in (0, -signal.SIGTERM), text
    assert "serving tiny" in text and "Finished server process" in text and "Traceback" not in text


def test_serve_command_reports_a_bad_model_folder(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tidal.cli", "serve", "--model", str(tmp_path / "missing")], capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr
