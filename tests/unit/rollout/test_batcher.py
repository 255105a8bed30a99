"""The batcher drives the engine's continuous batch: jobs of any parameters join it between steps."""

from __future__ import annotations

import threading

from tidal.models import LoadedModel
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.rollout.batcher import Batcher, Job, JobResult


def test_a_job_arriving_mid_decode_joins_the_running_batch_and_seeded_jobs_match_generate(
    tiny: LoadedModel, prompts: list[list[int]]
) -> None:
    engine = EmbeddedEngine(tiny.model, tiny.tokenizer)
    batcher = Batcher(engine, max_batch=64, max_queue=8)
    results: dict[str, JobResult | BaseException] = {}
    order: list[str] = []
    done = threading.Event()

    def finished(name: str):
        def on_done(result: JobResult | BaseException) -> None:
            results[name] = result
            order.append(name)
            if len(results) == 3:
                done.set()
        return on_done

    long = SamplingParams(temperature=1.0, max_new_tokens=30, seed=1, ignore_eos=True)
    short = SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=4, seed=2)
    greedy = SamplingParams(temperature=0, max_new_tokens=3)
    joined = []

    def on_token(prompt: int, sample: int, token: int) -> None:
        if not joined:  # the first token of the long job: two others arrive while it decodes
            joined.append(True)
            batcher.submit(Job(prompts[1:], 2, short, on_done=finished("short")))
            batcher.submit(Job(prompts[:1], 1, greedy, on_done=finished("greedy")))

    try:
        batcher.submit(Job(prompts[:2], 2, long, on_done=finished("long"), on_token=on_token))
        assert done.wait(120)
    finally:
        batcher.close()
    assert order[-1] == "long", "the later, shorter jobs finished while the long one still decoded"
    reference = EmbeddedEngine(tiny.model, tiny.tokenizer)
    for name, (job_prompts, n, params) in {"long": (prompts[:2], 2, long), "short": (prompts[1:], 2, short),
                                            "greedy": (prompts[:1], 1, greedy)}.items():
        result = results[name]
        assert isinstance(result, JobResult)
        assert result.batch_jobs == 3 and result.cpu_s > 0
        expected = reference.generate(job_prompts, n, params)
        assert [[c.token_ids for c in g] for g in result.completions] == [[c.token_ids for c in g] for g in expected]
