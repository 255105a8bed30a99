"""tidal's sides of bench/rl_step.py: the synchronous step (`tidal`, `tidal-unshared`) and the
asynchronous one (`tidal-async`), each run in its own subprocess by rl_step.py.

The synchronous step generates a batch, scores it, trains on it and hands the weights to the
engine, one after another: on-policy, as TRL's `GRPOTrainer` does. The asynchronous one is how
`pipeline.mode: async` runs with the local backend and `algorithm.max_staleness: 1`, built from the
same parts as pipeline/async_source.py: a rollout engine on its own copy of the model generates and
scores batch b + 1 on a sampler thread while the trainer trains batch b; after each update the
trainer publishes its weights (`weights.publish`: a copy, its checksum and canary logprobs), and
the sampler starts batch b only once version b - 1 or newer is published, loading and verifying it
first (`weights.load_verified`). torch's threads are split between the two threads as the loop
splits them by default (`backends.local.cpu_thread_split`: halved, at least one each). Each
batch is thus at most one update stale when trained, and the update's PPO ratio is taken against
the logprobs of the weights that sampled it.

The synchronous step records its phases (bench/rl_step_phases.py): generate and score timed
around the calls below, the update's phases through torch hooks on the model and the optimizer,
from outside the trainer.
"""

from __future__ import annotations

import argparse
import copy
import queue
import threading
import time
from typing import Any

import rl_step
import rl_step_phases


def _parts(args: argparse.Namespace, shared: bool) -> dict[str, Any]:
    """The model, engine, trainer and prompts of one tidal side."""
    import torch

    from tidal.config.schema import AlgorithmConfig, TrainerConfig
    from tidal.models.io import render_prompt
    from tidal.rollout.engine import EmbeddedEngine
    from tidal.trainer.trainer import Trainer
    from tidal.types import Task, VerifierSpec

    model, tokenizer = rl_step.build_model_and_tokenizer(args.seed, args.model)
    device = torch.device("cpu")
    total_steps = args.warmup + args.steps + 1  # the last one is counted, not timed
    # With --kl, the reference is the starting weights, as TRL's (reloaded from the folder).
    reference = copy.deepcopy(model) if args.kl[0] else None
    # fp32 as on TRL's side: precision `auto` takes bf16 autocast for a real model on a CPU with AMX.
    trainer_cfg = TrainerConfig(
        lr=1e-5, micro_batch_size=args.prompts * args.samples, shared_prefix=shared, precision="fp32"
    )
    trainer = Trainer(
        model, trainer_cfg, AlgorithmConfig(kl_coef=args.kl[0]), device, total_steps=total_steps, ref_model=reference,
    )
    questions = rl_step.arithmetic_questions(args.seed)
    # The questions as tasks, for the groups (the bench scores with rl_step.arithmetic_reward).
    tasks = [
        Task(id=f"q{i:03d}", domain="math", prompt=q, verifier=VerifierSpec(name="math", answer=str(a)))
        for i, (q, a) in enumerate(questions)
    ]
    prompt_ids = [render_prompt(tokenizer, [{"role": "user", "content": q}]) for q, _ in questions]
    return {"model": model, "tokenizer": tokenizer, "device": device, "trainer": trainer, "questions": questions,
            "tasks": tasks, "prompt_ids": prompt_ids, "total_steps": total_steps,
            "engine": EmbeddedEngine(model, tokenizer, device)}


def sample_batch(args: argparse.Namespace, parts: dict[str, Any], engine: Any, index: int) -> tuple[Any, dict[str, float]]:
    """Step `index`'s batch from `engine`: generated, scored, with GRPO advantages, collated; and
    its facts (phase seconds, completions, tokens, reward, the weight version that sampled it)."""
    from tidal.algos import assign_advantages
    from tidal.rollout.engine import SamplingParams
    from tidal.trainer.logprobs import collate
    from tidal.types import Episode, Group, Outcome, Score, flatten

    questions = parts["questions"]
    chosen = [(index * args.prompts + p) % len(questions) for p in range(args.prompts)]
    params = SamplingParams(
        temperature=1.0, max_new_tokens=args.new_tokens, ignore_eos=True, seed=args.seed * 1_000_003 + index
    )
    began = time.perf_counter()
    completions = engine.generate([parts["prompt_ids"][i] for i in chosen], args.samples, params)
    generated = time.perf_counter()
    groups = []
    for position, (question, samples) in enumerate(zip(chosen, completions)):
        task, group_id = parts["tasks"][question], f"step-{index:04d}/q{question:03d}"
        episodes = []
        for k, completion in enumerate(samples):
            reward = rl_step.arithmetic_reward(completion.text, questions[question][1])
            score = Score(reward, Outcome.PASSED if reward else Outcome.FAILED)
            episodes.append(Episode(f"{group_id}/s{k:02d}", task.id, "math", group_id, completion, score))
        groups.append(Group(task, position, episodes))
    assign_advantages(groups, "grpo")
    episodes = flatten(groups)
    batch = collate(episodes, parts["tokenizer"].pad_token_id, parts["device"])
    return batch, {
        "generate_s": generated - began,
        "score_collate_s": time.perf_counter() - generated,
        "completions": len(episodes),
        "tokens": sum(len(e.completion.token_ids) for e in episodes),
        "reward": sum(e.score.value for e in episodes if e.score) / len(episodes),
        "weight_version": engine.weight_version,
    }


