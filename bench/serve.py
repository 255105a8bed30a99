"""`tidal serve` throughput at 1, 8 and 32 concurrent clients, against the engine called directly.

The server runs in its own process (`tidal serve --model tiny`, the built-in tiny model of default
shape); C client threads here each send R chat requests one after another (temperature 1, no seed,
so that the server may batch them). The baseline is the same prompts and parameters through
`EmbeddedEngine.generate` in this process, C prompts per call: what ideal batching would give with
no HTTP at all. Generated tokens/s of both and their ratio are written into the "## Serve" section
of bench/RESULTS.md.

    python bench/serve.py                                   # 1, 8, 32 clients
    python bench/serve.py --concurrency 1 2 --requests 2 --max-tokens 4 --no-write   # smoke
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import command_line, write_section  # noqa: E402

SECTION = "## Serve"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="client counts (default 1 8 32)")
    parser.add_argument("--requests", type=int, default=4, help="requests per client (default 4)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of each request (default 32)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, server and baseline (default 1)")
    parser.add_argument("--max-batch", type=int, default=32, help="the server's --max-batch (default 32)")
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"), help="file to update")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return parser.parse_args(argv)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _request(port: int, method: str, path: str, body: dict | None = None) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    connection.request(method, path, body=json.dumps(body) if body is not None else None, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    if response.status != 200:
        raise SystemExit(f"{method} {path}: HTTP {response.status}: {payload[:300]!r}")
    return json.loads(payload) if path != "/metrics" else {"text": payload.decode()}


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    command = [
        sys.executable, "-m", "tidal.cli", "serve", "--model", "tiny", "--port", str(port), "--device", "cpu",
        "--threads", str(args.threads), "--max-batch", str(args.max_batch), "--max-queue", str(max(args.concurrency) * 2),
    ]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while True:
        try:
            _request(port, "GET", "/health")
            return server, port
        except (OSError, SystemExit):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise SystemExit(f"the server did not start: {' '.join(command)}") from None
            time.sleep(0.2)


def prompts_for(clients: int) -> list[str]:
    return [f"Request {i}: say something about the number {i * 7 % 100}." for i in range(clients)]


def through_server(port: int, clients: int, args: argparse.Namespace) -> dict[str, float]:
    questions = prompts_for(clients)

    def client(question: str) -> tuple[int, list[float]]:
        tokens, latencies = 0, []
        for _ in range(args.requests):
            started = time.perf_counter()
            body = _request(port, "POST", "/v1/chat/completions", {
                "model": "tiny", "messages": [{"role": "user", "content": question}], "max_tokens": args.max_tokens,
            })  # fmt: skip
            latencies.append(time.perf_counter() - started)
            tokens += body["usage"]["completion_tokens"]
        return tokens, latencies

    before = _batch_stats(port)
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(client, questions))
    seconds = time.perf_counter() - started
    calls, served = (a - b for a, b in zip(_batch_stats(port), before))
    latencies = [value for _, values in results for value in values]
    return {
        "tokens_per_s": sum(tokens for tokens, _ in results) / seconds,
        "requests_per_s": clients * args.requests / seconds,
        "latency_s": statistics.mean(latencies),
        "mean_batch": served / max(calls, 1),
    }


def _batch_stats(port: int) -> tuple[float, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = _request(port, "GET", "/metrics")["text"]
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return values["tidal_serve_batch_requests_count"], values["tidal_serve_batch_requests_sum"]


def through_engine(clients: int, args: argparse.Namespace) -> float:
    """Tokens/s of the same work with the engine called directly, `clients` prompts per call."""
    import torch

    from tidal.config.schema import ModelConfig
    from tidal.models import load_model, render_prompt
    from tidal.rollout import EmbeddedEngine, SamplingParams

    torch.set_num_threads(args.threads)
    loaded = load_model(ModelConfig(path="tiny", device="cpu", seed=0))
    engine = EmbeddedEngine(loaded.model.eval(), loaded.tokenizer, max_batch_rows=args.max_batch)
    prompts = [render_prompt(loaded.tokenizer, [{"role": "user", "content": q}]) for q in prompts_for(clients)]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_tokens)
    engine.generate(prompts[:1], params=params)  # warm-up
    tokens, started = 0, time.perf_counter()
    for _ in range(args.requests):
        for start in range(0, len(prompts), args.max_batch):
            groups = engine.generate(prompts[start : start + args.max_batch], params=params)
            tokens += sum(len(c.token_ids) for group in groups for c in group)
    return tokens / (time.perf_counter() - started)


def section(args: argparse.Namespace, rows: list[dict[str, float]]) -> str:
    command = "python bench/serve.py" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])
    lines = [
        SECTION,
        "",
        f"Generated tokens/s of `tidal serve --model tiny` in its own process, C client threads each sending "
        f"{args.requests} chat requests in turn (max_tokens {args.max_tokens}, temperature 1), against the same prompts "
        "through `EmbeddedEngine.generate` in the benchmark's process, C prompts per call (ideal batching, no HTTP); "
        f"torch threads {args.threads}, --max-batch {args.max_batch}.",
        "",
        command_line(command),
        "",
        "| clients | server (tok/s) | requests/s | mean latency (s) | mean requests per engine call | engine direct (tok/s) | server / engine |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['clients']:.0f} | {row['tokens_per_s']:.0f} | {row['requests_per_s']:.1f} | {row['latency_s']:.2f} | "
            f"{row['mean_batch']:.1f} | {row['engine_tokens_per_s']:.0f} | **{row['ratio']:.2f}x** |"
        )
    lines += [
        "",
        "Where the time goes: concurrency raises the server's throughput because waiting requests with equal "
        "parameters share one engine call (the requests-per-call column); the ratio to the engine alone is what "
        "HTTP, JSON, tokenising and the queue cost.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print("load average at start " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    server, port = start_server(args)
    rows = []
    try:
        for clients in args.concurrency:
            row: dict[str, float] = {"clients": clients, **through_server(port, clients, args)}
            row["engine_tokens_per_s"] = through_engine(clients, args)
            row["ratio"] = row["tokens_per_s"] / row["engine_tokens_per_s"]
            print(
                f"clients={clients:3d} server {row['tokens_per_s']:7.0f} tok/s ({row['requests_per_s']:.1f} req/s, "
                f"{row['mean_batch']:.1f} requests per call)  engine {row['engine_tokens_per_s']:7.0f} tok/s  "
                f"ratio {row['ratio']:.2f}x"
            )
            rows.append(row)
    finally:
        server.terminate()
        server.wait(30)
    if not args.no_write:
        write_section(args.results, SECTION, section(args, rows))
        print(f"wrote the {SECTION!r} section of {args.results}")


if __name__ == "__main__":
    main()
