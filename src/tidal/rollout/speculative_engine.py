"""`SpeculativeEngine`: speculative decoding behind the `RolloutEngine` protocol, so the RL loop can
sample through it today (one sequence at a time; see docs/design/speculative.md for how the
batched engine takes it over). Completions, logprobs and weight versions mean what the embedded
engine's mean; the samples have the same distribution, not the same values for a seed."""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tidal.errors import PreemptedError
from tidal.rollout.engine import Cancel, SamplingParams
from tidal.rollout.speculative import Drafter, SpeculativeDecoder, SpeculativeStats
from tidal.types import Completion


class SpeculativeEngine:
    """Samples completions from `model` with `drafter` proposing up to `k` tokens per target pass.

    `stats` adds up the drafting counts of every call (acceptance rate, target passes)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, drafter: Drafter, k: int = 4) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.decoder = SpeculativeDecoder(model, drafter, k)
        self.weight_version = 0
        self.stats = SpeculativeStats()
        ids = [tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)]
        flat = [i for v in ids for i in (v if isinstance(v, (list, tuple)) else [v]) if i is not None]
        self.eos_ids = sorted({int(i) for i in flat})

    def run_metrics(self) -> dict[str, float]:
        """Drafting counts as `spec/...` columns of the run's metrics rows."""
        return {"spec/drafted": self.stats.drafted, "spec/acceptance_rate": self.stats.acceptance_rate,
                "spec/tokens_per_pass": self.stats.tokens_per_pass}

    def update_weights(self, state_dict: dict[str, Tensor] | None, version: int) -> None:
        """Copy `state_dict` into the target model (None: it is shared with the trainer), set `version`."""
        if state_dict is not None:
            result = self.model.load_state_dict(state_dict, strict=False)
            if result.unexpected_keys:
                raise ValueError(
                    f"update_weights: {len(result.unexpected_keys)} name(s) the model does not have, e.g. "
                    f"{result.unexpected_keys[:3]}; send the state_dict of the same architecture"
                )
        self.weight_version = version

    @torch.inference_mode()
    def generate(
        self, prompts: list[list[int]], n: int = 1, params: SamplingParams | None = None, cancel: Cancel | None = None
    ) -> list[list[Completion]]:
        """`n` completions per prompt, in order. Stop strings are not supported (they raise)."""
        params = params or SamplingParams()
        if params.stop:
            raise ValueError("SpeculativeEngine does not support stop strings yet; use EmbeddedEngine for them")
        if n < 1:
            raise ValueError(f"n={n} must be >= 1")
        generator = torch.Generator(device=self.decoder.forward.device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        eos = [] if params.ignore_eos else self.eos_ids
        version = self.weight_version
        was_training = self.model.training
        self.model.eval()
        try:
            out: list[list[Completion]] = []
            for index, prompt in enumerate(prompts):
                group = []
                for sample in range(n):
                    if cancel is not None and cancel.is_set():
                        raise PreemptedError(f"generation stopped before prompt {index}, sample {sample}")
                    result = self.decoder.generate(prompt, params.max_new_tokens, params.temperature, params.top_p,
                                                   generator, eos)
                    self.decoder.drafter.finish(list(prompt), result.tokens)
                    self.stats.merge(result.stats)
                    group.append(Completion(
                        prompt_ids=list(prompt), token_ids=result.tokens, logprobs=result.logprobs,
                        text=self.tokenizer.decode(result.tokens, skip_special_tokens=True),
                        finish_reason=result.finish_reason,
                        weight_version=version,
                    ))
                out.append(group)
            return out
        finally:
            self.model.train(was_training)
