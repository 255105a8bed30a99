"""One checkpoint with a small context window gives the same outcomes in process and through a
real `tidal serve` process: the runner applies serve's window rule before a local turn and reads
the server's `context_length_exceeded` refusal of a served one (agent/window.py), with and without
an overflow strategy that frees room.

The checkpoint is a random Qwen2 with a 1024-token window whose lm_head rows of non-ASCII bytes and
of special tokens other than eos are zero, so its greedy text survives the server's decode and
re-encode (as in test_serve_eval_equivalence.py) and both roads count the same tokens.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tidal.agent.endpoint import EndpointPolicy
from tidal.agent.local import LocalPolicy
from tidal.errors import SandboxUnavailableError
from tidal.eval.harness import run_eval
from tidal.eval.settings import EvalSettings
from tidal.models import build_tiny_tokenizer, save_checkpoint
from tidal.sandbox import get_backend
from tidal.sandbox.base import SandboxBackend
from tidal.types import Task

WINDOW = 1024
BASE = {"temperature": 0.0, "prompt": {"system": "Use the tools."},
        "budgets": {"max_steps": 3, "max_tokens": 32768, "max_new_tokens": 120}}


def _task(task_id: str, prompt: str) -> Task:
    return Task(id=task_id, domain="agent", prompt=prompt, verifier={"name": "python_tests"},
                tests={"test_out.py": "def test_out():\n    assert open('out.txt').read() == 'hi'\n"},
                tools=["bash"], max_steps=3)


TASKS = [_task("short", "Write hi into out.txt"), _task("long", "Write hi into out.txt, and nothing else. " * 40)]


@pytest.fixture(scope="module")
def bwrap() -> SandboxBackend:
    try:
        return get_backend("bwrap")
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=WINDOW, tie_word_embeddings=False,
        use_sliding_window=False, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = Qwen2ForCausalLM(config)
    unsafe = [*range(0x80, 0x100), *(i for i in tokenizer.all_special_ids if i != tokenizer.eos_token_id)]
    with torch.no_grad():
        model.lm_head.weight[unsafe] = 0.0
        model.lm_head.weight[tokenizer.eos_token_id] = 0.0  # turns run to max_new_tokens: the window binds
    return save_checkpoint(model.eval(), tokenizer, tmp_path_factory.mktemp("ckpt") / "small-window")


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


@pytest.fixture(scope="module")
def served(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("w+")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    server = subprocess.Popen([sys.executable, "-m", "tidal.cli", "serve", "--model", str(checkpoint), "--port",
                               str(port), "--threads", "1", "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT,
                              env=env)
    try:
        deadline = time.monotonic() + 180
        while not _healthy(port):
            if server.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"tidal serve did not start: {log.read()[-2000:]}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _outcomes(out: Path) -> dict[str, Any]:
    found = {}
    for record in (json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()):
        trace = json.loads((out / record["trace"]).read_text())
        found[record["task_id"]] = (record["outcome"], record["steps"],
                                    [(s["tokens_in"], s["context_changes"]) for s in trace["steps"]])
    return found


@pytest.mark.parametrize("overflow", [[], ["elide_observations", "drop_turns"]])
def test_a_small_window_gives_the_same_outcomes_in_process_and_served(
        checkpoint: Path, served: str, bwrap: SandboxBackend, tmp_path: Path, overflow: list[str]) -> None:
    settings = EvalSettings.model_validate({**BASE, "context": {"overflow": overflow}})
    local = LocalPolicy.load(str(checkpoint), device="cpu", temperature=0.0)
    try:
        run_eval(local, TASKS, tmp_path / "local", bwrap, settings)
    finally:
        local.close()
    endpoint = EndpointPolicy(checkpoint.name, served, temperature=0.0, request_retries=0)
    run_eval(endpoint, TASKS, tmp_path / "served", bwrap, settings)
    in_process, over_http = _outcomes(tmp_path / "local"), _outcomes(tmp_path / "served")
    assert over_http == in_process
    assert in_process["long"][0] == "context_exceeded" and in_process["long"][1] == 0  # never generated
    if not overflow:  # the first turn fits; the history outgrows the window after it
        assert in_process["short"][:2] == ("context_exceeded", 1)
    else:  # room is freed before each later turn, and the episode runs its steps
        assert in_process["short"][:2] == ("step_limit", 3)
        assert all(changes for _, changes in in_process["short"][2][1:])
