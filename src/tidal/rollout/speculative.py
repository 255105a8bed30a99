"""Speculative decoding: a drafter proposes k tokens, the target model scores them in one forward
pass, and a rejection-sampling rule keeps or replaces them so that the emitted tokens have exactly
the target's sampling distribution (docs/design/speculative.md has the argument).

The pieces, each usable on its own:

- `Sampling`: the distribution sampled from (temperature, then top-p, renormalised; a point mass at
  the argmax when greedy) and the logprob reported for RL, the embedded engine's convention:
  `log_softmax(logits / temperature)` at the token, BEFORE top-p, temperature 1 when greedy.
- `verify`: the acceptance rule, batched over rows (each row with its own draft length).
- `TargetForward`: the hook the target model is called through (a cache, new tokens -> logits at
  every new position, and a rollback); `HFForward` is the plain `transformers` one.
- `Drafter` / `DraftSession`: the contract drafters implement (rollout/drafting.py has n-gram,
  suffix-index and draft-model drafters).
- `SpeculativeDecoder`: the decode loop for one sequence, and a loop over a batch of them.

Differences from the papers (Leviathan et al. 2023, Chen et al. 2023): the same rule serves greedy
decoding (p and q point masses) and deterministic drafters (q a point mass: accept with p(x), on
rejection sample p with x removed), and p is the top-p-truncated distribution, not the raw softmax.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from tidal.types import FinishReason

# --------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class Sampling:
    """What is sampled from and what is reported; validated on creation."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass in (0, 1]

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature={self.temperature} must be in [0, 100] (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def log_probs(self, logits: Tensor) -> Tensor:
        """The reported logprobs, (..., V): tempered log_softmax before top-p (temperature 1 when greedy)."""
        return torch.log_softmax(logits.float() / (1.0 if self.greedy else self.temperature), dim=-1)

    def probs(self, logits: Tensor) -> Tensor:
        """The distribution sampled from, (..., V), rows summing to 1: a point mass at the argmax when
        greedy, else the tempered softmax truncated to the top-p nucleus and renormalised."""
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
        probs = self.log_probs(logits).exp()
        if self.top_p < 1.0:
            probs = nucleus(probs, self.top_p)
        return probs / probs.sum(dim=-1, keepdim=True)


def nucleus(probs: Tensor, top_p: float) -> Tensor:
    """Zero all but the smallest set of most likely tokens whose mass reaches `top_p` (the embedded
    engine's rule: a token stays while the mass before it is below `top_p`), (..., V), unnormalised."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)  # the top token always stays
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


# --------------------------------------------------------------------------- the acceptance rule


@dataclass
class Verdict:
    """What `verify` decided for each row: row b emits `tokens[b, : accepted[b] + 1]`."""

    accepted: Tensor  # (B,) long, leading draft tokens kept
    tokens: Tensor  # (B, K + 1) long, the kept drafts, then the resampled or bonus token; rest padding
    logprobs: Tensor  # (B, K + 1) float32, the target's reported logprob of each of `tokens`


def accept_probability(p_draft: Tensor, q_draft: Tensor) -> Tensor:
    """min(1, p(x) / q(x)) at each drafted token x, (B, K); q(x) > 0 wherever x was drafted from q."""
    return (p_draft / q_draft.clamp(min=1e-30)).clamp(max=1.0)


def residual(p: Tensor, q: Tensor) -> Tensor:
    """The distribution to sample after a rejection: max(0, p - q) renormalised, (B, V). Where it is
    all zero (p == q, when a rejection has probability 0 and only rounding made one) it is p."""
    rest = (p - q).clamp(min=0.0)
    mass = rest.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, rest / mass.clamp(min=1e-30), p)


def verify(
    target_logits: Tensor,
    draft_tokens: Tensor,
    draft_lengths: Tensor,
    draft_probs: Tensor | None,
    sampling: Sampling,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Speculative sampling's acceptance rule for B rows of up to K drafts each.

    `target_logits` (B, K + 1, V): position i holds the target's logits for the token after draft i
    (position 0: after the sequence before the drafts). `draft_tokens` (B, K), valid up to
    `draft_lengths` (B,). `draft_probs` (B, K, V): the distribution each draft token was sampled
    from, or None for a deterministic drafter (point masses). Draft i is kept with probability
    min(1, p(x)/q(x)) while all before it were kept; at the first rejection a token is sampled from
    the residual max(0, p - q) normalised; when every draft is kept, a bonus token from p.
    """
    batch, positions, vocab = target_logits.shape
    drafts = positions - 1
    device = target_logits.device
    log_probs = sampling.log_probs(target_logits)  # (B, K + 1, V)
    p = sampling.probs(target_logits)  # (B, K + 1, V)
    rows = torch.arange(batch, device=device)
    if drafts > 0:
        tokens = draft_tokens.to(device)
        if draft_probs is None:
            q = torch.nn.functional.one_hot(tokens, vocab).float()  # (B, K, V)
        else:
            q = _fit_vocab(draft_probs.to(device).float(), vocab)
        p_draft = p[:, :drafts].gather(-1, tokens[..., None]).squeeze(-1)  # (B, K)
        q_draft = q.gather(-1, tokens[..., None]).squeeze(-1)  # (B, K)
        uniform = torch.rand((batch, drafts), generator=generator, device=device)
        valid = torch.arange(drafts, device=device)[None, :] < draft_lengths.to(device)[:, None]
        kept = (uniform < accept_probability(p_draft, q_draft)) & valid
        accepted = kept.long().cumprod(dim=-1).sum(dim=-1)  # (B,) the leading run of kept drafts
        rejected = accepted < draft_lengths.to(device)
        q_next = q[rows, accepted.clamp(max=drafts - 1)]  # (B, V)
    else:
        tokens = torch.zeros((batch, 0), dtype=torch.long, device=device)
        accepted = torch.zeros(batch, dtype=torch.long, device=device)
        rejected = torch.zeros(batch, dtype=torch.bool, device=device)
        q_next = torch.zeros((batch, vocab), device=device)
    p_next = p[rows, accepted]  # (B, V) the target's distribution where the kept drafts end
    final = torch.where(rejected[:, None], residual(p_next, q_next), p_next)
    last = torch.multinomial(final, 1, generator=generator).squeeze(1)  # (B,)
    emitted = torch.cat([tokens, torch.zeros((batch, 1), dtype=torch.long, device=device)], dim=1)
    emitted[rows, accepted] = last
    logprobs = log_probs.gather(-1, emitted[..., None]).squeeze(-1)  # (B, K + 1)
    return Verdict(accepted=accepted, tokens=emitted, logprobs=logprobs)


def _fit_vocab(probs: Tensor, vocab: int) -> Tensor:
    """A draft distribution over the target's `vocab` ids: a draft model's head may be padded wider
    (its extra ids carry no mass, `ModelDrafter` masks them) or be narrower (the rest: mass 0)."""
    width = probs.shape[-1]
    if width == vocab:
        return probs
    if width > vocab:
        return probs[..., :vocab]
    return torch.nn.functional.pad(probs, (0, vocab - width))


# --------------------------------------------------------------------------- the target-model hook


class TargetForward(Protocol):
    """How the decoder calls the target model. The engine's own forward (paged KV, the lean
    forward) plugs in here: whatever a cache is, `__call__` appends the new tokens' keys and values
    to it and returns the logits at every new position, and `truncate` drops positions from the end."""

    device: torch.device

    def new_cache(self, capacity: int) -> Any:
        """An empty cache for one sequence of up to `capacity` positions."""
        ...

    def __call__(self, cache: Any, tokens: Tensor, last: int) -> Tensor:
        """Logits (B, last, V) float32 at the last `last` of `tokens` (B, T), which follow the cache's
        positions (a prefill needs one, a verify pass all T: the LM head is costly on a long prompt)."""
        ...

    def truncate(self, cache: Any, length: int) -> None:
        """Keep the first `length` positions of `cache` (roll back rejected drafts)."""
        ...


class HFForward:
    """`TargetForward` through a `transformers` causal LM's own forward, with a `DynamicCache`
    (rolled back with `crop`). Positions follow from the cache length: rows are not padded."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        parameters = inspect.signature(model.forward).parameters
        # transformers renamed `past_key_values` to `cache` in 5.x; accept either (as the engine does).
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"
        self._keeps_logits = "logits_to_keep" in parameters

    def new_cache(self, capacity: int) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def __call__(self, cache: DynamicCache, tokens: Tensor, last: int) -> Tensor:
        kwargs: dict[str, object] = {self._cache_arg: cache}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = last
        output = self.model(input_ids=tokens.to(self.device), use_cache=True, **kwargs)
        return output.logits[:, -last:].float()

    def truncate(self, cache: DynamicCache, length: int) -> None:
        excess = cache.get_seq_length() - length
        if excess > 0:  # crop(0) would be read as "keep nothing" by older transformers
            cache.crop(-excess)


# --------------------------------------------------------------------------- the drafter contract


@dataclass
class Draft:
    """Up to k proposed tokens and, for a sampling drafter, the distributions they came from."""

    tokens: list[int]
    probs: Tensor | None = None  # (len(tokens), V) each row sums to 1; None: deterministic (point masses)


class DraftSession(Protocol):
    """One sequence's drafting state, from its prompt on."""

    def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        """Up to `k` tokens to follow the sequence so far (fewer or none where nothing fits)."""
        ...

    def extend(self, tokens: list[int]) -> None:
        """The tokens the sequence grew by this round (kept drafts, then the sampled token)."""
        ...


class Drafter(Protocol):
    """Makes one session per sequence; `finish` sees each finished completion (a corpus may learn it)."""

    def session(self, prompt: list[int]) -> DraftSession: ...

    def finish(self, prompt: list[int], completion: list[int]) -> None: ...


class NoDraft:
    """Drafts nothing: the decoder then samples one token per target pass (plain decoding)."""

    def session(self, prompt: list[int]) -> NoDraft:
        return self

    def finish(self, prompt: list[int], completion: list[int]) -> None:
        pass

    def propose(self, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        return Draft([])

    def extend(self, tokens: list[int]) -> None:
        pass


# --------------------------------------------------------------------------- the decoder


@dataclass
class SpeculativeStats:
    """Counts of one or more generations; `merge` adds another's."""

    drafted: int = 0  # tokens proposed (and scored by the target)
    accepted: int = 0  # of those, kept
    emitted: int = 0  # tokens generated (kept drafts + resampled/bonus tokens), before eos/length cuts
    target_passes: int = 0  # target forward calls, prefill included
    rounds: int = 0  # verify passes (one per draft)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Tokens generated per verify pass (plain decoding: 1)."""
        return self.emitted / self.rounds if self.rounds else 0.0

    def merge(self, other: SpeculativeStats) -> None:
        for name in ("drafted", "accepted", "emitted", "target_passes", "rounds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class SpeculativeResult:
    """One completion: `tokens` and their target logprobs (the engine's convention), and the counts."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: FinishReason  # "stop" (an eos id) or "length"
    stats: SpeculativeStats = field(default_factory=SpeculativeStats)


class SpeculativeDecoder:
    """Generates from `model` (a `transformers` causal LM or any `TargetForward`) with up to `k`
    drafts per target pass from `drafter`. Output distribution and logprobs are the target's, as
    plain sampling's; `k=0` or `NoDraft()` is plain decoding through the same forward. The model
    is used as it is: put it in eval mode first (`SpeculativeEngine` does)."""

    def __init__(self, model: PreTrainedModel | TargetForward, drafter: Drafter | None = None, k: int = 4) -> None:
        if k < 0:
            raise ValueError(f"k={k} must be >= 0 (0: no drafting)")
        self.forward: TargetForward = HFForward(model) if isinstance(model, PreTrainedModel) else model
        self.drafter: Drafter = drafter if drafter is not None else NoDraft()
        self.k = k

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
        eos_ids: Sequence[int] = (),
    ) -> SpeculativeResult:
        """Up to `max_new_tokens` tokens after `prompt_ids`, stopping after the first of `eos_ids`."""
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; a prompt needs at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        sampling = Sampling(temperature, top_p)
        device = self.forward.device
        stats = SpeculativeStats()
        session = self.drafter.session(list(prompt_ids))
        cache = self.forward.new_cache(len(prompt_ids) + max_new_tokens + self.k + 1)
        # The cache holds every token but the last; each pass feeds the last one and the drafts.
        if len(prompt_ids) > 1:
            self.forward(cache, torch.tensor([prompt_ids[:-1]], device=device), 1)
            stats.target_passes += 1
        cached, last = len(prompt_ids) - 1, prompt_ids[-1]
        eos = set(eos_ids)
        tokens: list[int] = []
        logprobs: list[float] = []
        while len(tokens) < max_new_tokens:
            room = max_new_tokens - len(tokens)
            draft = session.propose(min(self.k, room - 1), sampling, generator) if room > 1 and self.k else Draft([])
            count = min(len(draft.tokens), self.k, room - 1)
            chunk = torch.tensor([[last, *draft.tokens[:count]]], device=device)
            logits = self.forward(cache, chunk, count + 1)  # (1, count + 1, V)
            probs = draft.probs[None, :count] if draft.probs is not None else None
            verdict = verify(logits, chunk[:, 1:], torch.tensor([count]), probs, sampling, generator)
            accepted = int(verdict.accepted[0])
            emitted = verdict.tokens[0, : accepted + 1].tolist()
            emitted_logprobs = verdict.logprobs[0, : accepted + 1].tolist()
            cached += 1 + accepted  # `last` and the kept drafts; the resampled token is the new `last`
            self.forward.truncate(cache, cached)
            stats.target_passes += 1
            stats.rounds += 1
            stats.drafted += count
            stats.accepted += accepted
            stats.emitted += len(emitted)
            for token, logprob in zip(emitted, emitted_logprobs):
                tokens.append(token)
                logprobs.append(logprob)
                if token in eos:
                    return SpeculativeResult(tokens, logprobs, "stop", stats)
            session.extend(emitted)
            last = emitted[-1]
        return SpeculativeResult(tokens, logprobs, "length", stats)

    def generate_batch(
        self,
        prompts: list[list[int]],
        n: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
        eos_ids: Sequence[int] = (),
    ) -> tuple[list[list[SpeculativeResult]], SpeculativeStats]:
        """`n` completions per prompt, one sequence at a time; each finished one goes to the
        drafter's `finish` (a corpus drafter then drafts the group's later samples from it)."""
        total = SpeculativeStats()
        results: list[list[SpeculativeResult]] = []
        for prompt in prompts:
            group = []
            for _ in range(n):
                result = self.generate(prompt, max_new_tokens, temperature, top_p, generator, eos_ids)
                self.drafter.finish(list(prompt), result.tokens)
                total.merge(result.stats)
                group.append(result)
            results.append(group)
        return results, total
