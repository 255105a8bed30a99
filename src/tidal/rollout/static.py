"""`StaticEngine`: the static batcher the paged engine replaced, kept as the bench's baseline and for
models the paged forward does not cover (any `transformers` causal LM, through its own forward).

One `generate` call prefills each distinct prompt once, copies its KV cache to the prompt's `n`
samples, then decodes all rows of the batch together, one token per step, dropping finished rows
as it goes. Every row shares one `SamplingParams` and one random generator, so a seeded result
depends on the whole call (its prompts, n and `max_batch_rows`). Logprobs follow rollout/sampling.py.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from tidal.errors import PreemptedError
from tidal.rollout.engine import ACCELERATOR_BATCH_ROWS, CPU_BATCH_ROWS
from tidal.rollout.kv import FlatCache, supports_flat_cache
from tidal.rollout.lean import LeanCache, LeanDecoder
from tidal.rollout.sampling import (
    Cancel,
    SamplingParams,
    TokenCallback,
    cut_at_stop,
    eos_ids,
    sample,
)
from tidal.types import Completion, FinishReason

SYNC_EVERY = 8  # on an accelerator, decode steps between looks at which rows are done

@dataclass
class _Unit:
    """Samples [first, first + count) of one prompt, generated in one batch from one prefill."""

    prompt: int
    first: int
    count: int


@dataclass
class _Decoding:
    """One batch being decoded. R = output rows (a unit's samples, in unit order); b = the rows
    still in the batch (and its cache), each a live output row until the batch is compacted."""

    cache: DynamicCache | LeanCache
    logits: Tensor  # (b, V) float32, of the token each batch row samples next
    attention: Tensor  # (b, width + max_new) long, 1 on real (not left-padding) columns
    next_position: Tensor  # (b,) long, the position of each batch row's next token
    width: int  # prompt columns: every prompt ends at column width - 1
    padded: bool  # whether some batch row has left padding (else no attention mask is needed)
    tokens: Tensor  # (R, max_new) long, sampled tokens
    logprobs: Tensor  # (R, max_new) float32, their logprobs
    kept: Tensor  # (R,) long, tokens kept: max_new unless the row stopped
    stopped: Tensor  # (R,) bool, whether the row stopped (eos or a stop string)
    live: Tensor  # (b,) long, the output row of each batch row
    alive: Tensor  # (b,) bool, batch rows still sampling

    def compact(self, token: Tensor) -> Tensor:
        """Drop the finished rows from the batch and its cache; returns `token` (b,) of the rows kept."""
        keep = self.alive.nonzero().flatten()
        self.cache.batch_select_indices(keep)
        token, self.live, self.attention, self.next_position = (
            token[keep], self.live[keep], self.attention[keep], self.next_position[keep]
        )
        self.alive = self.alive[keep]
        self.padded = self.padded and not bool(self.attention[:, : self.width].all())
        return token


def _mark_finished(state: _Decoding, token: Tensor, step: int, eos: Tensor | None, stops: _StopChecker | None) -> None:
    """Record the rows that `token` (b,) ends at `step`: an eos id (when `eos` is given) or a
    completed stop string."""
    alive = state.alive
    finished = torch.isin(token, eos) & alive if eos is not None else torch.zeros_like(alive)
    if stops is not None:
        hits = stops.check(state.tokens, state.live, alive & ~finished, step)
        if hits:
            finished[torch.tensor(hits, device=finished.device)] = True
    state.kept[state.live] = torch.where(finished, step + 1, state.kept[state.live])
    state.stopped[state.live] |= finished
    state.alive &= ~finished


class StaticEngine:
    """Samples completions from a Hugging Face causal LM in this process (CPU or GPU).

    `model` may be the very object the trainer updates (then call `update_weights(None, version)`
    after each step) or a separate copy (pass the new weights to `update_weights`). It must already
    be on `device`. Batches larger than `max_batch_rows` rows (prompts x samples) are generated in
    several passes; by default 256 rows on a CPU (larger batches gain nothing there and use more
    memory) and 4096 on an accelerator, where a decode step of 256 rows costs about what one of
    4096 does (measured in bench/RESULTS.md, "Rollout on a GPU"). `kv_cache`: "auto" runs
    Llama-family decoders through the lean forward (`rollout/lean.py`: the same arithmetic without
    the module machinery, its own in-place cache), other models through their `transformers`
    forward with the cache written in place (`FlatCache`) where the model's cache is plain full
    attention, else `transformers`' `DynamicCache`; "flat" skips the lean forward; "dynamic"
    forces the `transformers` forward with `DynamicCache`.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        device: torch.device | str | None = None,
        max_batch_rows: int | None = None,
        kv_cache: Literal["auto", "flat", "dynamic"] = "auto",
    ) -> None:
        if max_batch_rows is not None and max_batch_rows < 1:
            raise ValueError(f"max_batch_rows={max_batch_rows} must be >= 1")
        if kv_cache not in ("auto", "flat", "dynamic"):
            raise ValueError(f"kv_cache={kv_cache!r} must be 'auto', 'flat' or 'dynamic'")
        self.model = model
        self.tokenizer = tokenizer
        model_device = next(model.parameters()).device
        wanted = torch.device(device) if device is not None else model_device
        # Compare types and indices loosely: "cuda" and "cuda:0" name the same device here.
        if wanted.type != model_device.type or (wanted.index is not None and wanted.index != model_device.index):
            raise ValueError(
                f"the model is on {model_device} but the engine was asked for {wanted}; move the model "
                "first (model.to(device)): a model shared with the trainer must not move behind its back"
            )
        self.device = model_device
        if max_batch_rows is None:
            max_batch_rows = CPU_BATCH_ROWS if model_device.type == "cpu" else ACCELERATOR_BATCH_ROWS
        self.max_batch_rows = max_batch_rows
        self.weight_version = 0
        self.eos_ids = eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)
        parameters = inspect.signature(model.forward).parameters
        # transformers renamed `past_key_values` to `cache` in 5.x; accept either.
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"
        self._keeps_last_logits = "logits_to_keep" in parameters
        self._flat_cache = kv_cache in ("auto", "flat") and supports_flat_cache(model)
        self._lean = LeanDecoder(model) if kv_cache == "auto" and LeanDecoder.supports(model) else None

    # ---------------------------------------------------------------- public API

    def update_weights(self, state_dict: dict[str, Tensor] | None, version: int) -> None:
        """Copy `state_dict` (all or some of the model's tensors) into the model, then set `version`.

        `None` means the model object is shared with the trainer and already holds the new
        weights: only the version changes.
        """
        if state_dict is not None:
            own = self.model.state_dict()
            unknown = sorted(set(state_dict) - set(own))
            if unknown:
                raise ValueError(
                    f"update_weights: {len(unknown)} name(s) the model does not have, e.g. {unknown[:3]}; "
                    "send the state_dict of the same architecture"
                )
            with torch.no_grad():
                for name, tensor in state_dict.items():
                    target = own[name]
                    if target.shape != tensor.shape:
                        raise ValueError(
                            f"update_weights: {name} has shape {tuple(tensor.shape)}, the model's is {tuple(target.shape)}"
                        )
                    target.copy_(tensor)
        self.weight_version = version

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        n: int = 1,
        params: SamplingParams | None = None,
        on_token: TokenCallback | None = None,
        cancel: Cancel | None = None,
    ) -> list[list[Completion]]:
        """`n` completions for each prompt (token ids, e.g. from `render_prompt`).

        Returns one list per prompt, in order, each holding its `n` completions, all tagged with the
        weight version current when the call started. With `params.seed` set, the same prompts, n,
        params, weights, `max_batch_rows` and device give the same completions. `on_token`, when
        given, sees every kept token as it is sampled (it does not change what is sampled).
        `cancel`, when given, is looked at before each decode step: once it is set, the call
        stops there and raises `PreemptedError`, keeping nothing (the scheduler's preemption).
        """
        params = params or SamplingParams()
        if self._lean is not None and not self._lean.current():
            self._lean = None  # its layers were replaced since (a LoRA adapter injected): the model's own forward
        if n < 1:
            raise ValueError(f"n={n} must be >= 1")
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {index} is empty; a prompt needs at least one token")
        generator = torch.Generator(device=self.device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)

        version = self.weight_version
        results: list[list[Completion | None]] = [[None] * n for _ in prompts]
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling; the trainer's mode is restored below
        try:
            for batch in self._plan(prompts, n):
                completed = self._generate_batch(batch, prompts, params, generator, version, on_token, cancel)
                for unit, completions in zip(batch, completed):
                    results[unit.prompt][unit.first : unit.first + unit.count] = completions
        finally:
            self.model.train(was_training)
        return [[c for c in row if c is not None] for row in results]

    # ---------------------------------------------------------------- batching

    def _plan(self, prompts: list[list[int]], n: int) -> list[list[_Unit]]:
        """Split the work into batches of at most `max_batch_rows` rows, similar lengths together."""
        units = [
            _Unit(prompt=index, first=first, count=min(self.max_batch_rows, n - first))
            for index in range(len(prompts))
            for first in range(0, n, self.max_batch_rows)
        ]
        # Similar lengths share a batch, so little of it is left padding.
        units.sort(key=lambda unit: len(prompts[unit.prompt]))
        batches: list[list[_Unit]] = []
        rows = 0
        for unit in units:
            if not batches or rows + unit.count > self.max_batch_rows:
                batches.append([])
                rows = 0
            batches[-1].append(unit)
            rows += unit.count
        return batches

    def _forward(
        self, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor, cache: DynamicCache | LeanCache
    ) -> Tensor:
        """Logits of the last position of each row, in float32: (B, V)."""
        if self._lean is not None:
            return self._lean.last_logits(input_ids, attention_mask, position_ids, cache)  # type: ignore[arg-type]
        kwargs: dict[str, object] = {self._cache_arg: cache}
        if self._keeps_last_logits:
            kwargs["logits_to_keep"] = 1
        output = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True, **kwargs
        )
        return output.logits[:, -1, :].float()

    def _new_cache(self, capacity: int) -> DynamicCache | LeanCache:
        if self._lean is not None:
            return self._lean.new_cache(capacity)
        if self._flat_cache:
            return FlatCache(self.model.config, capacity)
        return DynamicCache(config=self.model.config)

    def _generate_batch(
        self,
        units: list[_Unit],
        prompts: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator,
        version: int,
        on_token: TokenCallback | None = None,
        cancel: Cancel | None = None,
    ) -> list[list[Completion]]:
        """The completions of one batch of units: one prefill of their prompts, then decoding."""
        state = self._prefill(units, prompts, params.max_new_tokens)
        self._decode(state, units, params, generator, on_token, cancel)
        generated = state.kept.tolist()
        reasons: list[FinishReason] = ["stop" if s else "length" for s in state.stopped.tolist()]
        return self._completions(units, prompts, state.tokens, state.logprobs, generated, reasons, params, version)

    def _prefill(self, units: list[_Unit], prompts: list[list[int]], max_new: int) -> _Decoding:
        """Run the units' prompts once, left-padded, and copy each one's cache row to its samples."""
        device = self.device
        lengths = [len(prompts[unit.prompt]) for unit in units]
        width = max(lengths)
        # Left padding: every prompt ends at column `width - 1`, so one decode step serves all rows.
        input_ids = torch.full((len(units), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(units), width + max_new), dtype=torch.long)
        for row, (unit, length) in enumerate(zip(units, lengths)):
            input_ids[row, width - length :] = torch.tensor(prompts[unit.prompt], dtype=torch.long)
            attention[row, width - length :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        padded = min(lengths) < width
        positions = (attention[:, :width].cumsum(-1) - 1).clamp(min=0)

        cache = self._new_cache(width + max_new)
        logits = self._forward(input_ids, attention[:, :width] if padded else None, positions, cache)

        # Prefix reuse: each prompt's cache row is copied to its samples, not recomputed.
        counts = torch.tensor([unit.count for unit in units], device=device)
        source = torch.repeat_interleave(torch.arange(len(units), device=device), counts)
        if len(source) != len(units):
            cache.batch_select_indices(source)
            logits, attention = logits[source], attention[source]
        rows = len(source)
        return _Decoding(
            cache=cache,
            logits=logits,
            attention=attention,
            next_position=torch.tensor(lengths, device=device)[source],
            width=width,
            padded=padded,
            tokens=torch.zeros((rows, max_new), dtype=torch.long, device=device),
            logprobs=torch.zeros((rows, max_new), dtype=torch.float32, device=device),
            kept=torch.full((rows,), max_new, dtype=torch.long, device=device),
            stopped=torch.zeros(rows, dtype=torch.bool, device=device),
            live=torch.arange(rows, device=device),
            alive=torch.ones(rows, dtype=torch.bool, device=device),
        )

    def _decode(
        self,
        state: _Decoding,
        units: list[_Unit],
        params: SamplingParams,
        generator: torch.Generator,
        on_token: TokenCallback | None,
        cancel: Cancel | None,
    ) -> None:
        """Sample up to max_new_tokens tokens for every row of `state`, one step at a time,
        recording them (and where each row stopped) in `state`."""
        device = self.device
        max_new = params.max_new_tokens
        check_eos = bool(self.eos_ids) and not params.ignore_eos
        eos = torch.tensor(self.eos_ids, device=device)
        stops = _StopChecker(self.tokenizer, params.stop) if params.stop else None
        ends = check_eos or stops is not None
        # Output row -> (prompt index, sample index), for `on_token`.
        owners = [(unit.prompt, unit.first + offset) for unit in units for offset in range(unit.count)]
        # Reading a value back from an accelerator waits for its queue to drain, so there the
        # loop looks at how many rows are done (to stop early or compact the batch) every few
        # steps only; rows that ended meanwhile sample on, and what they sample is cut off (`kept`).
        # Stop strings and `on_token` need the tokens on the host every step anyway.
        look_every = 1 if device.type == "cpu" or stops is not None or on_token is not None else SYNC_EVERY

        for step in range(max_new):
            if cancel is not None and cancel.is_set():
                rows = len(state.kept)
                raise PreemptedError(f"generation stopped at decode step {step} of a batch of {rows} rows")
            token, logprob = sample(state.logits, params, generator)
            state.tokens[state.live, step] = token
            state.logprobs[state.live, step] = logprob
            if on_token is not None:
                # Rows already finished stay in the batch until it is compacted: skip them.
                for out_row, token_id in zip(state.live[state.alive].tolist(), token[state.alive].tolist()):
                    on_token(*owners[out_row], token_id)
            if ends:
                _mark_finished(state, token, step, eos if check_eos else None, stops)
            if step + 1 == max_new:
                break
            if (step + 1) % look_every == 0 and ends:
                dead = int((~state.alive).sum())
                if dead == len(state.alive):
                    break
                # Dropping rows copies the cache, so wait until enough of the batch is finished.
                if dead and dead * 8 >= len(state.alive):
                    token = state.compact(token)
            mask = state.attention[:, : state.width + step + 1] if state.padded else None
            state.logits = self._forward(token[:, None], mask, state.next_position[:, None], state.cache)
            state.next_position = state.next_position + 1

    def _completions(
        self,
        units: list[_Unit],
        prompts: list[list[int]],
        tokens: Tensor,
        logprobs: Tensor,
        generated: list[int],
        reasons: list[FinishReason],
        params: SamplingParams,
        version: int,
    ) -> list[list[Completion]]:
        token_lists = [row[:count] for row, count in zip(tokens.tolist(), generated)]
        logprob_lists = [row[:count] for row, count in zip(logprobs.tolist(), generated)]
        texts = self.tokenizer.batch_decode(token_lists, skip_special_tokens=True)
        if params.stop:
            texts = [cut_at_stop(text, params.stop) for text in texts]
        out: list[list[Completion]] = []
        row = 0
        for unit in units:
            group = []
            for _ in range(unit.count):
                group.append(
                    Completion(
                        prompt_ids=list(prompts[unit.prompt]),
                        token_ids=token_lists[row],
                        logprobs=logprob_lists[row],
                        text=texts[row],
                        finish_reason=reasons[row],
                        weight_version=version,
                    )
                )
                row += 1
            out.append(group)
        return out


# -------------------------------------------------------------------- sampling


class _StopChecker:
    """Finds rows whose completion now contains a stop string, decoding only a recent window."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        # A token holds at least one byte, so this many tokens cover any stop string plus a token
        # split at the window's edge.
        self.window = max(len(s.encode("utf-8")) for s in stop) + 2

    def check(self, tokens: Tensor, live: Tensor, candidates: Tensor, step: int) -> list[int]:
        """Batch rows (of `candidates`) whose last `window` tokens decode to text with a stop string."""
        batch_rows = candidates.nonzero().flatten().tolist()
        if not batch_rows:
            return []
        start = max(0, step + 1 - self.window)
        out_rows = live[batch_rows].tolist()
        windows = tokens[out_rows, start : step + 1].tolist()
        texts = self.tokenizer.batch_decode(windows, skip_special_tokens=True)
        hits = [row for row, text in zip(batch_rows, texts) if any(s in text for s in self.stop)]
        if not hits or start == 0:
            return hits
        # A window can mis-decode a multi-byte character at its left edge; confirm on the full text.
        confirmed = []
        for row in hits:
            full = self.tokenizer.decode(tokens[int(live[row]), : step + 1].tolist(), skip_special_tokens=True)
            if any(s in full for s in self.stop):
                confirmed.append(row)
        return confirmed
