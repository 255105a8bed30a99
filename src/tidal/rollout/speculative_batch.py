"""Speculative decoding inside the paged continuous batch (`rollout.speculative`).

At each engine step every decoding row may carry up to `k` draft tokens from its own drafter
session (prompt lookup / n-gram, or the suffix index: no second model). The scheduler feeds each
row's chunk `[last, d_1..d_k]` through the same packed forward as everything else (the rows'
chunks write into their own KV pages, and attend causally over their own keys), gets the logits
of every chunk position back, and calls `verify_rows` once for the whole batch. A row keeps the
leading drafts the rule accepts plus one token (the resampled one at the first rejection, or the
bonus token after a full accept); the KV past what it kept is simply overwritten later, since a
row's next step writes from its first unkept position on.

The rule is speculative sampling's with a point-mass drafter (rollout/speculative.py has the
argument): draft x at a position whose target distribution is p is kept with probability p(x); at
the first rejection a token is drawn from p with x removed and renormalised; so every emitted
token has exactly the target's sampling distribution (temperature, then top-p) given what came
before, and carries the target's logprob (`log_softmax(logits / T)` before top-p, T = 1 when
greedy: the engine's convention, the behaviour-policy logprob the trainer uses). Each row draws its
uniforms from its own generator when seeded (k_row + 1 per round: one per draft, one for the last
token), so a seeded row's completion depends on its own history only, never on the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tidal.rollout.drafting import NGramDrafter, SuffixDrafter
from tidal.rollout.sampling import _inverse_cdf, _top_p
from tidal.rollout.speculative import Drafter, SpeculativeStats

METHODS = ("ngram", "suffix")


@dataclass(frozen=True)
class Speculation:
    """How rows draft: `method` ngram (prompt lookup of the longest earlier n-gram, n = max_n..min_n)
    or suffix (the longest earlier repeat of any length, `min_match` tokens at least, in the row and
    in a corpus of the engine's earlier completions when `learn`: a group's later samples and
    later steps draft from what it generated before); up to `k` drafts per row and step."""

    method: str = "ngram"
    k: int = 4
    max_n: int = 4
    min_n: int = 2
    min_match: int = 2
    learn: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.method not in METHODS:
            problems.append(f"method={self.method!r} must be one of {', '.join(METHODS)}")
        if not 1 <= self.k <= 64:
            problems.append(f"k={self.k} must be in [1, 64]")
        if not 1 <= self.min_n <= self.max_n:
            problems.append(f"need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")
        if self.min_match < 1:
            problems.append(f"min_match={self.min_match} must be >= 1")
        if problems:
            raise ValueError("speculative decoding: " + "; ".join(problems))

    def drafter(self) -> Drafter:
        """A fresh drafter (each engine its own: the suffix drafter's corpus is per engine)."""
        if self.method == "ngram":
            return NGramDrafter(self.max_n, self.min_n)
        return SuffixDrafter(self.min_match, learn=self.learn)


@dataclass
class BatchSpeculation:
    """An engine's drafting state: its drafter and the counts of every round so far."""

    options: Speculation
    drafter: Drafter = field(init=False)
    stats: SpeculativeStats = field(default_factory=SpeculativeStats)

    def __post_init__(self) -> None:
        self.drafter = self.options.drafter()


@dataclass
class RowVerdicts:
    """`verify_rows`' answer: row b emits `tokens[b][: accepted[b] + 1]` with those `logprobs`."""

    accepted: list[int]
    tokens: list[list[int]]
    logprobs: list[list[float]]


def verify_rows(
    logits: Tensor, drafts: Sequence[Sequence[int]], temperature: Sequence[float], top_p: Sequence[float],
    generators: Sequence[torch.Generator | None], shared: torch.Generator,
) -> RowVerdicts:
    """The acceptance rule for B rows, each with its own drafts, sampling parameters and generator.

    `logits` (B, K + 1, V) float32: row b's position i holds the target's logits for the token
    after its draft i (position 0: after the row's last token); positions past `len(drafts[b])`
    are padding. Rows with no generator draw together from `shared`."""
    rows, positions, vocab = logits.shape
    device = logits.device
    lengths = torch.tensor([len(d) for d in drafts], device=device)
    padded = torch.zeros((rows, max(positions - 1, 1)), dtype=torch.long, device=device)
    for b, draft in enumerate(drafts):
        if draft:
            padded[b, : len(draft)] = torch.tensor(draft, device=device)
    greedy = torch.tensor([t == 0 for t in temperature], device=device)
    scale = torch.tensor([1.0 if t == 0 else t for t in temperature], device=device)
    log_probs = torch.log_softmax(logits / scale[:, None, None], dim=-1)  # (B, K + 1, V): the reported ones
    probs = log_probs.exp()
    masses = torch.tensor(top_p, device=device)
    if bool((masses < 1.0).any()):
        flat = probs.reshape(rows * positions, vocab)
        flat = _top_p(flat, masses.repeat_interleave(positions))
        probs = (flat / flat.sum(dim=-1, keepdim=True)).view(rows, positions, vocab)
    if bool(greedy.any()):  # a point mass at the argmax for the greedy rows
        chosen = greedy.nonzero().squeeze(1)
        probs[chosen] = torch.nn.functional.one_hot(logits[chosen].argmax(dim=-1), vocab).to(probs.dtype)

    uniforms = _row_uniforms(generators, shared, [len(d) for d in drafts], positions, device)  # (B, K + 1)
    drafted = positions - 1
    if drafted > 0:
        p_draft = probs[:, :drafted].gather(-1, padded[:, :drafted, None]).squeeze(-1)  # (B, K)
        valid = torch.arange(drafted, device=device)[None, :] < lengths[:, None]
        kept = (uniforms[:, :drafted] < p_draft) & valid
        accepted = kept.long().cumprod(dim=-1).sum(dim=-1)  # (B,) the leading run of kept drafts
    else:
        accepted = torch.zeros(rows, dtype=torch.long, device=device)
    index = torch.arange(rows, device=device)
    final = probs[index, accepted].clone()  # (B, V): p where the kept drafts end
    rejected = accepted < lengths
    if bool(rejected.any()):
        rejected_token = padded[index, accepted.clamp(max=padded.shape[1] - 1)]
        final = torch.where(rejected[:, None], residual(final, rejected_token), final)
    last_uniform = uniforms[index, lengths]  # each row's own last uniform
    last = _inverse_cdf(final, last_uniform)
    last = torch.where(greedy, final.argmax(dim=-1), last)
    emitted = torch.cat([padded, torch.zeros((rows, 1), dtype=torch.long, device=device)], dim=1)[:, :positions]
    emitted[index, accepted] = last
    reported = log_probs.gather(-1, emitted[..., None]).squeeze(-1)  # (B, K + 1)
    counts = (accepted + 1).tolist()
    tokens, values = emitted.tolist(), reported.tolist()
    return RowVerdicts(accepted.tolist(), [t[:c] for t, c in zip(tokens, counts)],
                       [v[:c] for v, c in zip(values, counts)])


def residual(p: Tensor, rejected: Tensor) -> Tensor:
    """After rejecting the point-mass draft x of each row: max(0, p - delta_x) = p with x removed
    (unnormalised; the inverse-CDF draw normalises), (B, V). Where that is all zero (p(x) was 1, so
    a rejection had probability 0 and only rounding made one) it is p."""
    removed = p.clone()
    removed[torch.arange(p.shape[0], device=p.device), rejected] = 0.0
    return torch.where(removed.sum(dim=-1, keepdim=True) > 0, removed, p)


def _row_uniforms(generators: Sequence[torch.Generator | None], shared: torch.Generator, lengths: list[int],
                  positions: int, device: torch.device) -> Tensor:
    """(B, K + 1) uniforms: row b's first `lengths[b] + 1` from its own generator (a fixed count per
    round given its drafts, so a seeded row's stream depends on its own history only), or, for the
    rows without one, from `shared` together; the rest padding."""
    out = torch.zeros((len(generators), positions), device=device)
    unseeded = [b for b, g in enumerate(generators) if g is None]
    if unseeded:
        out[unseeded] = torch.rand((len(unseeded), positions), generator=shared, device=device)
    for b, generator in enumerate(generators):
        if generator is not None:
            out[b, : lengths[b] + 1] = torch.rand(lengths[b] + 1, generator=generator, device=device)
    return out
