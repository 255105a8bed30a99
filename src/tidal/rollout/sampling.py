"""How tokens are drawn: `SamplingParams`, per-row sampling from a batch of logits, stop strings.

`distributions` is the one place that turns logits and each row's parameters into what a row
samples from and what it reports; plain decoding (`sample_rows`) and speculative verification
(rollout/speculative_batch.py) both go through it.

Log-probability convention (the trainer computes the same quantity when it recomputes old
logprobs): for each sampled token, `log_softmax(logits / temperature)` at that token, taken BEFORE
top-k and top-p truncation, with temperature 1 when sampling greedily (temperature 0).

What is sampled from: the tempered softmax, cut to the `top_k` most likely tokens, then to the
top-p nucleus of what is left (transformers' order: temperature, top-k, top-p); a greedy row's is
a point mass at its argmax. Every row carries its own parameters, and a seeded row draws from its
own `torch.Generator`, so what it samples depends on its own logits and seed only, never on the
other rows of the batch; unseeded rows share one generator. A row's draw is one uniform number
inverted through its cumulative distribution (`_inverse_cdf`), batched over the rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Called with (prompt index, sample index, token id) for each token as it is sampled, in step order
# (the server streams from it). It runs on the generating thread, inside the decode loop: keep it cheap.
TokenCallback = Callable[[int, int, int], None]


class Cancel(Protocol):
    """A flag a generation looks at before each decode step (a `threading.Event` is one)."""

    def is_set(self) -> bool: ...


@dataclass
class SamplingParams:
    """How to sample. Validated on creation."""

    temperature: float = 1.0  # 0 = greedy (argmax)
    top_p: float = 1.0  # nucleus mass in (0, 1]; 1 = the whole distribution
    top_k: int | None = None  # keep the k most likely tokens (before top-p); None = all of them
    max_new_tokens: int = 64  # completion length cap; reaching it gives finish_reason "length"
    # Stop strings: generation ends at the token that completes one; `text` is cut before it, while
    # `token_ids`/`logprobs` keep every sampled token (the trainer trains on what was sampled).
    stop: list[str] = field(default_factory=list)
    seed: int | None = None  # same seed, prompt and weights -> the same completions, whatever the batch
    ignore_eos: bool = False  # keep sampling past eos (benchmarks that need fixed lengths)

    def __post_init__(self) -> None:
        problems = []
        if not (0.0 <= self.temperature <= 100.0) or math.isnan(self.temperature):
            problems.append(f"temperature={self.temperature} must be in [0, 100] (0 = greedy)")
        if not (0.0 < self.top_p <= 1.0):
            problems.append(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k is not None and self.top_k < 1:
            problems.append(f"top_k={self.top_k} must be >= 1 (None: no cut)")
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if any(not s for s in self.stop):
            problems.append("stop strings must not be empty")
        if problems:
            raise ValueError("invalid SamplingParams: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def derived_seed(seed: int, *parts: int) -> int:
    """A 63-bit seed for one row from a request's seed and the row's place (prompt, sample):
    splitmix64 steps, so neighbouring places get unrelated streams."""
    value = seed & 0xFFFFFFFFFFFFFFFF
    for part in parts:
        value = (value ^ (part + 0x9E3779B97F4A7C15 + (value << 6) + (value >> 2))) & 0xFFFFFFFFFFFFFFFF
        value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        value ^= value >> 31
    return value & 0x7FFFFFFFFFFFFFFF


@dataclass
class Distributions:
    """What each row of a batch samples from and what it reports (the module docstring)."""

    scaled: Tensor  # (R, V) float32, logits / temperature (1 for a greedy row)
    normaliser: Tensor  # (R,) log sum exp of `scaled`: `scaled - normaliser` is the reported log_softmax
    weights: Tensor  # (R, V) the distribution sampled from, unnormalised (a greedy row: 1 at its argmax)

    def logprobs(self, tokens: Tensor) -> Tensor:
        """The reported logprob of row r's token `tokens[r]` (R,): (R,)."""
        return self.scaled.gather(1, tokens[:, None]).squeeze(1) - self.normaliser


def distributions(logits: Tensor, params: Sequence[SamplingParams]) -> Distributions:
    """Row r of `logits` (R, V) float32 under `params[r]`: its reported logprobs and the
    distribution it samples from (module docstring)."""
    rows, vocab = logits.shape
    device = logits.device
    greedy = [p.greedy for p in params]
    if not all(g or p.temperature == 1.0 for g, p in zip(greedy, params)):  # x / 1.0 == x: else skip the division
        logits = logits / torch.tensor([1.0 if g else p.temperature for g, p in zip(greedy, params)], device=device)[:, None]
    # log_softmax(x)[t] = x[t] - max - log(sum(exp(x - max))), with exp(x - max) also what is sampled
    # from: one pass over the vocabulary instead of log_softmax's and exp's.
    top = logits.max(dim=-1, keepdim=True).values  # (R, 1)
    weights = (logits - top).exp_()  # (R, V), unnormalised probabilities
    normaliser = top.squeeze(1) + weights.sum(dim=-1).log()  # (R,), before any truncation
    cut = [r for r in range(rows) if not greedy[r] and (params[r].top_k or vocab) < vocab]
    if cut:
        weights[cut] = _top_k(weights[cut], torch.tensor([params[r].top_k for r in cut], device=device))
    nucleus = [r for r in range(rows) if not greedy[r] and params[r].top_p < 1.0]
    if nucleus:
        masses = torch.tensor([params[r].top_p for r in nucleus], device=device)
        kept = weights[nucleus]
        weights[nucleus] = _top_p(kept / kept.sum(-1, keepdim=True), masses)
    chosen = [r for r in range(rows) if greedy[r]]
    if chosen:
        weights[chosen] = F.one_hot(logits[chosen].argmax(dim=-1), vocab).to(weights.dtype)
    return Distributions(logits, normaliser, weights)


