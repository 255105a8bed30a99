"""Single-turn answers of a local model as one continuously batched stream through its engine.

`tidal eval` of a local model (`LocalPolicy` on the `EmbeddedEngine`) puts every (task, epoch)
of the single-turn tasks into the engine at once, through a `Batcher` (rollout/batcher.py) sized
to the engine's `max_batch_rows`: rows join the running batch as others finish, as a train run's
held-out evaluation (heldout.py) batches its prompts. Answers are scored in the caller's thread as
they come back, while the engine goes on generating, and each is handed to `finish` at once (the
harness writes its record, so a killed eval resumes from there).

Each answer is what `answers.answer_task` would give for the same policy: the prompt is the one
its conversation renders, and the sampling parameters, seed included, come from that conversation
(`LocalConversation.turn_params`), so a seeded row samples the same tokens whatever shares its
batch. A prompt that fills the context window is `context_exceeded`, not generated. A verdict
that is an infra error is scored again, with the harness's backoff, up to `retries.attempts`.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from typing import Any

from tidal.agent.records import AgentOutcome
from tidal.eval.answers import Answer, ScoreMany, judge, over_window
from tidal.eval.settings import Retries
from tidal.types import Task

Finish = Callable[[Task, int, Answer, int, list[str]], None]  # (task, epoch, answer, attempts, retried details)


def streams(policy: Any) -> bool:
    """Whether `policy` is a local model whose engine takes requests step by step (the embedded
    engine): its single-turn answers can go through `stream_answers`."""
    engine = getattr(policy, "engine", None)
    return (hasattr(policy, "start") and hasattr(policy, "tokenizer")
            and all(callable(getattr(engine, name, None)) for name in ("submit", "step", "complete")))


def stream_answers(policy: Any, work: Sequence[tuple[Task, int]], score_many: ScoreMany, finish: Finish, *,
                   max_new_tokens: int, window: int | None, retries: Retries,
                   sleep: Callable[[float], None] = time.sleep) -> int:
    """Generate and judge an answer to every (task, epoch) of `work` (see the module docstring);
    how many were finished. An engine failure propagates (every answer written so far is kept)."""
    from tidal.rollout.batcher import Batcher, Job, JobResult

    engine = policy.engine
    done: queue.Queue[tuple[int, JobResult | BaseException, float]] = queue.Queue()
    batcher = Batcher(engine, max_batch=int(getattr(engine, "max_batch_rows", 256)), max_queue=len(work) + 1)
    jobs: list[Job] = []
    started: dict[int, float] = {}
    firsts: dict[int, float] = {}
    contexts: dict[int, int] = {}
    finished = 0
    try:
        for index, (task, epoch) in enumerate(work):
            conversation = policy.start(task, task.messages(), [], seed=epoch)
            prompt = list(conversation.token_ids)
            contexts[index] = len(prompt)
            if over_window(len(prompt), window):
                detail = f"the prompt has {len(prompt)} tokens; the model's context window is {window}"
                finish(task, epoch, Answer(AgentOutcome.CONTEXT_EXCEEDED, None, "", detail, len(prompt), 0, 0.0, 0.0,
                                           "", 0.0), 1, [])
                finished += 1
                continue
            started[index] = time.perf_counter()
            job = Job([prompt], 1, conversation.turn_params(max_new_tokens),
                      on_done=lambda result, i=index: done.put((i, result, time.perf_counter())),
                      on_token=lambda _p, _s, _t, i=index: firsts.setdefault(i, time.perf_counter()))
            batcher.submit(job)
            jobs.append(job)
        waiting = len(jobs)
        while waiting:
            ready = [done.get()]
            while True:  # everything else that finished meanwhile is scored in the same call
                try:
                    ready.append(done.get_nowait())
                except queue.Empty:
                    break
            waiting -= len(ready)
            for _, result, _ in ready:
                if isinstance(result, BaseException):
                    raise result
            finished += _judge(ready, work, score_many, finish, started, firsts, contexts, retries, sleep)
    finally:
        for job in jobs:
            job.cancelled = True  # the ones still running (after a failure) are aborted, not finished
        batcher.close()
    return finished


def _judge(ready: list[tuple[int, Any, float]], work: Sequence[tuple[Task, int]], score_many: ScoreMany,
           finish: Finish, started: dict[int, float], firsts: dict[int, float], contexts: dict[int, int],
           retries: Retries, sleep: Callable[[float], None]) -> int:
    """Score the finished rows together, score infra errors again, and hand each answer over."""
    completions = {index: result.completions[0][0] for index, result, _ in ready}
    scores = dict(zip(completions, score_many([(work[i][0], completions[i].text) for i in completions])))
    retried: dict[int, list[str]] = {i: [] for i in completions}
    for attempt in range(1, retries.attempts):
        again = [i for i, score in scores.items() if judge(score) is AgentOutcome.INFRA_ERROR]
        if not again:
            break
        for i in again:
            retried[i].append(scores[i].detail[:500])
        sleep(min(retries.backoff_max_s, retries.backoff_s * 2 ** (attempt - 1)))
        scores.update(zip(again, score_many([(work[i][0], completions[i].text) for i in again])))
    judged_at = time.perf_counter()
    for index, result, at in ready:
        task, epoch = work[index]
        completion, score = completions[index], scores[index]
        outcome = judge(score)
        first = firsts.get(index)
        answer = Answer(outcome, score, completion.text, "" if outcome is AgentOutcome.PASS else score.detail,
                        contexts[index], len(completion.token_ids), at - started[index], result.cpu_s,
                        completion.finish_reason, judged_at - started[index],
                        None if first is None else first - started[index])
        finish(task, epoch, answer, len(retried[index]) + 1, retried[index])
    return len(ready)
