"""Continuous batching over the block pool: which sequences run in each engine step.

Each `step` runs every decoding sequence one token further and up to `prefill_chunk` prompt
tokens of waiting sequences, in one packed forward (rollout/paged.py). A request joins at whichever
step has room for its rows (`max_rows`) and blocks, and its sequences leave, freeing their blocks,
the step they finish. A group (one prompt, `n` samples) is prefilled as one sequence; when its
prompt is done the other samples fork from it, sharing its full blocks and copying the partial last
one, and each samples its first token from the same logits. At admission a sequence takes the
longest cached run of its full prompt blocks from the prefix cache (rollout/blocks.py) and
computes only the rest, at least its last token, whose logits it samples from.

Preemption by recompute: when a decoding sequence needs a block and none is free or evictable,
the most recently admitted sequence (prefilling ones first, by the same order) gives its blocks
back and goes to the front of the queue with its generated tokens appended to its prompt; it
keeps its tokens, logprobs and random generator, so once re-prefilled it samples on exactly as if
it had never stopped. A pool too small for even one sequence is a typed error, never an OOM.

Weight updates between steps (in flight): every sampled token records `version`, the weights it
was sampled under (`Sequence.versions`). Running sequences keep their KV by default;
`recompute_running` preempts them all the same way, so they are prefilled again under the new
weights (the engine's `inflight_kv="recompute"`).

Speculative decoding (`speculation`, rollout/speculative_batch.py): before each step every
decoding row may draft up to k tokens (blocks for them are taken only where free: drafts never
preempt); a drafting row feeds its last token and its drafts in the same packed forward, its
verdict keeps the accepted drafts plus one token, and its computed length advances past the kept
drafts only, so the next step overwrites the rest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tidal.errors import TidalError
from tidal.rollout.blocks import BlockPool
from tidal.rollout.drafting import DraftSession
from tidal.rollout.paged import Chunk, DecodeView, StepInput
from tidal.rollout.sampling import SamplingParams, derived_seed, hits_stop, sample_rows
from tidal.rollout.speculative_batch import BatchSpeculation, verify_rows
from tidal.types import FinishReason


class KVPoolTooSmall(TidalError, RuntimeError):
    """A single sequence needs more KV blocks than the whole pool holds (raised at a run's start by
    its plan, pipeline/planning.py, and by an engine that meets such a sequence)."""


@dataclass
class Request:
    """`n` completions of one prompt (token ids), sampled with `params`. A seeded request's sample
    k draws from a generator seeded with `derived_seed(params.seed, k)`, so it returns the same
    tokens whatever else shares the batch. `on_token(sample, token_id)` sees each kept token."""

    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    on_token: Callable[[int, int], None] | None = None


@dataclass
class Sequence:
    """One sample of a request: its tokens, its KV blocks and where it is in the schedule."""

    handle: RequestHandle
    sample: int
    tokens: list[int]  # prompt, then generated tokens (after a preemption, all are re-prefilled)
    generator: torch.Generator | None  # None: the engine's shared generator
    forks: list[int]  # samples of the same group to fork from this one when its prompt is done
    admitted: int = -1  # admission order (-1: waiting); the newest is preempted first
    computed: int = 0  # tokens whose keys and values are in the pool
    blocks: list[int] = field(default_factory=list)  # block table
    hashes: list[int] = field(default_factory=list)  # chained hashes of its full blocks, in order
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # (len(logprobs),) the weight version each token was sampled under
    kv_version: int | None = None  # the weights its KV was computed under since its admission
    row: int = -1  # its row in the decode view while decoding
    fresh: bool = True  # not admitted before (a preempted sequence's second prefill is a recompute)
    session: DraftSession | None = None  # its drafter session (speculative decoding), made when it first drafts
    drafts: list[int] = field(default_factory=list)  # this step's draft tokens, fed after its last token

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.handle.request.prompt):]


@dataclass
class RequestHandle:
    """A submitted request: its finished samples fill `results` (sample -> (tokens, logprobs, reason))
    and `versions` (sample -> the weight version of each of its tokens)."""

    request: Request
    version: int  # the weight version current at submission, which tags its completions
    results: dict[int, tuple[list[int], list[float], FinishReason]] = field(default_factory=dict)
    versions: dict[int, list[int]] = field(default_factory=dict)
    live: list[Sequence] = field(default_factory=list)
    aborted: bool = False

    @property
    def done(self) -> bool:
        return len(self.results) == self.request.n


class Scheduler:
    """Waiting, prefilling and decoding sequences over one `BlockPool` (module docstring)."""

    def __init__(self, pool: BlockPool, view: DecodeView | None, max_rows: int, prefill_chunk: int,
                 eos_ids: list[int], tokenizer: object, shared: torch.Generator,
                 speculation: BatchSpeculation | None = None) -> None:
        self.pool, self.view, self.max_rows, self.prefill_chunk = pool, view, max_rows, prefill_chunk
        self.speculation = speculation
        self.eos_ids, self.tokenizer, self.shared = set(eos_ids), tokenizer, shared
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []
        self.decoding: list[Sequence] = []  # in decode-view row order
        self.version = 0
        self._admissions = 0

    # ---------------------------------------------------------------- requests in and out

    def submit(self, request: Request, version: int, max_rows: int) -> RequestHandle:
        """Queue `request`'s samples, as groups of at most `max_rows` forked from one prefill each."""
        handle = RequestHandle(request, version)
        seed = request.params.seed
        for first in range(0, request.n, max_rows):
            samples = list(range(first, min(request.n, first + max_rows)))
            sequence = Sequence(handle, samples[0], list(request.prompt), self._generator(seed, samples[0]), samples[1:])
            handle.live.append(sequence)
            self.waiting.append(sequence)
        return handle

    def abort(self, handle: RequestHandle) -> None:
        """Drop every sequence of `handle`, freeing its blocks (a cancelled call, a gone client)."""
        handle.aborted = True
        for sequence in list(handle.live):
            self._evict(sequence)
        handle.live.clear()

    def suspend(self, handle: RequestHandle) -> None:
        """Take `handle`'s unfinished sequences out of the schedule, freeing their blocks but keeping
        their tokens, logprobs, versions and generators (a preempted call), until `requeue`."""
        for sequence in list(handle.live):
            self._evict(sequence)
            sequence.computed, sequence.admitted, sequence.drafts = 0, -1, []  # `fresh` stays: never admitted, never counted

    def requeue(self, handle: RequestHandle) -> None:
        """Queue a suspended `handle`'s sequences again, to be prefilled from their tokens."""
        self.waiting.extend(handle.live)

    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def rows(self) -> int:
        """Rows running now (decoding, and prefilling groups with their forks to come)."""
        return len(self.decoding) + sum(1 + len(s.forks) for s in self.prefilling)

    # ---------------------------------------------------------------- one step

    def step(self, forward: Callable[[StepInput], Tensor]) -> list[RequestHandle]:
        """Run one engine step; returns the handles that finished in it."""
        self._make_room_for_decoding()
        if self.speculation is not None:
            self._draft(self.speculation)
        chunks = self._plan_prefill()
        while not self.decoding and not chunks and len(self.prefilling) > 1:
            self._preempt(self._victim())  # prefills holding each other's blocks: let the oldest go on
            chunks = self._plan_prefill()
        if not self.decoding and not chunks:
            if self.waiting or self.prefilling:
                stuck = (self.prefilling or list(self.waiting))[0]
                needed = -(-len(stuck.tokens) // self.pool.block_size)
                raise KVPoolTooSmall(
                    f"a sequence of {len(stuck.tokens)} tokens needs {needed} KV blocks of "
                    f"{self.pool.block_size} positions but the pool has {self.pool.num_blocks}; raise rollout.kv_blocks"
                )
            return []
        step, finishing = self._step_input(chunks)
        logits = forward(step)  # (decoding + their drafts + finishing prefills, V)
        decoding = list(self.decoding)
        drafting = [s for s in decoding if s.drafts]
        verified = self._verify(decoding, logits) if drafting else []
        if drafting:  # the plain rows' logits, then the finishing prefills'
            logits = logits[torch.tensor(_plain_rows(decoding, logits.shape[0]), dtype=torch.long, device=logits.device)]
            decoding = [s for s in decoding if not s.drafts]
        for sequence in (*decoding, *drafting):
            self._computed(sequence, sequence.computed + 1)
        for sequence, tokens in chunks:
            self._computed(sequence, sequence.computed + tokens)
        for sequence in finishing:  # off the lists first: a fork's preemption must not pick them
            self.prefilling.remove(sequence)
        rows = list(decoding)
        sources = list(range(len(decoding)))
        for index, sequence in enumerate(finishing):
            children = self._fork(sequence)
            self._start_decoding(sequence, None)
            for child in children:
                self._start_decoding(child, sequence.row)
            rows += [sequence, *children]
            sources += [len(decoding) + index] * (1 + len(children))
        if sources != list(range(logits.shape[0])):
            logits = logits[torch.tensor(sources, device=logits.device)]
        return self._sample(rows, logits, list(zip(drafting, verified)))

    def _make_room_for_decoding(self) -> None:
        """A block for every decoding sequence whose next token starts one; preempt when none is left."""
        for sequence in list(self.decoding):
            if sequence.row < 0:  # preempted by an earlier sequence of this loop
                continue
            while sequence.computed // self.pool.block_size >= len(sequence.blocks):
                block = self.pool.allocate()
                if block is not None:
                    sequence.blocks.append(block)
                    break
                victim = self._victim()
                self._preempt(victim)
                if victim is sequence:
                    break

    def _draft(self, speculation: BatchSpeculation) -> None:
        """Up to k draft tokens for each decoding row, as far as its length cap and free blocks allow
        (drafts never preempt: a row without room simply decodes one token)."""
        size, k = self.pool.block_size, speculation.options.k
        for sequence in self.decoding:
            params = sequence.handle.request.params
            room = min(k, params.max_new_tokens - len(sequence.logprobs) - 1)  # a round emits drafts + 1
            sequence.drafts = []
            if room <= 0:
                continue
            if sequence.session is None:
                sequence.session = speculation.drafter.session(list(sequence.tokens))
            proposal = sequence.session.propose(room)[:room]
            while proposal and sequence.computed + len(proposal) >= len(sequence.blocks) * size:
                block = self.pool.allocate()
                if block is None:
                    proposal = proposal[: len(sequence.blocks) * size - sequence.computed - 1]
                    break
                sequence.blocks.append(block)
            sequence.drafts = list(proposal)

    def _verify(self, decoding: list[Sequence], logits: Tensor) -> list[tuple[list[int], list[float], int]]:
        """The drafting rows' verdicts (emitted tokens, their logprobs, drafts kept), from their
        chunks' logits in the pack's order (rollout/speculative_batch.py)."""
        assert self.speculation is not None
        drafting, slices, start = [], [], 0
        for sequence in decoding:
            count = 1 + len(sequence.drafts)
            if sequence.drafts:
                drafting.append(sequence)
                slices.append(logits[start : start + count])
            start += count
        width = max(piece.shape[0] for piece in slices)
        padded = logits.new_zeros((len(slices), width, logits.shape[1]))
        for index, piece in enumerate(slices):
            padded[index, : piece.shape[0]] = piece
        params = [s.handle.request.params for s in drafting]
        verdicts = verify_rows(padded, [s.drafts for s in drafting], params, [s.generator for s in drafting],
                               self.shared)
        stats = self.speculation.stats
        for sequence, accepted in zip(drafting, verdicts.accepted):
            stats.drafted += len(sequence.drafts)
            stats.accepted += accepted
            stats.emitted += accepted + 1
            stats.rounds += 1
        return list(zip(verdicts.tokens, verdicts.logprobs, verdicts.accepted))

    def _plan_prefill(self) -> list[tuple[Sequence, int]]:
        """(sequence, tokens) prefill chunks for this step, within `prefill_chunk` tokens in all:
        the sequences already prefilling first, then new ones while rows and blocks allow."""
        budget, chunks = self.prefill_chunk, []
        for sequence in list(self.prefilling):
            if budget == 0:
                break
            tokens = self._reserve(sequence, min(budget, len(sequence.tokens) - sequence.computed))
            if tokens:
                chunks.append((sequence, tokens))
                budget -= tokens
        while budget and self.waiting:
            head = self.waiting[0]
            if self.rows() + 1 + len(head.forks) > self.max_rows and self.rows():
                break
            if self.pool.available() == 0:
                break
            self.waiting.popleft()
            self._admit(head)
            tokens = self._reserve(head, min(budget, len(head.tokens) - head.computed))
            if tokens:
                chunks.append((head, tokens))
                budget -= tokens
        return chunks

    def _admit(self, sequence: Sequence) -> None:
        """Move `sequence` from waiting to prefilling, taking its cached prefix blocks."""
        stats, prompt = self.pool.stats, len(sequence.handle.request.prompt)
        fresh, sequence.fresh = sequence.fresh, False
        sequence.kv_version = self.version  # all its KV, cached or computed, is of the weights now
        blocks, hashes = self.pool.lookup(sequence.tokens, self._root(sequence), len(sequence.tokens) - 1)
        sequence.blocks, sequence.hashes = blocks, hashes
        sequence.computed = len(blocks) * self.pool.block_size
        sequence.admitted = self._admissions
        self._admissions += 1
        if fresh:
            stats.prompt_tokens += prompt * (1 + len(sequence.forks))
            stats.cached_tokens += sequence.computed
            stats.forked_tokens += prompt * len(sequence.forks)
        else:
            stats.recomputed_tokens += len(sequence.tokens) - sequence.computed
        self.prefilling.append(sequence)

    def _reserve(self, sequence: Sequence, tokens: int) -> int:
        """Blocks for up to `tokens` more tokens of `sequence`; how many it got room for."""
        size = self.pool.block_size
        end = sequence.computed + tokens
        while len(sequence.blocks) * size < end:
            block = self.pool.allocate()
            if block is None:
                break
            sequence.blocks.append(block)
        return max(0, min(end, len(sequence.blocks) * size) - sequence.computed)

    def _step_input(self, chunks: list[tuple[Sequence, int]]) -> tuple[StepInput, list[Sequence]]:
        """The packed forward's input, and the prefilling sequences this step completes."""
        size = self.pool.block_size
        tokens, positions, slots, lengths = [], [], [], []
        for sequence in self.decoding:
            position = sequence.computed
            fed = [sequence.tokens[position], *sequence.drafts]
            tokens += fed
            positions += range(position, position + len(fed))
            slots += [sequence.blocks[p // size] * size + p % size for p in range(position, position + len(fed))]
            lengths.append(position + len(fed))
        decode = len(self.decoding)
        speculative = any(s.drafts for s in self.decoding)
        logit_rows = list(range(len(tokens)))
        pieces, finishing = [], []
        device = self.pool.keys[0].device
        for sequence, count in chunks:
            start, past = len(tokens), sequence.computed
            table = _slots(sequence.blocks, size, past + count)
            tokens += sequence.tokens[past : past + count]
            positions += range(past, past + count)
            slots += table[past:]
            pieces.append(Chunk(start, count, past, torch.tensor(table, device=device)))
            if past + count == len(sequence.tokens):
                finishing.append(sequence)
                logit_rows.append(len(tokens) - 1)
        key_slots = None
        if self.view is None and decode:
            longest = max(lengths)
            key_slots = torch.tensor([_slots(s.blocks, size, longest) for s in self.decoding], device=device)
        elif self.view is not None:
            running = (*self.decoding, *finishing)
            # Bounds of the view's growth: the rows all submitted work can run at once, and the
            # longest a running sequence can get (prompt + max_new_tokens + the token fed after).
            queued = sum(1 + len(s.forks) for s in self.waiting)
            longest = max([len(s.handle.request.prompt) + s.handle.request.params.max_new_tokens + 1 for s in running],
                          default=1)
            self.view.reserve(len(self.decoding) + sum(1 + len(s.forks) for s in finishing),
                              max([len(s.tokens) + 1 + len(s.drafts) for s in running], default=1),
                              max_rows=min(self.max_rows, self.rows() + queued), max_capacity=longest)
        step = StepInput(
            tokens=torch.tensor(tokens, device=device), positions=torch.tensor(positions, device=device),
            slots=torch.tensor(slots, device=device), decode_rows=decode, decode_lengths=lengths,
            decode_key_slots=key_slots, chunks=pieces, logit_rows=torch.tensor(logit_rows, dtype=torch.long, device=device),
            decode_counts=[1 + len(s.drafts) for s in self.decoding] if speculative else None,
        )
        return step, finishing

    def _computed(self, sequence: Sequence, computed: int) -> None:
        """`sequence` now has `computed` tokens in the pool: register the blocks that filled up."""
        size = self.pool.block_size
        sequence.computed = computed
        if sequence.kv_version != self.version:
            return  # KV partly of weights replaced since (kept across an update): never offered to a lookup
        while len(sequence.hashes) < computed // size:
            index = len(sequence.hashes)
            previous = sequence.hashes[-1] if sequence.hashes else self._root(sequence)
            chained = self.pool.chain(previous, sequence.tokens[index * size : (index + 1) * size])
            self.pool.register(sequence.blocks[index], chained)
            sequence.hashes.append(chained)

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """The other samples of `parent`'s group, sharing its full blocks, each with its own copy
        of the partial last one. A sample with no block left for that copy (after preempting
        sequences of other requests) is queued first instead, to prefill from the cached prefix."""
        size, handle = self.pool.block_size, parent.handle
        full, partial = divmod(parent.computed, size)
        children = []
        for sample in parent.forks:
            child = Sequence(handle, sample, list(parent.tokens), self._generator(handle.request.params.seed, sample),
                             [], admitted=parent.admitted, fresh=False, kv_version=parent.kv_version)
            handle.live.append(child)
            block = None
            if partial:
                block = self.pool.allocate()
                while block is None and (victim := self._victim(exclude=handle)) is not None:
                    self._preempt(victim)
                    block = self.pool.allocate()
                if block is None:
                    child.admitted = -1
                    self.waiting.appendleft(child)
                    continue
                self.pool.copy_block(parent.blocks[full], block, partial)
            for shared in parent.blocks[:full]:
                self.pool.hold(shared)
            child.blocks = parent.blocks[:full] + ([] if block is None else [block])
            child.computed, child.hashes = parent.computed, list(parent.hashes)
            children.append(child)
        parent.forks = []
        return children

    def _start_decoding(self, sequence: Sequence, source: int | None) -> None:
        """`sequence` joins the decode batch; its view row is loaded from the pool, or copied from
        decode row `source` (a fork's keys are its group's first sample's)."""
        sequence.row = len(self.decoding)
        self.decoding.append(sequence)
        if self.view is None:
            return
        if source is None:
            table = _slots(sequence.blocks, self.pool.block_size, sequence.computed)
            self.view.load(self.pool, sequence.row, torch.tensor(table, device=self.pool.keys[0].device))
        else:
            self.view.move(source, sequence.row, sequence.computed)

    # ---------------------------------------------------------------- sampling and finishing

    def _sample(self, rows: list[Sequence], logits: Tensor,
                verified: list[tuple[Sequence, tuple[list[int], list[float], int]]]) -> list[RequestHandle]:
        """Sample `rows` from `logits`, add the `verified` drafting rows' tokens, finish who is done."""
        finished: list[tuple[Sequence, FinishReason]] = []
        if rows:
            params = [s.handle.request.params for s in rows]
            tokens, logprobs = sample_rows(logits, params, [s.generator for s in rows], self.shared)
            for sequence, token, logprob in zip(rows, tokens.tolist(), logprobs.tolist()):
                kept, reason = self._append(sequence, [token], [logprob])
                if reason is not None:
                    finished.append((sequence, reason))
        for sequence, (emitted, emitted_logprobs, accepted) in verified:
            kept, reason = self._append(sequence, emitted, emitted_logprobs)
            sequence.drafts = []
            if sequence.row >= 0 and reason is None:  # the kept drafts' keys and values are in the pool
                self._computed(sequence, sequence.computed + min(accepted, kept))
            if reason is not None:
                finished.append((sequence, reason))
        done = []
        for sequence, reason in sorted(finished, key=lambda pair: -pair[0].row):
            handle = sequence.handle
            handle.results[sequence.sample] = (sequence.generated, sequence.logprobs, reason)
            handle.versions[sequence.sample] = sequence.versions
            handle.live.remove(sequence)
            if self.speculation is not None:
                self.speculation.drafter.finish(list(handle.request.prompt), sequence.generated)
            self._evict(sequence)
            if handle.done:
                done.append(handle)
        return done

    def _append(self, sequence: Sequence, tokens: list[int], logprobs: list[float]) -> tuple[int, FinishReason | None]:
        """Append `tokens` in order until one finishes the sequence; (how many were kept, why it finished)."""
        param = sequence.handle.request.params
        callback = sequence.handle.request.on_token
        for count, (token, logprob) in enumerate(zip(tokens, logprobs), start=1):
            sequence.tokens.append(token)
            sequence.logprobs.append(logprob)
            sequence.versions.append(self.version)
            if sequence.session is not None:
                sequence.session.extend([token])
            if callback is not None:
                callback(sequence.sample, token)
            if (token in self.eos_ids and not param.ignore_eos) or (
                param.stop and hits_stop(self.tokenizer, sequence.generated, param.stop)  # type: ignore[arg-type]
            ):
                return count, "stop"
            if len(sequence.logprobs) >= param.max_new_tokens:
                return count, "length"
        return len(tokens), None

    # ---------------------------------------------------------------- preemption

    def _victim(self, exclude: RequestHandle | None = None) -> Sequence | None:
        """The most recently admitted running sequence (not of `exclude`)."""
        candidates = [s for s in (*self.prefilling, *self.decoding) if s.handle is not exclude]
        return max(candidates, key=lambda s: s.admitted, default=None)

    def _preempt(self, sequence: Sequence | None, counted: bool = True) -> None:
        """Free `sequence`'s blocks and requeue it first, to be re-prefilled with what it generated
        (`counted`: a preemption for room, in `stats.preemptions`)."""
        if sequence is None:
            raise KVPoolTooSmall(f"no sequence fits the pool's {self.pool.num_blocks} KV blocks; raise rollout.kv_blocks")
        self._evict(sequence)
        sequence.computed, sequence.admitted = 0, -1
        self.pool.stats.preemptions += counted
        self.waiting.appendleft(sequence)

    def recompute_running(self) -> None:
        """Preempt every running sequence (new weights, `inflight_kv="recompute"`): each is
        prefilled again from its tokens, under the weights it then samples with, oldest first."""
        for sequence in sorted((*self.prefilling, *self.decoding), key=lambda s: -s.admitted):
            self._preempt(sequence, counted=False)

    def _evict(self, sequence: Sequence) -> None:
        """Take `sequence` off the running lists and let go of its blocks."""
        if sequence in self.prefilling:
            self.prefilling.remove(sequence)
        elif sequence.row >= 0:
            row, last = sequence.row, self.decoding.pop()
            if last is not sequence:  # the last row fills the gap
                self.decoding[row] = last
                last.row = row
                if self.view is not None:
                    # with its pending drafts' positions: a drafting row's kept drafts are committed later
                    self.view.move(len(self.decoding), row, last.computed + len(last.drafts))
            sequence.row = -1
        elif sequence in self.waiting:
            self.waiting.remove(sequence)
        self.pool.release(sequence.blocks)
        sequence.blocks, sequence.hashes = [], []

    def _root(self, sequence: Sequence) -> int:
        return hash(("tidal-kv", sequence.kv_version))

    def _generator(self, seed: int | None, sample: int) -> torch.Generator | None:
        if seed is None:
            return None
        generator = torch.Generator(device=self.shared.device)
        generator.manual_seed(derived_seed(seed, sample))
        return generator


def _plain_rows(decoding: list[Sequence], total: int) -> list[int]:
    """Logit rows of the decode rows without drafts, then every row after the decode tokens."""
    out, start = [], 0
    for sequence in decoding:
        if not sequence.drafts:
            out.append(start)
        start += 1 + len(sequence.drafts)
    return out + list(range(start, total))


def _slots(blocks: list[int], size: int, length: int) -> list[int]:
    """Pool slots of positions [0, length) of a sequence with block table `blocks`; past its end
    (padding, masked out) its first slot again, which holds real values: a masked position still
    enters sdpa's product as 0 * value, and an unwritten slot can hold NaN."""
    out = [block * size + offset for block in blocks for offset in range(size)][:length]
    return out + out[:1] * (length - len(out))
