"""The per-phase split of bench/rl_step.py's steps, measured from outside both trainers.

A step's phases are generate (sampling), score (reward, advantages, collation: everything the
batch needs between sampling and the update), logprob (the no-grad pass over the batch for old or
reference log-probs), forward_backward (the policy loss's forward and backward passes, from the
first grad-enabled forward of the policy to the last gradient accumulated into a parameter),
optimizer (from that last gradient to the end of the optimizer step: gradient clipping and AdamW)
and other (the step's time that none of those holds: schedule, zero_grad, the trainers'
bookkeeping). Sampling and scoring are timed around calls (tidal's engine, TRL's methods); the
update's phases come from public torch hooks: a forward pre-hook on the policy's input embedding,
a post-accumulate gradient hook on each of its parameters and the global optimizer step post-hook.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from results_md import command_line

SECTION = "## RL step, real model"
PHASES = ("generate", "score", "logprob", "forward_backward", "optimizer", "other")
LABELS = {
    "generate": "generate",
    "score": "score (reward, advantages, collation)",
    "logprob": "log-prob pass (no grad)",
    "forward_backward": "forward + backward (policy loss)",
    "optimizer": "optimizer (clip + AdamW step)",
    "other": "other (schedule, zero_grad, bookkeeping)",
}


def section_title(kl: list[float]) -> str:
    """Without KL the section; with a reference model (--kl > 0) a section of its own beside it."""
    return SECTION if not any(kl) else SECTION + ", with a reference model"


class PhaseClock:
    """Seconds per phase, exclusive: time spent in a phase opened (or added) inside another is not
    counted in the outer one as well."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._open: list[list[Any]] = []  # [name, start, seconds of the phases inside it]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._open.append([name, time.perf_counter(), 0.0])
        try:
            yield
        finally:
            _, start, inner = self._open.pop()
            elapsed = time.perf_counter() - start
            self.seconds[name] += elapsed - inner
            if self._open:
                self._open[-1][2] += elapsed

    def add(self, name: str, seconds: float) -> None:
        """An interval measured by marks rather than around a call."""
        self.seconds[name] += seconds
        if self._open:
            self._open[-1][2] += seconds

    def take(self, step_seconds: float | None = None) -> dict[str, float]:
        """The phases since the last take, reset; with `step_seconds`, `other` is the rest of the step."""
        phases = {name: self.seconds.get(name, 0.0) for name in PHASES if name != "other"}
        if step_seconds is not None:
            phases["other"] = step_seconds - sum(phases.values())
        self.seconds.clear()
        return phases


class UpdateMarks:
    """Times the update's phases on `model` through torch hooks and adds them to `clock`:
    forward_backward from the first grad-enabled forward to the last gradient accumulated into a
    parameter, optimizer from there to the end of the optimizer step; with `begin()` called before
    the update, logprob from then to the first grad-enabled forward."""

    def __init__(self, clock: PhaseClock, model: Any) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.clock = clock
        self.began: float | None = None
        self.first_forward: float | None = None
        self.last_gradient: float | None = None
        # The input embedding starts every forward, whichever entry point the trainer calls (the
        # whole model, or its body with the head applied in chunks).
        embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else model
        self.handles = [embedding.register_forward_pre_hook(self._forward)]
        self.handles += [p.register_post_accumulate_grad_hook(self._gradient)
                         for p in model.parameters() if p.requires_grad]
        self.handles.append(register_optimizer_step_post_hook(self._stepped))

    def begin(self) -> None:
        self.began = time.perf_counter()

    def _forward(self, *_: Any) -> None:
        import torch

        if torch.is_grad_enabled() and self.first_forward is None:
            self.first_forward = time.perf_counter()
            if self.began is not None:
                self.clock.add("logprob", self.first_forward - self.began)

    def _gradient(self, *_: Any) -> None:
        self.last_gradient = time.perf_counter()

    def _stepped(self, *_: Any) -> None:
        now = time.perf_counter()
        if self.first_forward is None or self.last_gradient is None:
            raise RuntimeError("an optimizer step without a forward and backward pass seen by the bench's hooks")
        self.clock.add("forward_backward", self.last_gradient - self.first_forward)
        self.clock.add("optimizer", now - self.last_gradient)
        self.began = self.first_forward = self.last_gradient = None

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def means(steps: list[dict[str, float]]) -> dict[str, float]:
    """Mean seconds of each phase over `steps` (phase -> seconds dicts whose `other` completes the
    step), and of the whole step as "step": means, so that the phases add up to the step."""
    split = {name: statistics.fmean(step[name] for step in steps) for name in PHASES}
    split["step"] = sum(split.values())
    return split


