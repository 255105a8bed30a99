"""Agent-eval harness overhead and throughput (issue 5's benchmark), and a local model's eval:
the batched stream against one answer at a time (issue 43's, `--local`).

1. Overhead per agent step: a scripted policy makes S `bash` calls (`true`) in one episode; the
   harness's own time per step (step wall − generation − tool) is reported next to the tool time
   of the same steps, as a ratio, so the machine's speed cancels out.
2. Throughput: episodes per second at 1, 8 and 32 concurrent episodes against an OpenAI-compatible
   endpoint. By default a loopback server in this process that answers instantly (write the
   file, then submit), so what is measured is the harness plus sandboxes; `--endpoint URL` points
   it at `tidal serve` instead, where the server's own throughput for the same requests should
   be reported beside it (not done yet: needs the serve benchmark).

3. `--local`: `tidal eval` of the built-in tiny model on single-turn `code` tasks (greedy, bwrap
   scoring), the same tasks through the engine as one batched stream (eval/stream.py) and one
   answer at a time (`answer_task` through the same policy, the path every answer took before),
   in the same process. The one-at-a-time side runs the first `--baseline-tasks` tasks (it is
   slow); the ratio is answers/s against answers/s, and the outcomes of the tasks both ran must
   agree. `--write` records the section "Eval of a local model" in bench/RESULTS.md.

    python bench/eval.py --smoke          # seconds; checks the script runs, numbers mean nothing
    python bench/eval.py                  # fuller run (do not record numbers on a shared machine)
    python bench/eval.py --local --tasks 160 --baseline-tasks 40 --write
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tidal.agent import AgentConfig, ScriptedPolicy, format_tool_call, run_episode
from tidal.agent.endpoint import EndpointPolicy
from tidal.eval.harness import run_eval
from tidal.eval.settings import EvalSettings
from tidal.sandbox import get_backend
from tidal.tasks import generate_tasks


def step_overhead(steps: int) -> dict[str, float]:
    backend = get_backend("bwrap")
    task = generate_tasks("agent", 1, "eval", seed=0, min_difficulty=1, max_difficulty=1)[0]
    task = task.model_copy(update={"max_steps": steps + 1})
    policy = ScriptedPolicy([format_tool_call("bash", {"command": "true"})] * steps + [format_tool_call("submit", {})])
    result = run_episode(task, policy, backend, AgentConfig())
    rows = result.steps[:-1]
    overhead = statistics.median(s.overhead_s for s in rows)
    tool = statistics.median(s.tool_s for s in rows)
    return {"steps": len(rows), "overhead_s_p50": overhead, "tool_s_p50": tool, "overhead_over_tool": overhead / tool}


class InstantServer:
    """Answers each chat request at once: write the file the task asks for, then submit."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][1]["content"]
                done = any(m["role"] == "tool" for m in body["messages"])
                if done:
                    name, arguments = "submit", "{}"
                else:
                    target = prompt.split("file ")[1].split(" ")[0]
                    word = prompt.split()[-1].rstrip(".")
                    name, arguments = "write_file", json.dumps({"path": target, "content": word})
                reply = {"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
                         "tool_calls": [{"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}]}}],
                         "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def throughput(url: str, episodes: int, concurrency: int) -> float:
    tasks = generate_tasks("agent", episodes, "eval", seed=concurrency, min_difficulty=1, max_difficulty=1)
    with TemporaryDirectory() as out:
        started = time.perf_counter()
        run_eval(EndpointPolicy("bench", url), tasks, out, get_backend("bwrap"), EvalSettings(),
                 concurrency=concurrency)
        return episodes / (time.perf_counter() - started)


class OneAtATime:
    """The local policy seen as a generic one (no tokenizer to render a stream with): the harness
    answers its tasks through `answer_task`, one at a time, as it did before the stream."""

    def __init__(self, policy: Any) -> None:
        self.policy, self.name, self.engine = policy, policy.name, policy.engine

    def start(self, *args: Any, **kwargs: Any) -> Any:
        return self.policy.start(*args, **kwargs)


def local_eval(tasks: int, baseline_tasks: int, new_tokens: int, threads: int) -> dict[str, Any]:
    import torch

    from tidal.agent.local import LocalPolicy
    from tidal.eval.settings import Budgets

    torch.set_num_threads(threads)
    policy = LocalPolicy.load("tiny", temperature=0.0)
    suite = generate_tasks("code", tasks, "eval", seed=43, min_difficulty=1, max_difficulty=3)
    settings = EvalSettings(budgets=Budgets(max_new_tokens=new_tokens))
    backend = get_backend("bwrap")
    sides: dict[str, Any] = {}
    with TemporaryDirectory() as out:
        for name, run_policy, subset in (("stream", policy, suite), ("one at a time", OneAtATime(policy),
                                                                       suite[:baseline_tasks])):
            started = time.perf_counter()
            run = run_eval(run_policy, subset, Path(out) / name.replace(" ", "_"), backend, settings, model="tiny")
            wall = time.perf_counter() - started
            records = {r["task_id"]: r for r in run.records}
            tokens = sum(int(r["tokens_out"]) for r in run.records)
            sides[name] = {"answers": len(records), "wall_s": wall, "answers_per_s": len(records) / wall,
                           "tokens_per_s": tokens / wall, "tokens": tokens, "records": records,
                           "passed": sum(bool(r["passed"]) for r in records.values())}
    policy.close()
    stream, alone = sides["stream"], sides["one at a time"]
    shared = [t for t in alone["records"] if t in stream["records"]]
    agree = sum(stream["records"][t]["outcome"] == alone["records"][t]["outcome"]
                and stream["records"][t]["tokens_out"] == alone["records"][t]["tokens_out"] for t in shared)
    for side in sides.values():
        del side["records"]
    return {"sides": sides, "speedup": stream["answers_per_s"] / alone["answers_per_s"], "agree": agree,
            "compared": len(shared), "tasks": tasks, "baseline_tasks": baseline_tasks, "new_tokens": new_tokens,
            "threads": threads, "parameters": sum(p.numel() for p in policy.engine.model.parameters())}


def local_section(result: dict[str, Any], command: str) -> str:
    from results_md import command_line

    rows = "\n".join(
        f"| {name} | {side['answers']} | {side['wall_s']:.1f} | {side['answers_per_s']:.2f} | "
        f"{side['tokens_per_s']:.0f} | {side['passed']} | {'**%.1fx**' % result['speedup'] if name == 'stream' else '1.0x'} |"
        for name, side in result["sides"].items())
    return (
        "## Eval of a local model\n\n"
        f"`tidal eval` of the built-in tiny model ({result['parameters'] / 1e6:.2f}M parameters) on single-turn `code` "
        f"tasks (the built-in family, difficulty 1-3), greedy, up to {result['new_tokens']} new tokens, tests scored "
        f"in bwrap sandboxes, {result['threads']} torch thread(s). stream: every task through the engine as one "
        "continuously batched stream, answers scored in batches as they finish (eval/stream.py); one at a time: "
        "the same policy answering through `answer_task`, one task after another (the path every answer took "
        "before). Same process, same weights; the one-at-a-time side runs the first "
        f"{result['baseline_tasks']} tasks, and the ratio is answers/s against answers/s.\n\n"
        f"{command_line(command)}\n\n"
        "| path | answers | wall (s) | answers/s | generated tokens/s | passed | speed-up |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n"
        f"{rows}\n\n"
        f"The {result['compared']} tasks both sides ran got the same outcome and the same number of tokens on "
        f"{result['agree']} of them. Where the time goes: one at a time, each answer is a decode of one row and a "
        "sandbox of its own; in the stream the engine decodes every unfinished answer in each step and the "
        "scorer runs the answers that finished together (one zygote batch per task, sandbox/batch.py) while the "
        f"engine goes on. The load average was {result.get('load', 0):.0f} through the run (other work on the same cores): "
        "compare the ratio, not the absolute rates. The untrained tiny model passes none of these tasks; the bench "
        "measures speed, and that the stream changes no result (the agreement above; "
        "tests/unit/eval/test_eval_stream.py checks it record for record).\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few episodes, to check the script runs")
    parser.add_argument("--endpoint", default=None, help="an OpenAI-compatible base URL (default: loopback stub)")
    parser.add_argument("--local", action="store_true", help="the local-model eval: stream against one at a time")
    parser.add_argument("--tasks", type=int, default=160, help="--local: single-turn code tasks in the stream")
    parser.add_argument("--baseline-tasks", type=int, default=40, help="--local: the first N run one at a time")
    parser.add_argument("--new-tokens", type=int, default=64, help="--local: max new tokens per answer")
    parser.add_argument("--threads", type=int, default=1, help="--local: torch threads")
    parser.add_argument("--write", action="store_true", help="--local: record the section in bench/RESULTS.md")
    args = parser.parse_args()
    if args.local:
        import os

        print("load average at start", " ".join(f"{x:.1f}" for x in os.getloadavg()))
        result = local_eval(args.tasks, args.baseline_tasks, args.new_tokens, args.threads)
        print("load average at the end", " ".join(f"{x:.1f}" for x in os.getloadavg()))
        result["load"] = os.getloadavg()[0]
        print(json.dumps(result, indent=2))
        if args.write:
            from results_md import write_section

            command = "python bench/eval.py " + " ".join(sys.argv[1:])
            write_section(Path(__file__).parent / "RESULTS.md", "## Eval of a local model", local_section(result, command))
        return
    steps = 3 if args.smoke else 20
    print("overhead per step:", json.dumps(step_overhead(steps)))
    url = args.endpoint or InstantServer().url
    for concurrency in (1, 8, 32):
        episodes = concurrency if args.smoke else 4 * concurrency
        print(f"concurrency {concurrency}: {throughput(url, episodes, concurrency):.2f} episodes/s ({episodes} episodes)")


if __name__ == "__main__":
    main()
