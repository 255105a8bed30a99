"""The engine on every decoder architecture (issue 42, items 2 and 3), through its generic forward
(the model's own modules over paged KV), on tiny random checkpoints (`random_checkpoint`):

- the behaviour logprobs are the trainer's teacher-forced ones (`Trainer`'s own pass, shared
  prompts and all, fp32, max |difference| <= 1e-4), greedy output is HF `generate`'s, and for a
  mixture of experts every token is routed to the same experts in the engine and the trainer;
- seeded completions stay the same whatever else is in the batch and whatever `max_batch_rows`,
  when a repeated prompt comes from the prefix cache, when a pool too small for the batch preempts
  sequences, and speculative decoding's greedy output is plain greedy output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from tidal.config.schema import AlgorithmConfig, ModelConfig, TrainerConfig
from tidal.models import LoadedModel, load_model, render_prompt
from tidal.models.random_init import random_checkpoint
from tidal.rollout import EmbeddedEngine, SamplingParams
from tidal.rollout.engine import Request
from tidal.rollout.sampling import derived_seed
from tidal.rollout.speculative_batch import Speculation
from tidal.trainer.logprobs import collate, token_logprobs
from tidal.trainer.trainer import Trainer
from tidal.types import Completion, Episode

ARCHITECTURES = ["llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3", "gpt2", "qwen3_moe", "mixtral"]
MOE = {"qwen3_moe", "mixtral"}
TEMPERATURE = 0.9
SAMPLED = SamplingParams(temperature=TEMPERATURE, max_new_tokens=12, seed=5)
GREEDY = SamplingParams(temperature=0, max_new_tokens=12)
BLOCK = 4  # positions per KV block: prompts and completions cross several block edges


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], LoadedModel]:
    """Each architecture's random checkpoint, loaded as a run loads it (fp32), built on first use."""
    folder = tmp_path_factory.mktemp("architectures")

    @functools.cache
    def load(arch: str) -> LoadedModel:
        loaded = load_model(ModelConfig(path=str(random_checkpoint(arch, folder / arch, seed=0)), device="cpu"))
        loaded.model.eval()
        return loaded

    return load


def _prompts(loaded: LoadedModel) -> list[list[int]]:
    questions = ["hi", "What is 12 + 35? Think step by step."]
    return [render_prompt(loaded.tokenizer, [{"role": "user", "content": q}]) for q in questions]


def _engine(loaded: LoadedModel, **options: object) -> EmbeddedEngine:
    engine = EmbeddedEngine(loaded.model, loaded.tokenizer, forward="generic", kv_block_size=BLOCK, **options)  # type: ignore[arg-type]
    assert engine.forward_path == "generic"
    return engine


def _same(got: list[list[Completion]], want: list[list[Completion]]) -> None:
    assert [[c.token_ids for c in group] for group in got] == [[c.token_ids for c in group] for group in want]
    for group_got, group_want in zip(got, want, strict=True):
        for a, b in zip(group_got, group_want, strict=True):
            assert a.finish_reason == b.finish_reason
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


def _episodes(groups: list[list[Completion]]) -> list[Episode]:
    return [Episode(id=f"{g}-{s}", task_id=str(g), domain="math", group_id=str(g), completion=c)
            for g, group in enumerate(groups) for s, c in enumerate(group)]