def run_tidal(args: argparse.Namespace) -> tuple[list[float], list[dict[str, Any]], dict[str, float]]:
    """The synchronous step. Step seconds of the timed steps, per-step facts (completions, tokens,
    reward, the step's phases), and the FLOPs of one more step, counted (untimed)."""
    parts = _parts(args, shared=args.side != "tidal-unshared")  # each distinct prompt once per micro-batch
    engine, trainer = parts["engine"], parts["trainer"]
    phases = rl_step_phases.PhaseClock()
    # logprob: from the call to the first grad-enabled forward (the reference pass with --kl)
    update = rl_step_phases.UpdateMarks(phases, parts["model"])

    def step(index: int) -> dict[str, Any]:
        batch, facts = sample_batch(args, parts, engine, index)
        phases.add("generate", facts["generate_s"])
        phases.add("score", facts["score_collate_s"])
        began = time.perf_counter()
        update.begin()
        trainer.rl_step(batch)
        engine.update_weights(None, version=index + 1)  # the engine shares the trainer's model
        return {**facts, "train_s": time.perf_counter() - began}

    for index in range(args.warmup):
        step(index)
    phases.take()
    seconds, facts = [], []
    with rl_step.profiled(args.profile == args.side):
        for index in range(args.warmup, parts["total_steps"] - 1):
            start = time.perf_counter()
            facts.append(step(index))
            seconds.append(time.perf_counter() - start)
            facts[-1]["phases"] = phases.take(seconds[-1])
    counter = rl_step.WorkCounter()
    counter.wrap_generate(engine)
    with counter:
        step(parts["total_steps"] - 1)
    update.close()
    return seconds, facts, counter.result()


def run_tidal_async(args: argparse.Namespace) -> tuple[list[float], list[dict[str, float]], dict[str, float]]:
    """The asynchronous step (module docstring). Step seconds of the timed steps (from the end of
    one update and publication to the end of the next, as the trainer sees them), per-step facts,
    and the FLOPs of one more step, run synchronously and counted (the same work)."""
    import torch

    from tidal.pipeline.backends.local import cpu_thread_split
    from tidal.pipeline.weights import (
        UNLOADED,
        WeightChannel,
        canary_ids,
        load_verified,
        publish,
    )
    from tidal.rollout.engine import EmbeddedEngine

    parts = _parts(args, shared=True)
    model, trainer = parts["model"], parts["trainer"]
    rollout = EmbeddedEngine(copy.deepcopy(model).eval().requires_grad_(False), parts["tokenizer"], parts["device"])
    rollout.weight_version = UNLOADED
    canary = canary_ids(parts["tokenizer"])
    channel = WeightChannel()
    channel.publish(publish(model, 0, canary))
    threads = torch.get_num_threads()
    trainer_threads, sampler_threads = cpu_thread_split(threads, 1, None, None)  # the loop's default
    stop = threading.Event()
    batches: queue.Queue = queue.Queue(maxsize=1)  # one batch ready while the trainer trains the one before
    failures: list[BaseException] = []
    last = parts["total_steps"] - 1  # the counted step runs after the thread is done

    def sampler() -> None:
        torch.set_num_threads(sampler_threads)
        try:
            for index in range(last):
                began = time.perf_counter()
                publication = channel.wait_for(index - 1, 600.0, stop)  # admission: max_staleness 1
                if publication is None:
                    return
                waited = time.perf_counter()
                if rollout.weight_version != publication.version:
                    load_verified(rollout, publication, 1e-3)
                loaded = time.perf_counter()
                batch, facts = sample_batch(args, parts, rollout, index)
                batches.put((batch, {**facts, "sampler_idle_s": waited - began, "load_s": loaded - waited}))
        except Exception as error:  # noqa: BLE001 (handed to the trainer, which raises it)
            failures.append(error)
            batches.put(None)

    thread = threading.Thread(target=sampler, name="bench-sampler", daemon=True)
    torch.set_num_threads(trainer_threads)
    thread.start()
    marks, facts = [time.perf_counter()], []
    with rl_step.profiled(args.profile == args.side):
        for index in range(last):
            began = time.perf_counter()
            item = batches.get()
            if item is None:
                raise RuntimeError(f"the sampler thread failed at batch {index}") from failures[0]
            batch, step_facts = item
            taken = time.perf_counter()
            trainer.rl_step(batch)
            trained = time.perf_counter()
            channel.publish(publish(model, index + 1, canary))
            marks.append(time.perf_counter())
            facts.append({**step_facts, "trainer_idle_s": taken - began, "train_s": trained - taken,
                          "publish_s": marks[-1] - trained, "staleness": index - step_facts["weight_version"]})
    stop.set()
    thread.join()
    torch.set_num_threads(threads)
    seconds = [b - a for a, b in zip(marks[args.warmup:], marks[args.warmup + 1:])]
    load_verified(rollout, channel.latest(), 1e-3)
    counter = rl_step.WorkCounter()
    counter.wrap_generate(rollout)
    with counter:
        batch, _ = sample_batch(args, parts, rollout, last)
        trainer.rl_step(batch)
    return seconds, facts[args.warmup:], counter.result()
