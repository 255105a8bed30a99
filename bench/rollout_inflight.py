"""In-flight weight updates in the embedded engine: how long new weights wait before a token is
sampled under them, and what the generation costs, when they arrive mid-generation.

A call of GRPO groups (--prompts x --samples, random --prompt-tokens ids, exactly --new-tokens
new tokens, temperature 1) on the built-in tiny model; another tiny model's weights arrive after
--arrive-after steps. `drain` is the behaviour without `pipeline.inflight_updates`: the weights wait
for the call to end. `keep` and `recompute` load them before the next step (rollout.inflight_kv).
Reported per mode: the wait from arrival to the first token sampled under the new weights (for
`drain`, to the end of the call, when the next call could start under them), the share of tokens
sampled under the new weights, and the call's time as a ratio to `drain`'s, all from interleaved
rounds in one process (medians).

    python bench/rollout_inflight.py --no-write
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import command_line, write_section

from tidal.config.schema import ModelConfig
from tidal.models import load_model
from tidal.rollout import EmbeddedEngine, SamplingParams

SECTION = "## Rollout: in-flight weight updates"
MODES = ("drain", "keep", "recompute")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--arrive-after", type=int, default=32, help="engine steps before the new weights arrive")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (a tiny model gains nothing from more)")
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return parser.parse_args(argv)


def one_call(mode: str, args: argparse.Namespace, states: list[dict[str, torch.Tensor]],
             prompts: list[list[int]], tokenizer: object) -> dict[str, float]:
    model = load_model(ModelConfig(path="tiny", device="cpu", seed=0)).model.eval()
    engine = EmbeddedEngine(model, tokenizer, inflight_kv="keep" if mode == "drain" else mode)
    engine.update_weights(states[0], version=0)
    clock = {"steps": 0, "arrived": 0.0, "first_new": 0.0}

    def between_steps() -> None:
        clock["steps"] += 1
        if clock["steps"] == args.arrive_after:
            clock["arrived"] = time.perf_counter()
            if mode != "drain":
                engine.update_weights(states[1], version=1)
        elif clock["steps"] == args.arrive_after + 1 and mode != "drain":
            clock["first_new"] = time.perf_counter()  # the step before sampled its tokens under version 1

    engine.between_steps = between_steps
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, ignore_eos=True, seed=0)
    began = time.perf_counter()
    groups = engine.generate(prompts, args.samples, params)
    ended = time.perf_counter()
    versions = [v for group in groups for completion in group for v in completion.versions()]
    first_new = clock["first_new"] if mode != "drain" else ended
    return {"wait_s": first_new - clock["arrived"], "new_share": sum(v == 1 for v in versions) / len(versions),
            "call_s": ended - began}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    loaded = load_model(ModelConfig(path="tiny", device="cpu", seed=0))
    states = [{k: v.clone() for k, v in loaded.model.state_dict().items()},
              {k: v.clone() for k, v in load_model(ModelConfig(path="tiny", device="cpu", seed=1)).model.state_dict().items()}]
    vocab = loaded.model.config.vocab_size
    prompts = torch.randint(10, vocab - 10, (args.prompts, args.prompt_tokens), generator=torch.Generator().manual_seed(0)).tolist()
    rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    one_call("keep", args, states, prompts, loaded.tokenizer)  # warm-up
    for _ in range(args.repeats):
        for mode in MODES:
            rounds[mode].append(one_call(mode, args, states, prompts, loaded.tokenizer))
    median = {mode: {key: statistics.median(r[key] for r in rounds[mode]) for key in rounds[mode][0]} for mode in MODES}
    setup = (f"{args.prompts} prompts x {args.samples} samples, {args.prompt_tokens} prompt tokens, {args.new_tokens} "
             f"new tokens; new weights arrive after {args.arrive_after} steps; {args.threads} torch thread(s); medians of "
             f"{args.repeats} interleaved rounds.")
    lines = [SECTION, "", command_line("python bench/rollout_inflight.py"), "", setup, "", "| mode | wait for the new weights | tokens under them | call time / drain |", "|---|---|---|---|"]
    for mode in MODES:
        m = median[mode]
        lines.append(f"| {mode} | {m['wait_s'] * 1000:.0f} ms | {m['new_share']:.0%} | "
                     f"{m['call_s'] / median['drain']['call_s']:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        write_section(args.results, SECTION, text)


if __name__ == "__main__":
    main()
