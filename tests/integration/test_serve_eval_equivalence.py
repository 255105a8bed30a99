"""Evaluating a model through `tidal serve` gives the same episodes as evaluating it in process.

The checkpoint is made here: a small Qwen2 trained for a few seconds to answer its first turn with
one canonical `bash` call, so the served conversation carries a real tool call, its `tool`
result and a second turn after them (the random tiny model never calls a tool). Both roads run
`run_eval` at temperature 0 with the same seeds on real sandboxes; the server is a real one on a
loopback port. Per task the outcome, termination, steps, each step's validity and token counts,
and the tests' verdict must be equal.

Two things the server cannot reproduce are kept out by the checkpoint, not by the code under test
(see `tidal.agent.render`): tokens that do not survive decode + encode (the lm_head rows of
non-ASCII bytes and of special tokens other than eos are held at zero, so the model never picks
them) and calls written in a non-canonical form (the trained call is canonical).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tidal.agent.context import ContextPolicy
from tidal.agent.endpoint import EndpointPolicy
from tidal.agent.local import LocalPolicy
from tidal.agent.render import render_messages
from tidal.agent.toolcall import format_tool_call
from tidal.agent.tools import get_tools, tool_schemas
from tidal.errors import SandboxUnavailableError
from tidal.eval.harness import run_eval
from tidal.eval.settings import Budgets, EvalSettings
from tidal.models import build_tiny_tokenizer, render_prompt, save_checkpoint
from tidal.sandbox import get_backend
from tidal.sandbox.base import SandboxBackend
from tidal.serve import RunningServer, ServeLimits, build_state
from tidal.types import Task

CALL = format_tool_call("bash", {"command": "echo hi >> out.txt"})
SETTINGS = EvalSettings(temperature=0.0, budgets=Budgets(max_steps=2, max_tokens=2048, max_new_tokens=96))


def _task(task_id: str, prompt: str, word: str) -> Task:
    test = f"def test_out():\n    assert open('out.txt').read().split()[0] == {word!r}\n"
    return Task(id=task_id, domain="agent", prompt=prompt, verifier={"name": "python_tests"},
                tests={"test_out.py": test}, tools=["bash"], max_steps=2)


TASKS = [_task("hi", "Write hi into out.txt", "hi"), _task("bye", "Write bye into out.txt", "bye")]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def bwrap() -> SandboxBackend:
    try:
        return get_backend("bwrap")
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable on this host: {error}")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2 (untied head) whose greedy first turn on TASKS[0] is exactly CALL + eos."""
    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=False,
        use_sliding_window=False, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    unsafe = [*range(0x80, 0x100), *(i for i in tokenizer.all_special_ids if i != tokenizer.eos_token_id)]
    prompt = render_prompt(tokenizer, render_messages(ContextPolicy().messages(TASKS[0]),
                                                      tool_schemas(get_tools(TASKS[0].tools))))
    target = tokenizer.encode(CALL, add_special_tokens=False) + [tokenizer.eos_token_id]
    sequence = torch.tensor([prompt + target])
    labels = sequence[0, len(prompt):]
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, betas=(0.9, 0.98))
    for _ in range(300):
        with torch.no_grad():
            model.lm_head.weight[unsafe] = 0.0
        logits = model(sequence).logits[0, len(prompt) - 1:-1]
        if bool((logits.argmax(-1) == labels).all()):  # teacher-forced argmax == the greedy output
            break
        torch.nn.functional.cross_entropy(logits, labels).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    else:
        pytest.fail("the test checkpoint did not learn its tool call in 300 steps")
    return save_checkpoint(model.eval(), tokenizer, tmp_path_factory.mktemp("ckpt") / "caller")


def _episodes(out: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (task, epoch): what must match between the two roads."""
    episodes = {}
    for record in (json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()):
        trace = json.loads((out / record["trace"]).read_text())
        steps = [(s["validity"], s["tokens_in"], s["tokens_out"], [c["name"] for c in s["calls"]]) for s in trace["steps"]]
        episodes[record["task_id"], record["epoch"]] = {key: record[key] for key in (
            "outcome", "termination", "steps", "tokens_in", "tokens_out", "calls_valid", "tests")} | {"per_step": steps}
    return episodes


def test_eval_through_the_server_equals_the_in_process_eval(checkpoint: Path, bwrap: SandboxBackend,
                                                             tmp_path: Path) -> None:
    local = LocalPolicy.load(str(checkpoint), device="cpu", temperature=0.0)
    run_eval(local, TASKS, tmp_path / "local", bwrap, SETTINGS, epochs=2)
    limits = ServeLimits(max_tokens=256, max_batch=4, max_queue=8)
    with RunningServer(build_state(str(checkpoint), limits, device="cpu")) as server:
        endpoint = EndpointPolicy(checkpoint.name, server.base_url, temperature=0.0, request_retries=0)
        run_eval(endpoint, TASKS, tmp_path / "served", bwrap, SETTINGS, epochs=2)
    in_process, served = _episodes(tmp_path / "local"), _episodes(tmp_path / "served")
    assert served == in_process
    # The comparison covered a real tool call and a second turn after its result; the other task
    # was scored too, not crashed on.
    for epoch in (0, 1):
        hi = in_process["hi", epoch]
        assert hi["outcome"] == "pass" and hi["per_step"][0][0] == "valid" and hi["per_step"][0][3] == ["bash"]
        assert hi["steps"] == 2 and hi["per_step"][1][1] > hi["per_step"][0][1] + hi["per_step"][0][2]
        assert in_process["bye", epoch]["outcome"] != "pass"
