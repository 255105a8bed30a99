"""Agent-eval harness overhead and throughput (issue 5's benchmark). Smoke-run only so far.

1. Overhead per agent step: a scripted policy makes S `bash` calls (`true`) in one episode; the
   harness's own time per step (step wall − generation − tool) is reported next to the tool time
   of the same steps, as a ratio, so the machine's speed cancels out.
2. Throughput: episodes per second at 1, 8 and 32 concurrent episodes against an OpenAI-compatible
   endpoint. By default a loopback server in this process that answers instantly (write the
   file, then submit), so what is measured is the harness plus sandboxes; `--endpoint URL` points
   it at `tidal serve` instead, where the server's own throughput for the same requests should
   be reported beside it (not done yet: needs the serve benchmark).

    python bench/eval.py --smoke          # seconds; checks the script runs, numbers mean nothing
    python bench/eval.py                  # fuller run (do not record numbers on a shared machine)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few episodes, to check the script runs")
    parser.add_argument("--endpoint", default=None, help="an OpenAI-compatible base URL (default: loopback stub)")
    args = parser.parse_args()
    steps = 3 if args.smoke else 20
    print("overhead per step:", json.dumps(step_overhead(steps)))
    url = args.endpoint or InstantServer().url
    for concurrency in (1, 8, 32):
        episodes = concurrency if args.smoke else 4 * concurrency
        print(f"concurrency {concurrency}: {throughput(url, episodes, concurrency):.2f} episodes/s ({episodes} episodes)")


if __name__ == "__main__":
    main()