def sample_rows(
    logits: Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None],
    shared: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """One token per row and its logprob (module docstring): logits (R, V) float32 -> (R,), (R,).
    Row r samples under `params[r]`, drawing from `generators[r]`, or from `shared` when that is
    None; a greedy row draws nothing."""
    rows, device = logits.shape[0], logits.device
    dist = distributions(logits, params)
    token = torch.empty(rows, dtype=torch.long, device=device)
    sampled = [r for r in range(rows) if not params[r].greedy]
    if len(sampled) < rows:
        chosen = [r for r in range(rows) if params[r].greedy]
        token[chosen] = dist.weights[chosen].argmax(dim=-1)
    if sampled:
        weights = dist.weights if len(sampled) == rows else dist.weights[sampled]  # (S, V)
        token[sampled] = _inverse_cdf(weights, _uniforms([generators[r] for r in sampled], shared, device))
    return token, dist.logprobs(token)


def _uniforms(generators: list[torch.Generator | None], shared: torch.Generator, device: torch.device) -> Tensor:
    """One uniform in [0, 1) per row: (S,) float32, from the row's generator or, for every row
    without one, together from `shared`."""
    out = torch.empty(len(generators), device=device)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if unseeded:
        out[unseeded] = torch.rand(len(unseeded), generator=shared, device=device)
    for i, generator in enumerate(generators):
        if generator is not None:
            out[i] = torch.rand(1, generator=generator, device=device)[0]
    return out


def _inverse_cdf(probs: Tensor, uniforms: Tensor, block: int = 256) -> Tensor:
    """A token per row drawn from `probs` (S, V) (unnormalised) by inverting its cumulative sum
    at `uniforms` (S,): one random number per row, so a seeded row costs one tiny generator call,
    not a `multinomial` of its own. Two levels, as a full cumulative sum over a large vocabulary
    is a slow sequential pass: the sums of blocks of `block` tokens first, then the cumulative
    sum inside the block the draw falls in. A token of probability 0 (cut by top-k or top-p) is
    never drawn: its interval is empty."""
    rows, vocab = probs.shape
    pad = -vocab % block
    blocks = F.pad(probs, (0, pad)).view(rows, -1, block)  # (S, B, block)
    outer = blocks.sum(dim=-1).cumsum(dim=-1)  # (S, B)
    target = uniforms * outer[:, -1]  # (S,)
    which = torch.searchsorted(outer, target[:, None], right=True).clamp_(max=outer.shape[1] - 1)  # (S, 1)
    before = torch.where(which > 0, outer.gather(1, (which - 1).clamp(min=0)), torch.zeros_like(target[:, None]))
    inner = blocks[torch.arange(rows, device=probs.device), which.squeeze(1)].cumsum(dim=-1)  # (S, block)
    # Below the block's own total (its sum and its cumulative sum may round apart), so the first
    # position past the draw is a token of positive probability.
    within = torch.minimum(target[:, None] - before, inner[:, -1:] * (1 - 1e-6))
    offset = torch.searchsorted(inner, within, right=True).clamp_(max=block - 1)
    return (which * block + offset).squeeze(1).clamp_(max=vocab - 1)


def _top_k(weights: Tensor, top_k: Tensor) -> Tensor:
    """Zero all but the `top_k` (R,) largest of each row of `weights` (R, V) (ties with the k-th
    stay, as in transformers' `TopKLogitsWarper`)."""
    largest = weights.topk(int(top_k.max()), dim=-1).values  # (R, max k), descending
    kth = largest.gather(1, (top_k - 1)[:, None])  # (R, 1)
    return weights.masked_fill(weights < kth, 0.0)


def _top_p(probs: Tensor, top_p: Tensor) -> Tensor:
    """Zero all but the smallest set of most likely tokens whose mass reaches `top_p` (R,) of each
    row: (R, V)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p[:, None], 0.0)  # the top token always stays
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def stop_window(stop: list[str]) -> int:
    """Tokens enough to hold any of `stop` plus a token split at the window's edge (a token holds
    at least one byte)."""
    return max(len(s.encode("utf-8")) for s in stop) + 2


def hits_stop(tokenizer: PreTrainedTokenizerBase, tokens: list[int], stop: list[str]) -> bool:
    """Whether the text of `tokens` now contains one of `stop`, decoding only a recent window (and
    the whole text to confirm, since a window can mis-decode a multi-byte character at its edge)."""
    start = max(0, len(tokens) - stop_window(stop))
    text = tokenizer.decode(tokens[start:], skip_special_tokens=True)
    if not any(s in text for s in stop):
        return False
    if start == 0:
        return True
    full = tokenizer.decode(tokens, skip_special_tokens=True)
    return any(s in full for s in stop)


def cut_at_stop(text: str, stop: list[str]) -> str:
    """`text` up to (not including) the earliest stop string."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every id that ends a completion: the tokenizer's eos plus the generation config's (often a list)."""
    ids: list[int] = []
    candidates: list[object] = [tokenizer.eos_token_id]
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        candidates.append(generation_config.eos_token_id)
    for candidate in candidates:
        for value in candidate if isinstance(candidate, (list, tuple)) else [candidate]:
            if value is not None and int(value) not in ids:
                ids.append(int(value))
    return ids