class _Routing:
    """The experts each token is sent to, in call order, from every router of a MoE model."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: dict[str, list[torch.Tensor]] = {}
        self.handles = [module.register_forward_hook(self._hook(name)) for name, module in model.named_modules()
                        if type(module).__name__.endswith("TopKRouter")]
        assert self.handles, f"no router in {type(model).__name__}"

    def _hook(self, name: str) -> Callable[..., None]:
        def record(module: torch.nn.Module, args: object, output: tuple[torch.Tensor, ...]) -> None:
            self.calls.setdefault(name, []).append(output[2].detach().clone())  # (tokens, top_k) expert indices
        return record

    def experts(self) -> dict[str, torch.Tensor]:
        """Per router: (tokens, top_k) expert indices of every token seen, sorted within a token."""
        return {name: torch.cat(calls).sort(dim=-1).values for name, calls in self.calls.items()}

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_engine_logprobs_are_the_trainers_and_greedy_is_hf_generate(
    arch: str, checkpoints: Callable[[str], LoadedModel]
) -> None:
    loaded = checkpoints(arch)
    model, prompts = loaded.model, _prompts(loaded)
    engine = _engine(loaded)
    sampled = engine.generate(prompts, 2, SAMPLED)
    batch = collate(_episodes(sampled), pad_id=loaded.tokenizer.pad_token_id)
    assert int(batch.completion_mask.sum()) > 2 * len(prompts)
    # The trainer's own pass (its groups share their prompt: the shared-prefix path), then token_logprobs
    # on whole rows; both must give the engine's behaviour logprobs.
    trainer = Trainer(model, TrainerConfig(precision="fp32", micro_batch_size=4), AlgorithmConfig(), "cpu",
                      total_steps=1, temperature=TEMPERATURE)
    shared = trainer._frozen_logprobs(model, batch)  # (B, T)
    with torch.no_grad():
        whole, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=TEMPERATURE,
                                  positions=batch.completion_mask)  # (B, T)
    mask = batch.completion_mask.bool()
    for name, trained in (("shared-prefix", shared), ("whole rows", whole)):
        difference = (trained - batch.old_logprobs)[mask].abs().max().item()
        assert difference <= 1e-4, f"{arch}: engine vs trainer ({name}) logprobs differ by {difference:.2e}"

    greedy = engine.generate(prompts, 1, GREEDY)
    for prompt, (completion,) in zip(prompts, greedy):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=GREEDY.max_new_tokens, do_sample=False,
                                 eos_token_id=sorted(engine.eos_ids), pad_token_id=loaded.tokenizer.pad_token_id)
        assert completion.token_ids == out[0, len(prompt):].tolist(), arch

    if arch in MOE:  # every token of a sampled sequence goes to the same experts in both
        completion = sampled[1][0]
        routing = _Routing(model)
        try:
            # Prompt 1's own seed: the same completion again, its prompt prefilled and each token decoded.
            seeded = replace(SAMPLED, seed=derived_seed(SAMPLED.seed, 1))
            alone = _engine(loaded, prefix_cache=False)
            (again,) = alone.complete(alone.run([Request(completion.prompt_ids, seeded)])[0])
            assert again.token_ids == completion.token_ids
            in_engine = routing.experts()
            routing.calls.clear()
            ids = torch.tensor([completion.prompt_ids + completion.token_ids])
            with torch.no_grad():
                token_logprobs(model, ids, torch.ones_like(ids))
            in_trainer = routing.experts()
        finally:
            routing.close()
        fed = ids.shape[1] - 1  # the engine never feeds the last sampled token
        assert in_engine.keys() == in_trainer.keys()
        for name, experts in in_engine.items():
            assert experts.shape[0] == fed and torch.equal(experts, in_trainer[name][:fed]), name


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_batching_prefix_reuse_preemption_and_speculation_keep_the_results(
    arch: str, checkpoints: Callable[[str], LoadedModel]
) -> None:
    loaded = checkpoints(arch)
    prompts = _prompts(loaded)
    alone = _engine(loaded, prefix_cache=False).generate(prompts, 3, SAMPLED)

    # Continuous batching: another request in the batch, and rows split over steps (max_batch_rows=2).
    engine = _engine(loaded, max_batch_rows=2)
    other = engine.submit(Request(prompts[1][:-3], SamplingParams(temperature=1.0, max_new_tokens=20, seed=99), n=2))
    _same(engine.generate(prompts, 3, SAMPLED), alone)
    assert other.done

    # Prefix reuse: the same call again takes its prompts' full blocks from the cache.
    before = engine.stats.cached_tokens
    _same(engine.generate(prompts, 3, SAMPLED), alone)
    assert engine.stats.cached_tokens - before >= sum(len(p) // BLOCK * BLOCK for p in prompts[1:])

    # Preemption: room for the longest sequence and a little more, not for six rows.
    longest = max(len(p) for p in prompts) + SAMPLED.max_new_tokens
    tight = _engine(loaded, kv_blocks=-(-longest // BLOCK) + 4)
    _same(tight.generate(prompts, 3, SAMPLED), alone)
    assert tight.stats.preemptions > 0

    # Speculative decoding (prompt lookup): greedy output is plain greedy output.
    plain = _engine(loaded).generate(prompts, 1, GREEDY)
    speculative = _engine(loaded, speculative=Speculation(method="ngram", k=4, max_n=3, min_n=1))
    _same(speculative.generate(prompts, 1, GREEDY), plain)
    stats = speculative.speculative_stats
    assert stats is not None and stats.drafted > 0