def table(split: dict[str, dict[str, float]], notes: dict[str, dict[str, str]]) -> list[str]:
    """Markdown rows: mean seconds and share of the step per phase for tidal and TRL, and tidal's
    speed over TRL's (TRL's seconds / tidal's, as the completions/s ratio of the tiny model's table).
    `split[side]` is `means` of the side's steps; `notes[side][phase]` follows a phase's number
    with what the side does instead (a phase it does not run), and leaves that row's ratio out."""
    tidal, trl = split["tidal"], split["trl"]
    lines = ["| phase | tidal (s) | tidal share | TRL (s) | TRL share | tidal / TRL speed (TRL s ÷ tidal s) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in PHASES:
        cells = []
        for side, values in (("tidal", tidal), ("trl", trl)):
            note = notes.get(side, {}).get(name)
            cells += [f"{values[name]:.3f}" + (f" ({note})" if note else ""), f"{values[name] / values['step']:.0%}"]
        both = not any(notes.get(side, {}).get(name) for side in ("tidal", "trl"))
        # Phases of a few milliseconds are timer noise next to a step of seconds: no ratio.
        ratio = f"{trl[name] / tidal[name]:.2f}x" if both and min(tidal[name], trl[name]) > 0.01 else ""
        lines.append(f"| {LABELS[name]} | " + " | ".join(cells) + f" | {ratio} |")
    lines.append(f"| **step (mean)** | **{tidal['step']:.3f}** | 100% | **{trl['step']:.3f}** | 100% "
                 f"| **{trl['step'] / tidal['step']:.2f}x** |")
    return lines


def not_run(kl: float) -> dict[str, dict[str, str]]:
    """What each side does instead of a no-grad log-prob pass when it runs none: without a
    reference model (kl 0) both are on-policy and need no old log-probs from a separate pass."""
    if kl:
        return {}
    return {"tidal": {"logprob": "none runs: old log-probs come from sampling; this is `rl_step` before its "
                                 "first forward"},
            "trl": {"logprob": "none runs: on-policy, old log-probs are the loss forward's, detached"}}


def model_section(
    args: argparse.Namespace, rows: list[dict[str, Any]], loads: list[float], parameters: int, vocab: int,
    prompt_tokens: float,
) -> str:
    """The "## RL step, real model" section: the setup, the command, then per KL coefficient and
    thread count the step times, the phase table, and where the time goes."""
    import torch
    import transformers
    from trl import __version__ as trl_version

    config = json.loads((args.model / "config.json").read_text())
    command = "python bench/rl_step.py" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])
    timed = args.steps * args.rounds
    lines = [
        section_title(args.kl),
        "",
        f"The RL step of \"## RL step\" on a real checkpoint: {args.model.name} "
        f"({', '.join(config.get('architectures', []))}, {parameters / 1e6:.1f}M parameters, "
        f"{config.get('num_hidden_layers')} layers, hidden {config.get('hidden_size')}, vocab {vocab}), "
        "loaded by both sides from the folder with its tokenizer and chat template. Same prompts, reward and "
        f"loss: {args.prompts} arithmetic prompts (about {prompt_tokens:.0f} tokens through the chat template) "
        f"x {args.samples} samples of exactly {args.new_tokens} tokens, GRPO advantages, one AdamW update "
        "(lr 1e-5, clip 0.2/0.28), fp32; tidal synchronous (on-policy, as TRL); KL to the starting weights "
        "only where a table says so (k3 in the loss; TRL `beta`, tidal `algorithm.kl_coef`; it adds a "
        f"reference model to each side). Mean of {timed} timed steps per side ({args.rounds} round(s) of "
        f"{args.steps} after {args.warmup} warm-up), each side in its own subprocess pinned to as many cores "
        "as torch threads. The phases are measured from outside both trainers (bench/rl_step_phases.py): "
        "generate and score around the calls (tidal's engine; TRL's `_generate`, its `_prepare_inputs` less "
        "the sampling inside, its no-grad `_get_per_token_logps_and_entropies`); forward + backward from the "
        "first grad-enabled forward of the policy to the last gradient accumulated into a parameter, optimizer "
        "from there to the end of the optimizer step (torch hooks); other is the rest of the step.",
        "",
        command_line(command, f"torch {torch.__version__}", f"transformers {transformers.__version__}",
                     f"trl {trl_version}"),
        "",
    ]
    for row in rows:
        kl = f"KL coefficient {row['kl']}" if row["kl"] else "no KL"
        lines += [f"**{kl}, {row['threads']} torch thread(s)**: median step tidal "
                  f"{row['tidal']['median_step_s']:.2f} s, TRL {row['trl']['median_step_s']:.2f} s; "
                  f"{row['tidal']['completions_per_s']:.2f} against {row['trl']['completions_per_s']:.2f} "
                  f"completions/s: tidal / TRL **{row['ratio']:.2f}x**.", "",
                  *table(row["split"], not_run(row["kl"])), "", where_the_time_goes(row), ""]
    lines += ["TRL samples with the model's own `generate` (no vLLM), tidal with its embedded engine; both "
              "decode with a KV cache. The FLOP gap is the prompt: TRL prefills every sample's copy of its prompt and runs every prompt "
              "token through the update (and the reference pass) once per sample, where tidal runs each "
              "distinct prompt once (`trainer.shared_prefix`; the engine prefills a group's prompt once). "
              f"1-minute load average before each side's run: {', '.join(f'{x:.2f}' for x in loads[:-1])}; "
              f"after: {loads[-1]:.2f}. The benchmark itself keeps about {max(args.threads)} cores busy; a "
              "load above that is other work sharing the machine, and slows both sides.", ""]
    return "\n".join(lines)


