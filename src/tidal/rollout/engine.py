"""The embedded rollout engine: continuous batching over paged KV on the policy's own PyTorch model.

`EmbeddedEngine` keeps keys and values in a pool of fixed-size blocks (rollout/blocks.py) with a
prefix cache of full blocks, schedules sequences step by step (rollout/scheduler.py: requests
join at any step and leave when they finish, long prompts are prefilled in chunks between decode
steps, sequences are preempted and recomputed when blocks run out), and runs each step as one
packed forward (rollout/paged.py). Every request has its own `SamplingParams`; a seeded one
returns the same completions whatever else is in the batch (rollout/sampling.py).

Two ways in: `generate(prompts, n, params)` (the `RolloutEngine` protocol: all prompts with one
params, run to completion on the caller's thread) and `submit(request)` + `step()` (one step of
everything submitted; the batcher drives it, adding requests between steps). docs/design/rollout.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tidal.errors import PreemptedError
from tidal.rollout.blocks import BlockPool, PoolStats
from tidal.rollout.checksum import state_checksum
from tidal.rollout.cuda_graphs import StaticDecode, decode_forward, graphs_available
from tidal.rollout.modules import ModuleDecoder, pick_forward
from tidal.rollout.paged import (
    DecodeView,
    PagedDecoder,
    StepInput,
    matmul_rate,
)
from tidal.rollout.protocol import UNLOADED
from tidal.rollout.sampling import (
    Cancel,
    SamplingParams,
    TokenCallback,
    cut_at_stop,
    derived_seed,
    eos_ids,
)
from tidal.rollout.scheduler import KVPoolTooSmall, Request, RequestHandle, Scheduler
from tidal.rollout.speculative_batch import (
    BatchSpeculation,
    Speculation,
    SpeculativeStats,
)
from tidal.types import Completion

if TYPE_CHECKING:
    from tidal.config.schema import RolloutConfig

__all__ = ["ACCELERATOR_BATCH_ROWS", "CPU_BATCH_ROWS", "Cancel", "EmbeddedEngine", "KVPoolTooSmall", "Request",
           "RequestHandle", "SamplingParams", "TokenCallback"]

logger = logging.getLogger(__name__)

CPU_BATCH_ROWS = 256  # default `max_batch_rows` on a CPU
ACCELERATOR_BATCH_ROWS = 4096  # and on an accelerator
KV_BLOCK_SIZE = 16
PREFILL_CHUNK = 512
KV_MEMORY_FRACTION = 0.25  # of the memory free at start, for the block pool when kv_blocks is not given
MAX_AUTO_BLOCKS = 1 << 16
# "model": compute in the model's own dtype; "auto": bfloat16 where a matmul of the decode shape
# runs at least AUTO_BF16_GAIN times faster in it than in the model's dtype on this device.
DTYPES = ("model", "float32", "bfloat16", "auto")
GRAPH_MODES = ("auto", "off", "eager")
FORWARDS = ("auto", "llama", "generic")
INFLIGHT_KV = ("keep", "recompute")  # what running sequences do with their KV at a weight update
AUTO_BF16_GAIN = 1.3


class EmbeddedEngine:
    """Samples completions from a causal LM in this process.

    `model` may be the very object the trainer updates (then call `update_weights(None, version)`
    after each step) or a separate copy (pass the new weights to `update_weights`). It must already
    be on `device`. `max_batch_rows`: sequences decoding at once (256 on a CPU, 4096 on an
    accelerator, where a step of 4096 rows costs about what one of 256 does: bench/RESULTS.md).
    `kv_block_size` positions per KV block; `kv_blocks` blocks in the pool (None: a quarter of the
    free memory, at most 65536); `prefill_chunk`: prompt tokens prefilled per step at most;
    `prefix_cache`: keep and reuse full blocks across requests; `decode_attention`: "view" (a
    contiguous copy of the decoding rows' blocks, kept in place) or "gather" (the blocks gathered
    at every step), see rollout/paged.py; `dtype`: "model" (its own), "float32", "bfloat16" or
    "auto" (bfloat16 where it measures faster here; the sampler's logprobs are then bf16's, and
    the trainer takes them as the behaviour policy's as they are); `speculative`: rows draft tokens
    by prompt lookup and verify them in the batch's forward (rollout/speculative_batch.py; the
    samples keep the target distribution, `speculative_stats` counts drafts); `cuda_graphs`: "auto"
    (decode-only steps replayed from CUDA graphs where CUDA is there, rollout/cuda_graphs.py),
    "off", or "eager" (the graphs' padded computation run op by op: the CPU tests' way in);
    `forward`: "llama" (the hand-written Llama-family forward, rollout/paged.py), "generic" (the
    model's own modules over the paged KV, rollout/modules.py) or "auto" (`pick_forward`).
    `inflight_kv`: what sequences running across a weight update do with their KV, "keep" or
    "recompute" (`update_weights`).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        device: torch.device | str | None = None,
        max_batch_rows: int | None = None,
        kv_block_size: int = KV_BLOCK_SIZE,
        kv_blocks: int | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
        prefix_cache: bool = True,
        decode_attention: str = "view",
        dtype: str = "model",
        speculative: Speculation | None = None,
        cuda_graphs: str = "auto",
        forward: str = "auto",
        inflight_kv: str = "keep",
    ) -> None:
        problems = []
        if max_batch_rows is not None and max_batch_rows < 1:
            problems.append(f"max_batch_rows={max_batch_rows} must be >= 1")
        if kv_block_size < 1:
            problems.append(f"kv_block_size={kv_block_size} must be >= 1")
        if kv_blocks is not None and kv_blocks < 1:
            problems.append(f"kv_blocks={kv_blocks} must be >= 1")
        if prefill_chunk < 1:
            problems.append(f"prefill_chunk={prefill_chunk} must be >= 1")
        if dtype not in DTYPES:
            problems.append(f"dtype={dtype!r} must be one of {', '.join(DTYPES)}")
        if cuda_graphs not in GRAPH_MODES:
            problems.append(f"cuda_graphs={cuda_graphs!r} must be one of {', '.join(GRAPH_MODES)}")
        if forward not in FORWARDS:
            problems.append(f"forward={forward!r} must be one of {', '.join(FORWARDS)}")
        if inflight_kv not in INFLIGHT_KV:
            problems.append(f"inflight_kv={inflight_kv!r} must be one of {', '.join(INFLIGHT_KV)}")
        if decode_attention not in ("view", "gather"):
            problems.append(f"decode_attention={decode_attention!r} must be 'view' or 'gather'")
        if problems:
            raise ValueError("EmbeddedEngine: " + "; ".join(problems))
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
        # What an engine on a copy of this model is built with (the pipeline's backends).
        self.options = {"kv_block_size": kv_block_size, "kv_blocks": kv_blocks, "prefill_chunk": prefill_chunk,
                        "prefix_cache": prefix_cache, "decode_attention": decode_attention, "dtype": dtype,
                        "speculative": speculative, "cuda_graphs": cuda_graphs, "forward": forward,
                        "inflight_kv": inflight_kv}
        self.inflight_kv = inflight_kv
        # Called under the lock before each step of `run` (the pipeline's rollout worker loads a
        # newer publication there: an in-flight weight update); None: nothing between steps.
        self.between_steps: Callable[[], None] | None = None
        self._version = 0
        self.eos_ids = eos_ids(model, tokenizer)
        self.forward_path = pick_forward(model, forward)
        self.dtype = _pick_dtype(model, dtype) if self.forward_path == "llama" else model_dtype(model, dtype)
        self._forward_pass = self._new_forward()
        logger.info("rollout engine: %s forward for %s (%s)", self.forward_path, type(model).__name__, self.dtype)
        dtype = self.dtype
        layers, kv_heads, head_dim = self._forward_pass.num_layers, self._forward_pass.kv_heads, self._forward_pass.head_dim
        if kv_blocks is None:
            kv_blocks = _auto_blocks(model_device, layers * kv_block_size * kv_heads * head_dim * 2 * dtype.itemsize)
        self.pool = BlockPool(layers, kv_blocks, kv_block_size, kv_heads, head_dim, dtype, model_device, prefix_cache)
        view = DecodeView(layers, kv_heads, head_dim, dtype, model_device) if decode_attention == "view" else None
        shared = torch.Generator(device=model_device)
        shared.seed()
        self._speculation = None if speculative is None else BatchSpeculation(speculative)
        self._scheduler = Scheduler(self.pool, view, max_batch_rows, prefill_chunk, self.eos_ids, tokenizer, shared,
                                    self._speculation)
        self._graphs = cuda_graphs
        self._static: StaticDecode | None = None
        self._build_static()
        self._lock = threading.RLock()  # one driver at a time: generate() and the batcher's step()

    @classmethod
    def from_config(cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, device: torch.device | str | None,
                    rollout: RolloutConfig, max_batch_rows: int | None = None) -> EmbeddedEngine:
        """The engine `rollout` (the config's `rollout` section) describes."""
        return cls(model, tokenizer, device, max_batch_rows, kv_block_size=rollout.kv_block_size,
                   kv_blocks=rollout.kv_blocks, prefill_chunk=rollout.prefill_chunk, prefix_cache=rollout.prefix_cache,
                   dtype=rollout.engine_dtype, speculative=_speculation(rollout),
                   cuda_graphs=getattr(rollout, "cuda_graphs", "auto"), forward=getattr(rollout, "forward", "auto"),
                   inflight_kv=getattr(rollout, "inflight_kv", "keep"))

    @property
    def weight_version(self) -> int:
        """The version of the weights sampled from now; setting it empties the prefix cache."""
        return self._version

    @weight_version.setter
    def weight_version(self, version: int) -> None:
        with self._lock:
            self._version = version
            self._scheduler.version = version
            self.pool.clear_cache()

    @property
    def stats(self) -> PoolStats:
        """Prompt tokens, cached/forked/recomputed tokens, preemptions and hit rates since the start."""
        return self.pool.stats

    @property
    def speculative_stats(self) -> SpeculativeStats | None:
        """Drafted, accepted and emitted tokens and verify rounds since the start (None: no speculation)."""
        return None if self._speculation is None else self._speculation.stats

    def run_metrics(self) -> dict[str, float]:
        """The prefix-cache and preemption counts as `engine/...` columns of the run's metrics rows,
        and with speculative decoding its `spec/...` counts."""
        stats = self.pool.stats
        metrics = {
            "engine/prompt_tokens": stats.prompt_tokens,
            "engine/prefix_hit_rate": stats.prefix_hit_rate,
            "engine/reuse_rate": stats.hit_rate,
            "engine/recomputed_tokens": stats.recomputed_tokens,
            "engine/preemptions": stats.preemptions,
        }
        if self._speculation is not None:
            spec = self._speculation.stats
            metrics.update({"spec/drafted": spec.drafted, "spec/accepted": spec.accepted,
                            "spec/acceptance_rate": spec.acceptance_rate, "spec/tokens_per_pass": spec.tokens_per_pass})
        return metrics

    # ---------------------------------------------------------------- weights

    def update_weights(self, state_dict: dict[str, Tensor] | None, version: int) -> None:
        """Copy `state_dict` (all or some of the model's tensors) into the model, then set `version`.

        `None` means the model object is shared with the trainer and already holds the new
        weights: only the version changes. Either way the prefix cache is emptied: KV computed with
        the old weights is wrong for the new ones. Sequences still running (an in-flight update,
        between two steps) sample their next tokens with the new weights, each token tagged with
        the version it was sampled under (`Completion.token_versions`); with `inflight_kv="keep"`
        they attend to the KV they have (computed partly under the old weights, as PipelineRL
        does), with "recompute" they give it back and are prefilled again from their tokens.
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
        with self._lock:
            self.weight_version = version
            if self._forward_pass.dtype != self.model.get_input_embeddings().weight.dtype:
                self._forward_pass = self._new_forward()  # its cast copies, anew
            if self.inflight_kv == "recompute":
                with torch.inference_mode():  # the decode view's rows move as the sequences leave
                    self._scheduler.recompute_running()

    def load_verified(self, state_dict: dict[str, Tensor], version: int, checksum: str) -> str:
        """`update_weights` of a checksummed publication: the version is UNLOADED (generation
        refused by the callers that check it) while the tensors are copied, then `version` only
        when the checksum of what the model now holds is `checksum`. Returns that checksum; on a
        mismatch the version stays UNLOADED. The one load path of the pipeline and the server."""
        with self._lock:
            self.weight_version = UNLOADED
            self.update_weights(state_dict, version=UNLOADED)
            own = self.model.state_dict()
            loaded = state_checksum({name: own[name] for name in state_dict})
            if loaded == checksum:
                self.weight_version = version
            return loaded

    # ---------------------------------------------------------------- whole calls

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        n: int = 1,
        params: SamplingParams | None = None,
        on_token: TokenCallback | None = None,
        cancel: Cancel | None = None,
        resume: list[RequestHandle] | None = None,
    ) -> list[list[Completion]]:
        """`n` completions for each prompt (token ids, e.g. from `render_prompt`).

        Returns one list per prompt, in order, each holding its `n` completions, each tagged with the
        weight version of its first token (the one current when the call started, unless weights
        were updated between its steps: then `token_versions` holds every token's). With
        `params.seed` set, prompt i's sample k draws from the seed
        `derived_seed(derived_seed(seed, i), k)`, so the same prompts, params
        and weights give the same completions, whatever the batch and `max_batch_rows`. `on_token`
        sees every kept token as it is sampled. `cancel` is looked at before each step: once it is
        set the call stops there and raises `PreemptedError`, whose `handles` hold what it did:
        finished requests, and unfinished ones with their tokens so far and no KV. Passed back as
        `resume` (with the same prompts) they finish the call from where it stopped (`resume`).
        """
        params = params or SamplingParams()
        if n < 1:
            raise ValueError(f"n={n} must be >= 1")
        requests = []
        for index, prompt in enumerate(prompts):
            seeded = params if params.seed is None else replace(params, seed=derived_seed(params.seed, index))
            callback = None if on_token is None else _bind(on_token, index)
            requests.append(Request(list(prompt), seeded, n, callback))
        if resume is None:
            return [self.complete(handle) for handle in self.run(requests, cancel)]
        if [handle.request.prompt for handle in resume] != [list(prompt) for prompt in prompts]:
            raise ValueError("generate(resume=...): the handles are of other prompts than the ones given; pass "
                             "the PreemptedError.handles of a call with the same prompts")
        return [self.complete(handle) for handle in self.resume(resume, cancel)]

    def run(self, requests: list[Request], cancel: Cancel | None = None) -> list[RequestHandle]:
        """Submit `requests` and step until they are done (requests of other callers submitted
        meanwhile ride along); their handles, in order."""
        with self._lock:
            return self._drive([self.submit(request) for request in requests], cancel)

    def resume(self, handles: list[RequestHandle], cancel: Cancel | None = None) -> list[RequestHandle]:
        """Step the handles a preempted call left (`PreemptedError.handles`) until they are done:
        the finished ones as they are, the others from where they stopped (each sequence
        prefilled again from its prompt and the tokens it had, then sampling on with its own
        generator, so with the same weights it ends as if never stopped); `handles`, in order."""
        if any(handle.aborted or (not handle.done and not handle.live) for handle in handles):
            raise ValueError("resume: a handle was aborted (its call failed, or was cancelled for good); "
                             "generate its prompts afresh")
        with self._lock:
            for handle in handles:
                self._scheduler.requeue(handle)
            return self._drive(handles, cancel)

    def _drive(self, handles: list[RequestHandle], cancel: Cancel | None) -> list[RequestHandle]:
        """Step until `handles` are done; on `cancel`, suspend them and raise `PreemptedError`."""
        with self._lock:
            step = 0
            was_training = self.model.training
            self.model.eval()  # once for the call, not at every step
            try:
                while not all(handle.done for handle in handles):
                    if cancel is not None and cancel.is_set():
                        rows = sum(handle.request.n for handle in handles)
                        for handle in handles:
                            self._scheduler.suspend(handle)
                        error = PreemptedError(f"generation stopped at decode step {step} of a batch of {rows} rows")
                        error.handles = handles  # what it did, for `resume`
                        raise error
                    if self.between_steps is not None:
                        self.between_steps()
                    self.step()
                    step += 1
            except PreemptedError:
                raise  # suspended above: no blocks held, tokens kept
            except BaseException:
                for handle in handles:
                    self.abort(handle)
                raise
            finally:
                self.model.train(was_training)
        return handles

    # ---------------------------------------------------------------- step by step

    def submit(self, request: Request) -> RequestHandle:
        """Queue `request`; it joins the batch at the next `step` with room for it."""
        if not request.prompt:
            raise ValueError("a prompt is empty; a prompt needs at least one token")
        if request.n < 1:
            raise ValueError(f"n={request.n} must be >= 1")
        with self._lock:
            return self._scheduler.submit(request, self.weight_version, self.max_batch_rows)

    def abort(self, handle: RequestHandle) -> None:
        """Stop `handle`'s request now, freeing its blocks; it returns nothing."""
        with self._lock:
            self._scheduler.abort(handle)

    def busy(self) -> bool:
        """Whether any submitted request is unfinished."""
        return self._scheduler.busy()

    @torch.inference_mode()
    def step(self) -> list[RequestHandle]:
        """One engine step of every submitted request; the handles that finished in it."""
        with self._lock:
            if not self._forward_pass.current():  # an adapter was injected since: read the new modules
                self._forward_pass = self._new_forward()
            if not self.model.training:
                return self._scheduler.step(self._forward)
            self.model.eval()  # no dropout while sampling; the trainer's mode is restored below
            try:
                return self._scheduler.step(self._forward)
            finally:
                self.model.train(True)

    def complete(self, handle: RequestHandle) -> list[Completion]:
        """The `n` completions of a finished request, in sample order."""
        request = handle.request
        stop = request.params.stop
        out = []
        for sample in range(request.n):
            tokens, logprobs, reason = handle.results[sample]
            versions = handle.versions[sample]
            oldest = min(versions, default=handle.version)  # the submission's, unless updated before its first token
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            out.append(Completion(
                prompt_ids=list(request.prompt), token_ids=list(tokens), logprobs=list(logprobs),
                text=cut_at_stop(text, stop) if stop else text, finish_reason=reason, weight_version=oldest,
                # None: every token sampled under `weight_version` (no update came while it ran)
                token_versions=None if all(v == oldest for v in versions) else list(versions),
            ))
        return out

    def _new_forward(self) -> PagedDecoder | ModuleDecoder:
        if self.forward_path == "llama":
            return PagedDecoder(self.model, self.dtype)
        return ModuleDecoder(self.model, self.dtype)

    def _forward(self, step: StepInput) -> Tensor:
        if self._static is not None and self._static.decoder is not self._forward_pass:  # the forward was rebuilt
            self._build_static()
        return decode_forward(self._static, self._dynamic)(step)

    def _dynamic(self, step: StepInput) -> Tensor:
        return self._forward_pass.forward(step, self.pool, self._scheduler.view)

    def _build_static(self) -> None:
        """The decode-graph path for the current forward, where `cuda_graphs` and the device allow."""
        view = self._scheduler.view
        if self._static is not None:
            self.pool.release([self._static.scratch_block])
            self._static = None
        wanted = self._graphs == "eager" or (self._graphs == "auto" and graphs_available(self.device))
        if wanted and view is not None and isinstance(self._forward_pass, PagedDecoder):
            self._static = StaticDecode(self._forward_pass, self.pool, view, graphs=self._graphs == "auto")

    @property
    def graph_replays(self) -> int:
        """Decode steps served by the static path (CUDA graph replays, or its eager runs)."""
        return 0 if self._static is None else self._static.replays


def _speculation(rollout: RolloutConfig) -> Speculation | None:
    """`rollout.speculative` as the engine's options (None: plain decoding)."""
    spec = getattr(rollout, "speculative", None)
    if spec is None:
        return None
    return Speculation(method=spec.method, k=spec.k, max_n=spec.max_n, min_n=spec.min_n, min_match=spec.min_match,
                       learn=spec.learn)


def _bind(on_token: TokenCallback, prompt: int) -> Callable[[int, int], None]:
    return lambda sample, token: on_token(prompt, sample, token)


def model_dtype(model: torch.nn.Module, choice: str) -> torch.dtype:
    """The generic forward's compute dtype: the model's own ("model", "auto" or that dtype's name)."""
    own = model.get_input_embeddings().weight.dtype
    if choice in ("model", "auto") or getattr(torch, choice) == own:
        return own
    raise ValueError(f"dtype={choice!r}: the generic forward computes in the model's own dtype ({own}); "
                     "cast the model, or use dtype 'model'")


def _pick_dtype(model: PreTrainedModel, choice: str) -> torch.dtype:
    """The compute dtype `choice` names for `model` (DTYPES)."""
    own = model.get_input_embeddings().weight.dtype
    if choice == "model":
        return own
    if choice != "auto":
        return getattr(torch, choice)
    if own == torch.bfloat16 or not PagedDecoder.supports(model, plain_projections=True):  # LoRA layers compute in the model's dtype
        return own
    config, device = model.config, model.get_input_embeddings().weight.device
    shape = (64, int(config.hidden_size), int(config.intermediate_size))
    return torch.bfloat16 if matmul_rate(torch.bfloat16, device, *shape) >= AUTO_BF16_GAIN * matmul_rate(own, device, *shape) else own


def _auto_blocks(device: torch.device, block_bytes: int) -> int:
    """Blocks that fit in KV_MEMORY_FRACTION of the memory free now, at most MAX_AUTO_BLOCKS."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        free = 8 << 30
        try:
            with open("/proc/meminfo") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        free = int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return max(1, min(MAX_AUTO_BLOCKS, int(free * KV_MEMORY_FRACTION) // block_bytes))