def where_the_time_goes(row: dict[str, Any]) -> str:
    """A paragraph from one comparison's numbers: each side's largest phases, the work and its rate."""

    def largest(side: str) -> str:
        split = row["split"][side]
        ranked = sorted(PHASES, key=lambda name: split[name], reverse=True)[:3]
        return ", ".join(f"{LABELS[name].split(' (')[0]} {split[name]:.2f} s ({split[name] / split['step']:.0%})"
                         for name in ranked)

    def rates(side: str) -> str:
        flops, split = row[side]["flops"], row["split"][side]
        update = split["logprob"] + split["forward_backward"] + split["optimizer"]
        return (f"{flops['generate'] / split['generate'] / 1e9:.0f} GFLOP/s sampling, "
                f"{flops['train'] / update / 1e9:.0f} in the update")

    tidal, trl = row["tidal"]["flops"], row["trl"]["flops"]
    less = trl["total"] / tidal["total"]
    faster = row["tidal"]["gflops_per_s"] / row["trl"]["gflops_per_s"]
    return (f"Where the time goes: tidal's step is {largest('tidal')}; TRL's is {largest('trl')}. Work "
            f"(torch's `FlopCounterMode` over one more untimed step): TRL {trl['total'] / 1e9:.0f} GFLOP "
            f"({trl['generate'] / 1e9:.0f} sampling, {trl['train'] / 1e9:.0f} update), tidal "
            f"{tidal['total'] / 1e9:.0f} ({tidal['generate'] / 1e9:.0f}, {tidal['train'] / 1e9:.0f}): TRL computes "
            f"{less:.2f}x tidal's FLOPs and tidal runs at {faster:.2f}x TRL's FLOP rate "
            f"({less:.2f} x {faster:.2f} = {less * faster:.2f}x); tidal {rates('tidal')}, TRL {rates('trl')}.")
